"""The oracle itself: ulps, rounding, bounds, non-finite handling."""

from __future__ import annotations

import math

import pytest
import torch

from harness.oracle import TOLERANCES, Tolerance, compare, reference, reference_dtype, ulp


@pytest.mark.parametrize(
    "value, dtype, expected",
    [
        (1.0, torch.bfloat16, 2.0**-7),
        (1.5, torch.bfloat16, 2.0**-7),
        (2.0, torch.bfloat16, 2.0**-6),
        (1.0, torch.float16, 2.0**-10),
        (-3.0, torch.float16, 2.0**-9),
        (1.0, torch.float32, 2.0**-23),
        (0.0, torch.float16, 2.0**-24),  # subnormal spacing
        (1e-30, torch.float16, 2.0**-24),
    ],
)
def test_ulp(value, dtype, expected):
    assert ulp(torch.tensor([value], dtype=torch.float64), dtype).item() == expected


def test_reference_precision():
    assert reference_dtype(torch.bfloat16) == torch.float32
    assert reference_dtype(torch.float16) == torch.float32
    assert reference_dtype(torch.float32) == torch.float64


def test_reference_matches_closed_form():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float32)
    w = torch.tensor([1.0, 2.0], dtype=torch.float32)
    ref = reference(x, w, 0.0)
    rms = math.sqrt((9 + 16) / 2)
    assert torch.allclose(ref.y, torch.tensor([[3 / rms, 8 / rms]], dtype=torch.float64))


def test_reference_gradients_match_the_closed_form():
    """The oracle's autograd gradients equal the textbook formulas, computed in fp64:
    dx = rstd * (g - x_hat * mean(g * x_hat)) with g = (offset + w) * dy, dw = sum dy * x_hat."""
    x = torch.randn(5, 48, dtype=torch.float32)
    w = torch.randn(48, dtype=torch.float32)
    dy = torch.randn(5, 48, dtype=torch.float32)
    eps, offset = 0.3, 1.0
    ref = reference(x, w, eps, dy, offset=offset)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    rstd = torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    x_hat = x64 * rstd
    g = (offset + w64) * dy64
    dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    torch.testing.assert_close(ref.dx, dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref.dw, (dy64 * x_hat).sum(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref.y, x_hat * (offset + w64), rtol=1e-12, atol=1e-12)


def test_exact_bound_accepts_correct_rounding_and_rejects_a_second_rounding():
    """fused_fp32's y bound: within 0.5 ulp of the exact value (plus fp32 noise)."""
    tol = TOLERANCES["fused_fp32"]["y"]
    exact = torch.tensor([1.0 + 0.3 * 2.0**-7, 1.0 + 0.7 * 2.0**-7], dtype=torch.float64)
    correctly_rounded = exact.to(torch.bfloat16)
    assert compare("y", correctly_rounded, exact, torch.bfloat16, tol, 4).passed
    other_side = torch.tensor([1.0 + 2.0**-7, 1.0], dtype=torch.bfloat16)  # each 1 ulp off
    report = compare("y", other_side, exact, torch.bfloat16, tol, 4)
    assert not report.passed and report.mismatches == 2


def test_one_ulp_passes_two_fail_against_the_rounded_oracle():
    tol = TOLERANCES["fused_fp32_interpreted"]["y"]
    ref = torch.full((4,), 1.0, dtype=torch.float32) + 2.0**-9  # between two bf16 values
    one_off = torch.full((4,), 1.0 + 2.0**-7, dtype=torch.bfloat16)
    assert compare("y", one_off, ref, torch.bfloat16, tol, 4).passed
    two_off = torch.full((4,), 1.0 + 2 * 2.0**-7, dtype=torch.bfloat16)
    report = compare("y", two_off, ref, torch.bfloat16, tol, 4)
    assert not report.passed and report.mismatches == 4


def test_nan_where_oracle_is_finite_fails():
    ref = torch.ones(8, dtype=torch.float32)
    out = torch.ones(8, dtype=torch.float16)
    out[3] = float("nan")
    report = compare("y", out, ref, torch.float16, Tolerance(100, 100, "loose"), 8)
    assert not report.passed and report.mismatches == 1 and "non-finite" in report.detail


def test_matching_non_finite_values_pass():
    ref = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float32)
    out = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float16)
    assert compare("y", out, ref, torch.float16, TOLERANCES["fused_fp32"]["y"], 3).passed
    wrong = torch.tensor([1.0, float("nan"), float("-inf")], dtype=torch.float16)
    assert not compare("y", wrong, ref, torch.float16, TOLERANCES["fused_fp32"]["y"], 3).passed


def test_wrong_shape_or_dtype_fails():
    ref = torch.ones(2, 4, dtype=torch.float32)
    tol = TOLERANCES["fused_fp32"]["y"]
    assert not compare(
        "y", torch.ones(4, 2, dtype=torch.bfloat16), ref, torch.bfloat16, tol, 4
    ).passed
    assert not compare(
        "y", torch.ones(2, 4, dtype=torch.float32), ref, torch.bfloat16, tol, 4
    ).passed


def test_every_tolerance_has_a_reason():
    for numerics, per_quantity in TOLERANCES.items():
        assert set(per_quantity) == {"y", "dx", "dw"}, numerics
        for tol in per_quantity.values():
            assert len(tol.reason) > 20
