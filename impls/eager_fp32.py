"""Eager PyTorch RMSNorm as Hugging Face's LlamaRMSNorm writes it: upcast to fp32, normalize,
cast back to the input dtype, then multiply by the weight (two roundings, several kernels)."""

from __future__ import annotations

import torch

from impls import Backend, RMSNormFn


def rmsnorm_eager_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def _build() -> RMSNormFn:
    return rmsnorm_eager_fp32


BACKEND = Backend(
    name="eager-fp32",
    label="PyTorch eager, fp32 upcast (HF Llama)",
    build=_build,
    numerics="two_roundings",
    own_backward=False,
)
