"""torch.compile(fullgraph=True) over our op with several eps values in one process: after a
second value dynamo passes eps as a symbolic float, and the op's checks must trace (issue 30,
item 8). The checks still run on real values: eagerly, and inside the custom op at run time."""

from __future__ import annotations

import pytest
import torch

from impls.triton_rmsnorm import RMSNorm, rmsnorm
from impls.triton_rmsnorm.function import _rmsnorm_fwd_op
from tests.conftest import DEVICE


def _reference(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_one_compiled_rmsnorm_with_two_eps_values():
    torch.manual_seed(0)
    x = torch.randn(4, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    compiled = torch.compile(rmsnorm, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for eps in (1e-5, 1e-6, 1e-2):
            torch.testing.assert_close(compiled(x, w, eps), _reference(x, w, eps))


def test_two_compiled_modules_with_different_eps_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, device=DEVICE, requires_grad=True)
    modules = [RMSNorm(32, eps=eps).to(DEVICE) for eps in (1e-5, 1e-1)]
    for module in modules:
        with torch.no_grad():
            module.weight.normal_()
    compiled = [torch.compile(m, fullgraph=True, backend="aot_eager") for m in modules]
    for module, fn in zip(modules, compiled, strict=True):
        y = fn(x)
        torch.testing.assert_close(y, _reference(x.detach(), module.weight.detach(), module.eps))
        y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_bad_eps_is_still_rejected_compiled_and_at_run_time():
    x = torch.randn(2, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    compiled = torch.compile(rmsnorm, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        compiled(x, w, 1e-5)
        compiled(x, w, 1e-6)  # eps symbolic from here on
        with pytest.raises(Exception, match="eps: expected a finite number >= 0"):
            compiled(x, w, -1.0)
        with pytest.raises(Exception, match="eps: expected a finite number >= 0"):
            compiled(x, w, float("nan"))
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0"):
        _rmsnorm_fwd_op(x, w, None, float("inf"), 0.0, x.dtype)
    with pytest.raises(ValueError, match="offset: expected a finite number"):
        _rmsnorm_fwd_op(x, w, None, 1e-6, float("nan"), x.dtype)
