"""Inputs for one case of any layout: contiguous [M, N] rows, or a shapes.HeadView.

A HeadView's x is a strided view into a packed QKV buffer (the other heads hold random values
too, so no backend can lean on zeros there); dy, the gradient of the norm's own output, is a
contiguous [tokens, heads, head_dim] tensor, as autograd hands it over.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.inputs import DEFAULT_EPS, Inputs, make_inputs
from harness.shapes import HeadView


def case_dims(shape) -> tuple[int, ...]:
    """The tensor shape a backend sees: (tokens, heads, head_dim) for a view, else (M, N)."""
    return shape.dims if isinstance(shape, HeadView) else (int(shape[0]), int(shape[1]))


def case_skip_reason(backend, shape, dtype: torch.dtype, device: str | torch.device) -> str | None:
    """Why backend cannot run this case (its own skip_reason for the tensor shape it would see,
    or a layout its op has no form for), or None when it can."""
    reason = backend.skip_reason(case_dims(shape), dtype, device)
    if reason is None and backend.op == "add_rmsnorm" and isinstance(shape, HeadView):
        reason = "unsupported: the qk-norm views have no residual add"
    return reason


def make_case_inputs(
    shape,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    eps: float = DEFAULT_EPS,
    seed: int | None = None,
    with_residual: bool = False,
) -> Inputs:
    """make_inputs for (M, N); for a HeadView, the same values placed in a packed QKV buffer."""
    if not isinstance(shape, HeadView):
        return make_inputs(tuple(shape), dtype, device, eps=eps, seed=seed,
                           with_residual=with_residual)  # fmt: skip
    base = make_inputs(shape.dims, dtype, device, eps=eps, seed=seed)
    gen = torch.Generator().manual_seed((seed or 0) + 7919)
    qkv = torch.randn(shape.tokens, shape.packed_width, generator=gen).to(device, dtype)
    x = qkv[:, : shape.heads * shape.head_dim].view(*shape.dims)
    x.copy_(base.x)
    return dataclasses.replace(base, x=x)


def private_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy with t's strides (for in-place backends): empty_strided keeps a view's layout."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
