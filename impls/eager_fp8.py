"""RMSNorm then fp8 quantization in PyTorch: eager (a chain of kernels, the norm in storage
dtype as impls/eager.py) and torch.compile of that same code (Inductor fuses it). Straight
through: the bf16 y is the dy port, so the backward is autograd of the eager norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from impls import Backend
from impls.compiled import _compiled
from impls.eager import rmsnorm_eager

FLT_MIN = torch.finfo(torch.float32).tiny
GROUP = 128


def quantize(y: torch.Tensor, scaling: str, scale, fp8_dtype: torch.dtype):
    """(q, scales) of y [M, N] by the op's convention: q = sat(y / s), s = amax / max."""
    fmax = torch.finfo(fp8_dtype).max
    y32 = y.float()
    if scaling == "block":  # as DeepGEMM's per_token_cast_to_fp8: padded [M, G, 128] blocks
        m, n = y32.shape
        groups = -(-n // GROUP)
        blocks = F.pad(y32, (0, groups * GROUP - n)).view(m, groups, GROUP)
        s = (blocks.abs().amax(-1) / fmax).clamp(min=FLT_MIN)
        q = (blocks / s.unsqueeze(-1)).clamp(-fmax, fmax).view(m, groups * GROUP)[:, :n]
        return q.to(fp8_dtype), s
    if scaling == "per_tensor":
        s, s_el = scale, scale
    else:
        s = (y32.abs().amax(-1) / fmax).clamp(min=FLT_MIN)
        s_el = s.unsqueeze(-1)
    return (y32 / s_el).clamp(-fmax, fmax).to(fp8_dtype), s


def rmsnorm_fp8_eager(x, weight, eps, *, scaling, scale, residual, fp8_dtype):
    h = None if residual is None else x + residual
    y = rmsnorm_eager(x if h is None else h, weight, eps)
    q, s = quantize(y.detach(), scaling, scale, fp8_dtype)
    return q, s, h, y


def _compiled_build():
    return _compiled(rmsnorm_fp8_eager)()


BACKENDS = (
    Backend(
        name="eager-fp8",
        label="PyTorch eager RMSNorm, then fp8 quant",
        build=lambda: rmsnorm_fp8_eager,
        numerics="bf16_y",
        own_backward=False,
        op="rmsnorm_fp8",
        role="baseline",
    ),
    Backend(
        name="compile-fp8",
        label="torch.compile(eager RMSNorm + fp8 quant)",
        build=_compiled_build,
        numerics="bf16_y",
        own_backward=False,
        op="rmsnorm_fp8",
    ),
)
