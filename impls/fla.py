"""flash-linear-attention's Triton RMSNorm (pip install fla-core), as Hugging Face's Qwen3.5 and
vLLM's gated norm call it.

``fla.modules.layernorm.rms_norm(x, weight, bias, residual=None, eps, prenorm, residual_in_fp32)``
(read from fla-core 0.6.0, ``fla/modules/norm/layernorm.py``; ``fla.modules.layernorm`` is its
alias): statistics and y in fp32, rounded once. With a residual it adds x + r in fp32, stores
that sum rounded to the residual's dtype (returned with prenorm=True) and normalizes the
unrounded sum, so ``add_normalizes="exact_sum"``. Its ``input_guard`` makes every input
contiguous: a strided input is copied inside the call. It refuses rows of 64 KB or more
(N * element size >= 65536).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn

_MAX_ROW_BYTES = 65536


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (fla's Triton kernels are launched on CUDA here)"
    try:
        from fla.modules.layernorm import rms_norm  # noqa: F401
    except Exception as exc:
        return f"fla-core does not import ({type(exc).__name__}: {exc}); pip install fla-core"
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    es = torch.empty((), dtype=dtype).element_size()
    if shape[-1] * es > _MAX_ROW_BYTES:
        return f"N={shape[-1]}: fla holds one row of at most 64 KB in one Triton block"
    return None


def _build() -> RMSNormFn:
    from fla.modules.layernorm import rms_norm

    def fla_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, None, eps=eps)

    return fla_rmsnorm


def _build_add() -> AddRMSNormFn:
    from fla.modules.layernorm import rms_norm

    def fla_add_rmsnorm(x, residual, weight, eps):
        return rms_norm(x, weight, None, residual=residual, eps=eps, prenorm=True)

    return fla_add_rmsnorm


BACKENDS = (
    Backend(
        name="fla",
        label="fla (flash-linear-attention) rms_norm",
        build=_build,
        numerics="fused_fp32",
        own_backward=True,
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
    Backend(
        name="fla-add",
        label="fla rms_norm with residual (prenorm; normalizes the unrounded x + r)",
        build=_build_add,
        numerics="fused_fp32",
        own_backward=True,
        op="add_rmsnorm",
        add_normalizes="exact_sum",
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
)
