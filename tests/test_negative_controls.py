"""The oracle checks must reject deliberately wrong backends."""

from __future__ import annotations

import torch

from harness.checks import check_backend
from harness.inputs import LARGE_EPS, make_inputs
from impls import Backend
from tests.conftest import DEVICE
from tests.negative_controls import (
    COMPUTES_IN_HALF,
    FORGETS_EPS,
    RETURNS_CACHED_OUTPUT,
    ROUNDS_TWICE,
    SKIPS_ODD_ROWS,
    SKIPS_ODD_ROWS_FORWARD_ONLY,
    SUMS_SQUARES_IN_BF16,
)


def _fails(backend, shape, dtype, **kwargs) -> str:
    inputs = make_inputs(shape, dtype, DEVICE, **kwargs)
    result = check_backend(backend, backend.build(), inputs)
    assert not result.passed, f"the oracle accepted {backend.name}: {result.summary()}"
    return result.summary()


def test_rejects_forgotten_eps():
    _fails(FORGETS_EPS, (64, 1024), torch.bfloat16, eps=LARGE_EPS)


def test_rejects_bf16_sum_of_squares():
    _fails(SUMS_SQUARES_IN_BF16, (16, 2048), torch.bfloat16)


def test_rejects_two_roundings_claimed_as_one():
    summary = _fails(ROUNDS_TWICE, (64, 4096), torch.bfloat16)
    assert "y: FAIL" in summary


def test_rejects_unwritten_elements():
    """A kernel that leaves part of its output unwritten (NaN there) fails."""

    def leaves_tail_unwritten(x, weight, eps):
        from harness.oracle import reference_forward

        y = reference_forward(x, weight, eps).to(x.dtype)
        y[..., -3:] = float("nan")
        return y

    backend = FORGETS_EPS.__class__(
        name="wrong-unwritten-tail", label="", build=lambda: leaves_tail_unwritten,
        numerics="fused_fp32", own_backward=False, has_backward=False,
    )  # fmt: skip
    summary = _fails(backend, (8, 1000), torch.float16)
    assert "non-finite" in summary


def test_rejects_cached_output():
    """Right on the first call of a shape, stale afterwards: the mirrored second call fails."""
    summary = _fails(RETURNS_CACHED_OUTPUT, (32, 1024), torch.bfloat16)
    assert "y#2: FAIL" in summary and "y: ok" in summary


def test_rejects_skipped_rows():
    _fails(SKIPS_ODD_ROWS, (32, 1024), torch.bfloat16)


def test_rejects_skipped_rows_in_the_forward_alone():
    """Unwritten rows fail y itself (on CUDA they read as the poison, NaN)."""
    summary = _fails(SKIPS_ODD_ROWS_FORWARD_ONLY, (32, 1024), torch.bfloat16)
    assert "y: FAIL" in summary


def test_rejects_low_precision_compute():
    """fp16 statistics for an fp32 tensor: far outside fp32's bound."""
    _fails(COMPUTES_IN_HALF, (32, 1024), torch.float32)


def _normalizes_exact_sum(x, residual, weight, eps):
    """Pre-norm add that normalizes x + r before rounding (QuACK's definition), in fp64."""
    s = x.double() + residual.double()
    y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * weight.double()
    return y.to(x.dtype), s.to(x.dtype)


def test_add_rmsnorm_is_judged_by_the_sum_it_declares_it_normalizes():
    """The exact-sum definition passes when declared and fails when the backend claims to
    normalize the stored (rounded) h: the two differ by more than half an ulp in bf16."""
    from dataclasses import replace

    declared = Backend(name="exact-sum", label="exact-sum", build=lambda: _normalizes_exact_sum,
                       numerics="fused_fp32", own_backward=False, op="add_rmsnorm",
                       add_normalizes="exact_sum")  # fmt: skip
    inputs = make_inputs((64, 1024), torch.bfloat16, DEVICE, with_residual=True)
    result = check_backend(declared, declared.build(), inputs, backward=False)
    assert result.passed, result.summary()
    claims_stored = replace(declared, add_normalizes="stored_sum")
    assert "y: FAIL" in _fails(claims_stored, (64, 1024), torch.bfloat16, with_residual=True)
