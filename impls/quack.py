"""QuACK's CuTe-DSL RMSNorm (pip install quack-kernels; Hopper or newer).

quack.rmsnorm(x, weight, eps=eps): fp32 statistics, one rounding at the store, any N (thread-block
clusters for wide rows). Its backward cannot be captured in a CUDA graph, so the harness times
it host-inclusive only. QuACK's backward refuses N > 128k in fp32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn

_MAX_N_FP32_BACKWARD = 128 * 1024


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"needs compute capability >= 9.0 (Hopper), this GPU is {major}.{minor}"
    try:
        from quack import rmsnorm  # noqa: F401
    except Exception as exc:
        return f"quack-kernels does not import ({type(exc).__name__}: {exc}); pip install quack-kernels"
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    if dtype != torch.float32 and shape[-1] % 2:
        # Seen on the H200 (quack-kernels 0.6.5, N=4095 fp16): vector width gcd(N, 8) = 1
        # element gives 2-byte async copies, which CuTe's cp.async rejects (4, 8 or 16 bytes).
        return f"N={shape[-1]} is odd: QuACK's async copies need >= 4-byte vectors in 16-bit dtypes"
    if dtype == torch.float32 and shape[-1] > _MAX_N_FP32_BACKWARD:
        return f"fp32 with N={shape[-1]} > 131072: QuACK's backward refuses it"
    return None


def _build() -> RMSNormFn:
    from quack import rmsnorm

    def quack_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps=eps)

    return quack_rmsnorm


def _build_add() -> AddRMSNormFn:
    from quack import rmsnorm

    def quack_add_rmsnorm(x, residual, weight, eps):
        return rmsnorm(x, weight, residual=residual, eps=eps, prenorm=True)

    return quack_add_rmsnorm


BACKENDS = (
    Backend(
        name="quack",
        label="QuACK (CuTe DSL)",
        build=_build,
        numerics="fused_fp32",
        own_backward=True,
        graph_capturable_backward=False,
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
    Backend(
        name="quack-add",
        label="QuACK residual + RMSNorm (prenorm; normalizes the unrounded x + r)",
        build=_build_add,
        numerics="fused_fp32",
        own_backward=True,
        op="add_rmsnorm",
        # quack.rmsnorm.rmsnorm_ref: y = RMSNorm(x_f32 + r_f32); h is rounded only for storage.
        add_normalizes="exact_sum",
        graph_capturable_backward=False,
        unavailable=_unavailable,
        unsupported=_unsupported,
    ),
)
