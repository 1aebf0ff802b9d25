"""Liger-Kernel's Triton RMSNorm (pip install liger-kernel), as Llama models use it.

Called as LigerRMSNormFunction(X, W, eps, offset=0, casting_mode="llama", in_place=False):
statistics in fp32, x * rstd rounded to the input dtype, then multiplied by the weight (two
roundings). in_place=False because Liger's default writes dx into dy's buffer. Liger refuses rows
wider than 65536 elements.

The ``liger-cutedsl`` rows are Liger's CuTe DSL kernels (``liger_kernel.ops.backends._cutedsl``,
in the same 0.8.5 wheel; Hopper or newer), what ``LIGER_KERNEL_IMPL=cutedsl`` selects. That
variable is read twice in 0.8.5: once when ``liger_kernel.ops`` is imported (it swaps the
package's exported Function classes) and on every call of the ``register_op`` dispatcher
(``liger_kernel.backends.dispatch``). Setting it for one row would change every Liger row of the
process, so these rows call the CuTe DSL autograd Functions directly, the ones the dispatcher
reaches; where the dispatcher would fall back to Triton (N not a multiple of the 16-byte vector,
N > 32768) the rows say unsupported instead of timing Triton under the CuTe DSL name. The
forward multiplies by the weight at the storage dtype after rounding x * rstd (its docstring:
"the final weight multiply happens at output dtype"): two roundings, like the Triton rows; the
residual form normalizes the unrounded fp32 sum (QuACK's forward, which it adapts).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn

_MAX_N = 65536
_MAX_N_CUTEDSL = 32768  # liger_kernel/ops/backends/_cutedsl/rms_norm.py: _BWD_MAX_TILE_CUTEDSL


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


@functools.cache
def _unavailable_cutedsl() -> str | None:
    reason = _unavailable()
    if reason is not None:
        return reason
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return (
            f"Liger's CuTe DSL kernels need compute capability >= 9.0, this GPU is {major}.{minor}"
        )
    try:
        from liger_kernel.ops.backends._cutedsl.rms_norm import (  # noqa: F401
            _LigerRMSNormCuTeDSLFunction,
        )
    except Exception as exc:
        return (
            f"liger_kernel.ops.backends._cutedsl does not import ({type(exc).__name__}: {exc}); "
            "it needs liger-kernel >= 0.8.5 and nvidia-cutlass-dsl"
        )
    return None


def _unsupported_cutedsl(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    vector = 16 // torch.empty((), dtype=dtype).element_size()
    if shape[-1] % vector:
        return (
            f"N={shape[-1]} is not a multiple of {vector}: Liger's dispatcher falls back to Triton"
        )
    if shape[-1] > _MAX_N_CUTEDSL:
        return f"N={shape[-1]} > {_MAX_N_CUTEDSL}: Liger's dispatcher falls back to Triton"
    return None


def _build_cutedsl() -> RMSNormFn:
    from liger_kernel.ops.backends._cutedsl.rms_norm import _LigerRMSNormCuTeDSLFunction

    def liger_cutedsl_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # (X, W, eps, offset, casting_mode, in_place, row_mode)
        return _LigerRMSNormCuTeDSLFunction.apply(x, weight, eps, 0.0, "llama", False, None)

    return liger_cutedsl_rmsnorm


def _build_cutedsl_add() -> AddRMSNormFn:
    from liger_kernel.ops.backends._cutedsl.fused_add_rms_norm import (
        _LigerFusedAddRMSNormCuTeDSLFunction,
    )

    def liger_cutedsl_add_rmsnorm(x, residual, weight, eps):
        return _LigerFusedAddRMSNormCuTeDSLFunction.apply(
            x, residual, weight, eps, 0.0, "llama", False
        )

    return liger_cutedsl_add_rmsnorm


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
    Backend(
        name="liger-cutedsl",
        label="Liger-Kernel CuTe DSL (LIGER_KERNEL_IMPL=cutedsl)",
        build=_build_cutedsl,
        numerics="two_roundings",
        own_backward=True,
        unavailable=_unavailable_cutedsl,
        unsupported=_unsupported_cutedsl,
    ),
    Backend(
        name="liger-cutedsl-add",
        label="Liger-Kernel CuTe DSL fused_add_rms_norm (normalizes the unrounded x + r)",
        build=_build_cutedsl_add,
        numerics="two_roundings",
        own_backward=True,
        op="add_rmsnorm",
        add_normalizes="exact_sum",
        unavailable=_unavailable_cutedsl,
        unsupported=_unsupported_cutedsl,
    ),
)
