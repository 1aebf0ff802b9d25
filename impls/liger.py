"""Liger-Kernel's Triton RMSNorm (pip install liger-kernel), as Llama models use it.

Called as LigerRMSNormFunction(X, W, eps, offset=0, casting_mode="llama", in_place=False):
statistics in fp32, x * rstd rounded to the input dtype, then multiplied by the weight (two
roundings). in_place=False because Liger's default writes dx into dy's buffer. Liger refuses rows
wider than 65536 elements.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn

_MAX_N = 65536


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (Liger's launchers query the GPU)"
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction  # noqa: F401
    except Exception as exc:
        return (
            f"liger-kernel does not import ({type(exc).__name__}: {exc}); pip install liger-kernel"
        )
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    if shape[-1] > _MAX_N:
        return f"N={shape[-1]} > {_MAX_N}: Liger holds one row in one Triton block"
    return None


def _build() -> RMSNormFn:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def liger_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)

    return liger_rmsnorm


def _build_add() -> AddRMSNormFn:
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    def liger_add_rmsnorm(x, residual, weight, eps):
        return LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)

    return liger_add_rmsnorm


BACKENDS = (
    Backend(
        name="liger",
        label="Liger-Kernel (llama mode)",
        build=_build,
        numerics="two_roundings",
        own_backward=True,
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
    Backend(
        name="liger-add",
        label="Liger-Kernel fused_add_rms_norm",
        build=_build_add,
        numerics="two_roundings",
        own_backward=True,
        op="add_rmsnorm",
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
)
