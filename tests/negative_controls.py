"""Deliberately wrong RMSNorms that the oracle checks must reject.

If any of these ever passes check_backend, the checks have gone blind. Each claims the strictest
numerics class (fused_fp32), as a cheating kernel would.
"""

from __future__ import annotations

import torch

from impls import Backend


def forgets_eps(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True)) * weight.float()).to(x.dtype)


def sums_squares_in_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Accumulates the sum of squares in bf16, element by element, as a careless kernel would."""
    sq = x.to(torch.bfloat16).square()
    acc = torch.zeros(sq.shape[:-1], dtype=torch.bfloat16, device=x.device)
    for j in range(sq.shape[-1]):
        acc = acc + sq[..., j]
    mean = acc.float().unsqueeze(-1) / x.shape[-1]
    return (x.float() * torch.rsqrt(mean + eps) * weight.float()).to(x.dtype)


def rounds_twice_claims_once(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Rounds x * rstd to storage before the weight multiply, yet claims one rounding."""
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return x_hat * weight


def _control(name: str, fn) -> Backend:
    return Backend(name=name, label=name, build=lambda: fn, numerics="fused_fp32",
                   own_backward=False)  # fmt: skip


FORGETS_EPS = _control("wrong-forgets-eps", forgets_eps)
SUMS_SQUARES_IN_BF16 = _control("wrong-bf16-sum-of-squares", sums_squares_in_bf16)
ROUNDS_TWICE = _control("wrong-rounds-twice", rounds_twice_claims_once)
