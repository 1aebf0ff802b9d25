"""Fused pre-norm residual add: rmsnorm(x, w, residual=r) -> (y, h = x + r)."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle import compare, reference_residual
from impls.triton_rmsnorm import rmsnorm
from impls.triton_rmsnorm.launch import SINGLE_TILE_MAX_N
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import TOL
from tests.helpers import check_residual as _check


@pytest.mark.parametrize(
    "shape, dtype",
    [((64, 1024), torch.bfloat16), ((33, 4095), torch.float16), ((2, 9, 768), torch.float32),
     ((3, SINGLE_TILE_MAX_N + 5), torch.bfloat16), ((6, SINGLE_TILE_MAX_N + 5), torch.float16)],
    ids=lambda v: DTYPE_NAMES.get(v) or "x".join(map(str, v)),
)  # fmt: skip
def test_residual_add_matches_the_oracle(shape, dtype):
    _check(shape, dtype)


def test_residual_add_under_torch_compile_fullgraph():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, eps, residual: rmsnorm(x, w, eps, residual=residual),
                             fullgraph=True)  # fmt: skip
    _check((32, 512), torch.float32, fn=compiled)


def _compiled_rmsnorm(x, w, eps, residual):
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c, d: rmsnorm(a, b, c, residual=d), fullgraph=True)
    return fn(x, w, eps, residual)


@pytest.mark.parametrize("door", ["eager", "compiled"])
@pytest.mark.parametrize("shape", [(16, 640), (2, 8, 640)], ids=["2d", "3d"])
@pytest.mark.parametrize("used", ["y-only", "h-only"])
def test_one_output_unused(used, shape, door):
    """Gradient through only one of (y, h): the other sends none, and the result is still exact."""
    a = make_inputs(shape, torch.bfloat16, DEVICE)
    r = make_inputs(shape, torch.bfloat16, DEVICE).x
    x_leaf, r_leaf = a.x.detach().requires_grad_(True), r.detach().requires_grad_(True)
    if door == "eager":
        y, h = rmsnorm(x_leaf, a.weight, a.eps, residual=r_leaf)
    else:
        y, h = _compiled_rmsnorm(x_leaf, a.weight, a.eps, r_leaf)
    out, grad_out = (y, a.dy) if used == "y-only" else (h, a.dy)
    dx, dr = torch.autograd.grad(out, (x_leaf, r_leaf), grad_out)
    if used == "h-only":
        assert torch.equal(dx, a.dy) and torch.equal(dr, a.dy)
    else:
        ref = reference_residual(a.x, r, a.weight, a.eps, a.dy, normalized=h.detach())
        assert compare("dx", dx, ref.dx, torch.bfloat16, TOL["dx"], 640).passed
        assert torch.equal(dx, dr)


@pytest.mark.parametrize(
    "make_residual, error, match",
    [(lambda x: x[:, :-1], ValueError, "residual: expected x's shape"),
     (lambda x: x.float(), TypeError, "residual: dtype torch.float32 must match"),
     (lambda x: x.tolist(), TypeError, "residual: expected a torch.Tensor")],
    ids=["shape", "dtype", "type"],
)  # fmt: skip
def test_bad_residual_names_the_argument(make_residual, error, match):
    x = torch.randn(4, 256, device=DEVICE, dtype=torch.bfloat16)
    w = torch.ones(256, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(error, match=match):
        rmsnorm(x, w, residual=make_residual(x))
