"""Registry entry for rmsnorm_fp8 (ours)."""

from __future__ import annotations

from impls import Backend

from .backend import _unavailable, _unsupported


def _build():
    from .fp8 import rmsnorm_fp8

    def triton_rmsnorm_fp8(x, weight, eps, *, scaling, scale, residual, fp8_dtype):
        outs = rmsnorm_fp8(x, weight, eps, residual=residual, scaling=scaling, scale=scale,
                           fp8_dtype=fp8_dtype, grad_port=True)  # fmt: skip
        h = outs[2] if residual is not None else None
        return outs[0], outs[1], h, outs[-1]

    return triton_rmsnorm_fp8


BACKEND = Backend(
    name="triton-fp8",
    label="Triton fused RMSNorm + fp8 quant (ours)",
    build=_build,
    numerics="fused_fp32",
    own_backward=True,
    op="rmsnorm_fp8",
    unavailable=_unavailable,
    unsupported=_unsupported,
    role="ours",
)
