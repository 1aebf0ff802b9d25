"""FlashInfer's RMSNorm + fp8 quant ops (flashinfer-python 0.7.2.post1), forward only:
- rmsnorm_quant / fused_add_rmsnorm_quant: a static per-tensor scale, q = sat(y * (1 / s)) from
  the fp32 y (norm.cuh; the residual updated in place: h);
- fused_add_rmsnorm_fp8_block_quant: 1 x 128 blocks, with a residual only, e4m3fn only, N a
  multiple of 128 (of 256 up to 8192, of 512 up to 16384); quantizes the bf16-rounded y
  (numerics bf16_y), amax floored at 1e-4, writes that bf16 y too, and the scales column-major,
  TMA-aligned ([G, align(M, 4)] transposed), as ours by default.
The per-tensor ops compute y in fp32 and multiply by 1 / s: the fused_fp32 class."""

from __future__ import annotations

import torch

from impls import Backend
from impls.fp8_common import Fp8Unsupported


def _unavailable() -> str | None:
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA-less build that fails at import
        return f"flashinfer does not import ({type(exc).__name__}); pip install flashinfer-python"
    if not torch.cuda.is_available():
        return "FlashInfer runs on CUDA only"
    return None


def _build_static():
    import flashinfer

    def flashinfer_rmsnorm_quant(x, weight, eps, *, scaling, scale, residual, fp8_dtype):
        if scaling != "per_tensor":
            raise Fp8Unsupported(f"rmsnorm_quant takes a static scale only, not {scaling}")
        q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
        if residual is None:
            flashinfer.rmsnorm_quant(q, x, weight, scale, eps)
            return q, scale, None, None
        flashinfer.fused_add_rmsnorm_quant(q, x, residual, weight, scale, eps)
        return q, scale, residual, None  # residual now holds h = x + r

    return flashinfer_rmsnorm_quant


def _block_unsupported(n: int, residual, fp8_dtype) -> str | None:
    if residual is None:
        return "1x128 block quant exists only fused with the residual add"
    if fp8_dtype != torch.float8_e4m3fn:
        return "1x128 block quant writes e4m3fn only"
    multiple = 256 if n <= 8192 else 512 if n <= 16384 else 128
    if n % multiple:
        return f"N={n} is not a multiple of {multiple}"
    return None


def _build_block():
    import flashinfer

    def flashinfer_block_quant(x, weight, eps, *, scaling, scale, residual, fp8_dtype):
        if scaling != "block":
            raise Fp8Unsupported(f"fused_add_rmsnorm_fp8_block_quant is 1x128 only, not {scaling}")
        m, n = x.shape
        reason = _block_unsupported(n, residual, fp8_dtype)
        if reason:
            raise Fp8Unsupported(reason)
        q = torch.empty((m, n), dtype=fp8_dtype, device=x.device)
        scales = torch.empty((n // 128, -(-m // 4) * 4), dtype=torch.float32, device=x.device)
        normed = torch.empty_like(x)
        flashinfer.fused_add_rmsnorm_fp8_block_quant(q, scales, normed, x, residual, weight, eps)
        return q, scales.transpose(0, 1)[:m], residual, None

    return flashinfer_block_quant


BACKENDS = (
    Backend(
        name="flashinfer-fp8-static",
        label="FlashInfer rmsnorm_quant / fused_add_rmsnorm_quant (static scale)",
        build=_build_static,
        numerics="fused_fp32",
        own_backward=False,
        has_backward=False,
        op="rmsnorm_fp8",
        unavailable=_unavailable,
    ),
    Backend(
        name="flashinfer-fp8-block",
        label="FlashInfer fused_add_rmsnorm_fp8_block_quant (1x128)",
        build=_build_block,
        numerics="bf16_y",
        own_backward=False,
        has_backward=False,
        op="rmsnorm_fp8",
        unavailable=_unavailable,
    ),
)
