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


def test_reference_gradients_match_finite_differences():
    x = torch.randn(3, 16, dtype=torch.float32)
    w = torch.randn(16, dtype=torch.float32)
    dy = torch.randn(3, 16, dtype=torch.float32)
    ref = reference(x, w, 1e-3, dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: a * torch.rsqrt(a.square().mean(-1, keepdim=True) + 1e-3) * b, (x64, w64)
    )
    assert ref.dx.dtype == torch.float64 and ref.dw.shape == (16,)


def test_one_ulp_passes_two_fail_for_single_rounding():
    tol = TOLERANCES["fused_fp32"]["y"]
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
