"""Registry entry for our fused Triton RMSNorm."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn


def _unavailable() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton does not import ({exc}); pip install triton"
    from .launch import interpreting

    if not torch.cuda.is_available() and not interpreting():
        return "no CUDA device, and TRITON_INTERPRET=1 was not set before triton was imported"
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    from .function import SUPPORTED_DTYPES
    from .launch import MAX_N, interpreting

    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype} (fp16, bf16 and fp32 only)"
    if shape[-1] > MAX_N:
        return f"N={shape[-1]} > {MAX_N}: column indices are int32"
    if device != "cuda" and not interpreting():
        return "CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)"
    return None


def _build() -> RMSNormFn:
    from .function import rmsnorm

    return rmsnorm


def _build_add() -> AddRMSNormFn:
    from .function import rmsnorm

    def triton_add_rmsnorm(x, residual, weight, eps):
        return rmsnorm(x, weight, eps, residual=residual)

    return triton_add_rmsnorm


def _launch_configs() -> dict:
    from .launch import take_launch_configs

    return take_launch_configs()


def _numerics() -> str:
    # Read when the registry loads, after the tests and harness.compare have set TRITON_INTERPRET.
    from .launch import interpreting

    return "fused_fp32_interpreted" if interpreting() else "fused_fp32"


BACKENDS = (
    Backend(
        name="triton",
        label="Triton fused (ours)",
        build=_build,
        numerics=_numerics(),
        own_backward=True,
        unavailable=_unavailable,
        unsupported=_unsupported,
        role="ours",
        launch_configs=_launch_configs,
    ),
    Backend(
        name="triton-add",
        label="Triton fused add + RMSNorm (ours)",
        build=_build_add,
        numerics=_numerics(),
        own_backward=True,
        op="add_rmsnorm",
        unavailable=_unavailable,
        unsupported=_unsupported,
        role="ours",
        launch_configs=_launch_configs,
    ),
)
