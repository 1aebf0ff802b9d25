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
    """Rounds x * rstd to storage before the weight multiply (as Apex and Liger's llama mode
    do), yet claims one rounding: the forward alone must fail fused_fp32's exact bound."""
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return x_hat * weight


def _control(name: str, fn) -> Backend:
    return Backend(name=name, label=name, build=lambda: fn, numerics="fused_fp32",
                   own_backward=False)  # fmt: skip


FORGETS_EPS = _control("wrong-forgets-eps", forgets_eps)
SUMS_SQUARES_IN_BF16 = _control("wrong-bf16-sum-of-squares", sums_squares_in_bf16)
ROUNDS_TWICE = Backend(
    name="wrong-rounds-twice", label="", build=lambda: rounds_twice_claims_once,
    numerics="fused_fp32", own_backward=False, has_backward=False,
)  # fmt: skip


def _make_caching():
    """Computes the first call correctly, then returns that output for every call of the shape."""
    cache: dict = {}

    def returns_cached_output(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype)
        if key not in cache:
            xf = x.float()
            y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()
            cache[key] = y.to(x.dtype).detach()
        return cache[key] + 0 * x + 0 * weight  # stays differentiable, as a cheat would

    return returns_cached_output


def skips_odd_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Writes only even rows; odd rows keep whatever the allocator handed out."""
    x2d = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2d)
    xf = x2d[0::2].float()
    y[0::2] = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(
        x.dtype
    )
    return y.view(x.shape)


def computes_in_half(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Everything in fp16 whatever the storage dtype, statistics included."""
    xh = x.half()
    return (xh * torch.rsqrt(xh.square().mean(-1, keepdim=True) + eps) * weight.half()).to(x.dtype)


RETURNS_CACHED_OUTPUT = Backend(
    name="wrong-cached-output", label="", build=_make_caching, numerics="fused_fp32",
    own_backward=False,
)  # fmt: skip
SKIPS_ODD_ROWS = _control("wrong-skips-odd-rows", skips_odd_rows)
SKIPS_ODD_ROWS_FORWARD_ONLY = Backend(
    name="wrong-skips-odd-rows-fwd", label="", build=lambda: skips_odd_rows,
    numerics="fused_fp32", own_backward=False, has_backward=False,
)  # fmt: skip
COMPUTES_IN_HALF = _control("wrong-computes-in-fp16", computes_in_half)
