"""The differentiable op: input checks, [..., N] <-> [M, N] flattening, autograd wiring."""

from __future__ import annotations

import math

import torch

from . import launch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def validate_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Raise a clear error, naming the argument, for anything the kernels do not support."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if x.dim() == 0:
        raise ValueError("x: expected at least one dimension [..., N], got a 0-d tensor")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x: the last dimension N must be > 0, got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x: dtype {x.dtype} is not supported; expected one of {SUPPORTED_DTYPES}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: dtype {weight.dtype} must match x's dtype {x.dtype}")
    if tuple(weight.shape) != (n,):
        raise ValueError(f"weight: expected shape ({n},) to match x's last dimension, got "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight.device != x.device:
        raise ValueError(
            f"weight: on {weight.device} but x is on {x.device}; put both on one device"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps}")
    launch.check_hidden_size(n)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D [M, N] view of t; copied only when the last dimension is not contiguous."""
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


class RMSNormFunction(torch.autograd.Function):
    """Fused RMSNorm with a fused backward; saves x, weight and one fp32 rstd per row."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2d = _rows(x)
        y2d, rstd = launch.rmsnorm_forward(x2d, weight, float(eps))
        ctx.save_for_backward(x2d, weight, rstd)
        return y2d.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2d, weight, rstd = ctx.saved_tensors
        dx2d, dw = launch.rmsnorm_backward(_rows(dy), x2d, weight, rstd)
        return dx2d.view(dy.shape), dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight.

    x: [..., N] in fp16, bf16 or fp32; weight: [N], same dtype and device. Differentiable in x
    and weight. Statistics in fp32; the output is rounded once to x's dtype.
    """
    validate_inputs(x, weight, eps)
    return RMSNormFunction.apply(x, weight, eps)
