"""Eager PyTorch RMSNorm, written as users write it (Llama's reference): a chain of kernels, each
a round trip to memory, each op rounding to the storage dtype."""

from __future__ import annotations

import torch

from impls import Backend, RMSNormFn


def rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x


def _build() -> RMSNormFn:
    return rmsnorm_eager


BACKEND = Backend(
    name="eager",
    label="PyTorch eager",
    build=_build,
    numerics="storage_dtype_chain",
    own_backward=False,
)
