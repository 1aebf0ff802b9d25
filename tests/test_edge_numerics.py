"""Numerics at the edges, for our kernel: non-finite rows, fp16 overflow of x^2, tiny inputs,
and 64-bit offsets (M*N >= 2**31, CUDA only)."""

from __future__ import annotations

import pytest
import torch

from harness.checks import check_backend
from harness.inputs import Inputs, make_inputs
from harness.oracle import TOLERANCES, compare, reference
from impls import get_backend
from impls.triton_rmsnorm import rmsnorm
from tests.conftest import DEVICE, ON_GPU
from tests.helpers import needs_gpu

#: Our kernel's bounds: fused_fp32 on a GPU, the interpreter's variant on a CPU.
OURS = TOLERANCES[get_backend("triton").numerics]

TRITON = get_backend("triton")


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_value_stays_in_its_row(poison):
    inputs = make_inputs((16, 1000), torch.bfloat16, DEVICE)
    x = inputs.x.clone()
    x[5, 17] = poison
    x_leaf = x.detach().requires_grad_(True)
    y = rmsnorm(x_leaf, inputs.weight, inputs.eps)
    (dx,) = torch.autograd.grad(y, (x_leaf,), inputs.dy)
    ref = reference(x, inputs.weight, inputs.eps, inputs.dy)
    others = [r for r in range(16) if r != 5]
    tol = OURS
    for name, got, want in (("y", y, ref.y), ("dx", dx, ref.dx)):
        assert torch.isfinite(got[others]).all(), f"{name}: non-finite value leaked out of row 5"
        report = compare(name, got[others], want[others], torch.bfloat16, tol[name], 1000)
        assert report.passed, report.summary()
        assert not torch.isfinite(got[5]).all(), f"{name}: row 5 lost its non-finite value"
    # the whole poisoned row agrees with the oracle, NaN for NaN
    assert compare("y", y[5], ref.y[5], torch.bfloat16, tol["y"], 1000).passed


def test_fp16_inputs_whose_squares_overflow_fp16():
    """x near 300: x^2 ~ 9e4 > fp16 max 65504. An fp32 reduction is right; eager fp16 is not."""
    shape = (64, 2048)
    base = make_inputs(shape, torch.float16, DEVICE)
    x = (300.0 + 10.0 * torch.randn(shape)).to(device=DEVICE, dtype=torch.float16)
    inputs = Inputs(x=x, weight=base.weight, dy=base.dy, eps=base.eps)
    result = check_backend(TRITON, TRITON.build(), inputs)
    assert result.passed, result.summary()
    eager = get_backend("eager")
    assert not check_backend(eager, eager.build(), inputs).passed


def test_tiny_fp32_inputs_follow_the_oracle():
    base = make_inputs((32, 1024), torch.float32, DEVICE)
    inputs = Inputs(x=base.x * 1e-20, weight=base.weight, dy=base.dy, eps=1e-6)
    result = check_backend(TRITON, TRITON.build(), inputs)
    assert result.passed, result.summary()


@needs_gpu("2**31 elements do not fit the interpreter")
def test_offsets_beyond_2_to_the_31():
    """M*N > 2**31 bf16 elements (4.3 GB): the last rows, past the int32 range, are right."""
    n = 8192
    m = 2**31 // n + 64
    x = torch.empty(m, n, dtype=torch.bfloat16, device="cuda").normal_()
    w = (1.0 + 0.5 * torch.randn(n)).to(device="cuda", dtype=torch.bfloat16)
    x_leaf = x.requires_grad_(True)
    y = rmsnorm(x_leaf, w, 1e-5)
    dy = torch.empty_like(x).normal_()
    (dx,) = torch.autograd.grad(y, (x_leaf,), dy)
    tail = slice(m - 96, m)  # rows beyond element 2**31
    ref = reference(x.detach()[tail], w, 1e-5, dy[tail])
    tol = OURS
    assert compare("y", y[tail], ref.y, torch.bfloat16, tol["y"], n).passed
    assert compare("dx", dx[tail], ref.dx, torch.bfloat16, tol["dx"], n).passed


@pytest.mark.skipif(
    not ON_GPU or torch.cuda.get_device_properties(0).total_memory < 100 * 2**30,
    reason="needs a CUDA device with >= 100 GiB: 2**31 rows of 8 bf16 take 73 GiB in and out",
)
def test_more_than_2_to_the_31_rows():
    """M > 2**31 narrow rows, forward, no autograd: rows past 2**31 are written and right. The
    untuned launch runs the single-tile forward one program per tile of 256 rows, so the tile's
    first row (program id x BLOCK_M) passes 2**31 (the per-tile path once computed it in int32,
    found in review; not the product's tuned configuration, but a launch it can make)."""
    n, m = 8, 2**31 + 1000
    x = torch.empty(m, n, dtype=torch.bfloat16, device="cuda").normal_()
    w = (1.0 + 0.5 * torch.randn(n)).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = rmsnorm(x, w, 1e-5)
    for rows in (slice(0, 512), slice(2**31 - 512, 2**31 + 512), slice(m - 512, m)):
        ref = reference(x[rows], w, 1e-5)
        report = compare("y", y[rows], ref.y, torch.bfloat16, OURS["y"], n)
        assert report.passed, f"rows {rows}: {report.summary()}"
