"""Eager PyTorch RMSNorm, the seed's code: a chain of kernels, each a round trip to memory, each
op rounding to the storage dtype. (Hugging Face's LlamaRMSNorm upcasts to fp32 first: that is the
`eager-fp32` backend.)"""

from __future__ import annotations

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn


def rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x


def add_rmsnorm_eager(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = x + residual
    return rmsnorm_eager(hidden, weight, eps), hidden


def _build() -> RMSNormFn:
    return rmsnorm_eager


def _build_add() -> AddRMSNormFn:
    return add_rmsnorm_eager


BACKENDS = (
    Backend(
        name="eager",
        label="PyTorch eager",
        build=_build,
        numerics="storage_dtype_chain",
        own_backward=False,
        role="baseline",
    ),
    Backend(
        name="eager-add",
        label="PyTorch eager add + RMSNorm",
        build=_build_add,
        numerics="storage_dtype_chain",
        own_backward=False,
        op="add_rmsnorm",
        role="baseline",
    ),
)
