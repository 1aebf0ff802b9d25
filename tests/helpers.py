"""What several test modules share: our op's checks against the oracle, and the GPU conditions
their skips test. Test modules import these from here, not from one another.

- ``assert_matches_oracle(x, w, dy, **kwargs)``: rmsnorm's y, dx and dw within our kernel's
  written bounds (TOL) of the fp32 oracle; returns them.
- ``check_residual(shape, dtype, fn=rmsnorm)``: the fused residual add's h, y, dx, dr and dw
  against the oracle, on fresh inputs of that shape.
- ``ON_NVIDIA_GPU``, ``needs_gpu(why)``, ``needs_nvidia_gpu(why)``: skip markers that say why.
"""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle import (
    RESIDUAL_SUM_TOLERANCE,
    TOLERANCES,
    compare,
    reference,
    reference_residual,
)
from impls import get_backend
from impls.triton_rmsnorm import rmsnorm
from tests.conftest import DEVICE, ON_GPU

#: Our kernel's bounds: fused_fp32 on a GPU, the interpreter's variant on a CPU.
TOL = TOLERANCES[get_backend("triton").numerics]
#: An NVIDIA GPU: the inline PTX (HOLD_STORAGE_FORM) and the Gluon kernels run there only.
ON_NVIDIA_GPU = DEVICE == "cuda" and torch.version.hip is None
#: The H200's facts, for dispatch.pretend_device (tests of its choices on any machine): 132
#: SMs, compute capability 9.0, 227 KB of shared memory a program and 228 KB an SM, 60 MB of L2,
#: inline PTX.
H200_FACTS = {"sm_count": 132, "capability": (9, 0), "shared_bytes_per_block": 232448,
              "shared_bytes_per_sm": 233472, "l2_bytes": 62914560, "inline_ptx": True}  # fmt: skip


def needs_gpu(why: str) -> pytest.MarkDecorator:
    """Skip without CUDA, saying what needs the GPU."""
    return pytest.mark.skipif(not ON_GPU, reason=f"{why}: needs a CUDA GPU")


def needs_nvidia_gpu(why: str) -> pytest.MarkDecorator:
    """Skip without an NVIDIA GPU (ROCm and the interpreter cannot run inline PTX)."""
    return pytest.mark.skipif(not ON_NVIDIA_GPU, reason=f"{why}: needs an NVIDIA GPU")


def grads(x, w, dy, **kwargs):
    """(y, dx, dw) of rmsnorm(x, w, 1e-5, **kwargs) through autograd, on fresh leaves."""
    x_leaf = x.detach().requires_grad_(True)
    w_leaf = w.detach().requires_grad_(True)
    y = rmsnorm(x_leaf, w_leaf, 1e-5, **kwargs)
    dx, dw = torch.autograd.grad(y, (x_leaf, w_leaf), dy.to(y.dtype))
    return y, dx, dw


def assert_matches_oracle(x, w, dy, **kwargs):
    y, dx, dw = grads(x, w, dy, **kwargs)
    ref = reference(x, w, 1e-5, dy.to(y.dtype), offset=kwargs.get("offset", 0.0),
                    out_dtype=kwargs.get("out_dtype"))  # fmt: skip
    n, m = x.shape[-1], x.numel() // x.shape[-1]
    for name, got, want, dtype, k in (("y", y, ref.y, y.dtype, n), ("dx", dx, ref.dx, x.dtype, n),
                                      ("dw", dw, ref.dw, w.dtype, m)):  # fmt: skip
        report = compare(name, got, want, dtype, TOL[name], k)
        assert report.passed, report.summary()
    return y, dx, dw


def run_residual(x, r, w, dy, dh, eps, fn=rmsnorm):
    """(y, h, (dx, dr, dw)) of fn(x, w, eps, residual=r) with gradients dy on y and dh on h."""
    leaves = [t.detach().requires_grad_(True) for t in (x, r, w)]
    y, h = fn(leaves[0], leaves[2], eps, residual=leaves[1])
    grads_ = torch.autograd.grad((y, h), leaves, (dy, dh))
    return y, h, grads_


def check_residual(shape, dtype, fn=rmsnorm):
    a = make_inputs(shape, dtype, DEVICE)
    b = make_inputs(shape, dtype, DEVICE)
    x, r, w, dy, dh, eps = a.x, b.x, a.weight, a.dy, b.dy, a.eps
    y, h, (dx, dr, dw) = run_residual(x, r, w, dy, dh, eps, fn)
    ref = reference_residual(x, r, w, eps, dy, dh, normalized=h.detach())
    n, m = shape[-1], x.numel() // shape[-1]
    if ON_GPU or dtype != torch.bfloat16:
        # Rounded to nearest, x + r is exact to the last bit. (Triton's CPU interpreter truncates
        # fp32 -> bf16, so there h may sit 1 ulp toward zero, inside RESIDUAL_SUM_TOLERANCE.)
        assert torch.equal(h, x + r)
    checks = [("h", h, ref.h, RESIDUAL_SUM_TOLERANCE, n), ("y", y, ref.y, TOL["y"], n),
              ("dx", dx, ref.dx, TOL["dx"], n), ("dr", dr, ref.dx, TOL["dx"], n),
              ("dw", dw, ref.dw, TOL["dw"], m)]  # fmt: skip
    for name, got, want, tol, k in checks:
        report = compare(name, got, want, dtype, tol, k)
        assert report.passed, report.summary()
