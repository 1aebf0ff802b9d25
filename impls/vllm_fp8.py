"""vLLM's fused RMSNorm + fp8 quant kernels, listed and not run: rms_norm_static_fp8_quant,
fused_add_rms_norm_static_fp8_quant, rms_norm_dynamic_per_token_quant and the per-block
(1 x 128) forms live in vLLM's compiled extension (torch.ops._C), built against the one torch
version each vLLM wheel pins; the suite's GPU machine runs its own torch (2.11), so the extension
cannot load beside it, and vLLM is not installed there."""

from __future__ import annotations

from impls import Backend

REASON = (
    "vLLM's fused RMSNorm + fp8 quant ops ship only in its compiled extension (torch.ops._C), "
    "built against the torch its wheel pins, not the suite's; vLLM is not installed"
)


def _build():
    raise RuntimeError(REASON)


BACKEND = Backend(
    name="vllm-fp8",
    label="vLLM rms_norm_*_fp8_quant (not runnable)",
    build=_build,
    numerics="fused_fp32",
    own_backward=False,
    has_backward=False,
    op="rmsnorm_fp8",
    unavailable=lambda: REASON,
)
