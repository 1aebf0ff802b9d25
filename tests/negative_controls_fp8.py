"""Deliberately wrong fp8 RMSNorms (per token unless named) that the fp8 oracle must reject,
and one right one in plain torch (fp32 norm, fp32 division) that it must accept. Each returns
(q, scales) and claims the strictest numerics class (fused_fp32), as a cheating kernel would."""

from __future__ import annotations

import torch

FLT_MIN = torch.finfo(torch.float32).tiny


def _y32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()


def _saturate(v: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    fmax = torch.finfo(fp8_dtype).max
    return v.clamp(-fmax, fmax).to(fp8_dtype)


def _row_scales(y: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    return (y.abs().amax(-1) / torch.finfo(fp8_dtype).max).clamp(min=FLT_MIN)


def fp32_torch(x, weight, eps, fp8_dtype=torch.float8_e4m3fn):
    """Right: the norm in fp32, s = amax / max, q = sat(y / s) in fp32."""
    y = _y32(x, weight, eps)
    s = _row_scales(y, fp8_dtype)
    return _saturate(y / s[:, None], fp8_dtype), s


def amax_over_wrong_axis(x, weight, eps, fp8_dtype=torch.float8_e4m3fn):
    """Takes the amax over the rows (dim 0, one per column) instead of over each row: row i
    gets column i's amax (square inputs)."""
    y = _y32(x, weight, eps)
    s = (y.abs().amax(0) / torch.finfo(fp8_dtype).max).clamp(min=FLT_MIN)
    return _saturate(y / s[:, None], fp8_dtype), s


def rounds_y_to_bf16(x, weight, eps, fp8_dtype=torch.float8_e4m3fn):
    """Right scales (from the fp32 y), but quantizes y rounded to bf16 first, as an unfused
    norm that stores bf16 y would."""
    y = _y32(x, weight, eps)
    s = _row_scales(y, fp8_dtype)
    return _saturate(y.to(torch.bfloat16).float() / s[:, None], fp8_dtype), s


def forgets_saturation(x, weight, eps, scale, fp8_dtype=torch.float8_e4m3fn):
    """Per tensor, the caller's scale, converted without saturating, as a non-saturating
    conversion does (cvt without .satfinite): past the format's max e5m2 gives +-inf, e4m3fn
    (which has no inf) NaN. torch's own e4m3fn conversion saturates, so it is modelled here."""
    v = _y32(x, weight, eps) / scale
    fmax = torch.finfo(fp8_dtype).max
    q = v.to(fp8_dtype)
    if fp8_dtype == torch.float8_e4m3fn:  # halfway past max (464) rounds out of range
        q = torch.where(v.abs() >= 464.0, torch.full_like(v, torch.nan), v).to(fp8_dtype)
    assert fmax > 0
    return q, scale
