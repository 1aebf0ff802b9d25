"""torch.nn.functional.rms_norm: PyTorch's own op (fused CUDA kernels since 2.9).

PyTorch takes its fused path only when the weight dtype matches the input's; otherwise it falls
back to composite (unfused) ops. This suite calls it with matching dtypes, as a model in one
dtype would. Its CPU (composite) path rounds x * rstd to the input dtype before the weight
multiply, hence the two-roundings bound; the fused CUDA kernel rounds once, well inside it.
"""

from __future__ import annotations

import torch

from impls import Backend, RMSNormFn


def _unavailable() -> str | None:
    if not hasattr(torch.nn.functional, "rms_norm"):
        return f"torch {torch.__version__} has no torch.nn.functional.rms_norm (needs >= 2.4)"
    return None


def _build() -> RMSNormFn:
    def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)

    return torch_rms_norm


BACKEND = Backend(
    name="torch",
    label="torch.nn.functional.rms_norm",
    build=_build,
    numerics="two_roundings",
    own_backward=True,
    unavailable=_unavailable,
)
