"""rmsnorm_fp8 on a CUDA GPU: the kernel's own fp32 -> fp8 conversion bitwise against torch's
(the same kernel storing its saturated fp32 values, converted by torch), the fp8 oracle, the
backward, torch.compile(fullgraph=True) with Inductor, and CUDA-graph capture. Skipped without
CUDA."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle_fp8 import check_fp8
from impls.triton_rmsnorm import rmsnorm, rmsnorm_fp8
from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EPS = 1e-6
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SHAPES = [(1, 1), (7, 127), (33, 130), (64, 1000), (512, 4096), (257, 7168), (8, 8192),
          (4, 16384), (2, 32768)]  # fmt: skip


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN where the other is NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _scale(x, w, fp8_dtype, headroom):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w.float()
    return (y.abs().amax() / torch.finfo(fp8_dtype).max * headroom).reshape(1).float()


#: bf16 at every shape, fp16 at two (each case compiles the kernel twice).
CASTS = [(torch.bfloat16, s) for s in SHAPES] + [(torch.float16, (64, 1000)),
                                                  (torch.float16, (512, 4096)),
                                                  # past the single tile: the looped kernel
                                                  (torch.bfloat16, (64, 32968)),
                                                  (torch.float16, (16, 65536))]  # fmt: skip


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize(
    ("dtype", "shape"), CASTS,
    ids=[f"{str(d).removeprefix('torch.')}-{m}x{n}" for d, (m, n) in CASTS],
)  # fmt: skip
def test_kernel_cast_is_torchs_and_matches_oracle(dtype, shape, scaling, fp8):
    fp8_dtype = FP8[fp8]
    inp = make_inputs(shape, dtype, "cuda", seed=shape[1])
    x, w = inp.x, inp.weight
    finite = x
    if shape[0] > 2:  # a NaN row: its codes (and scale) NaN, the other rows untouched
        x[0, 0] = float("nan")
        finite = x[1:]
    scale = _scale(finite, w, fp8_dtype, 0.5) if scaling == "per_tensor" else None  # saturates
    args = (x, w, EPS, 0.0, scaling, scale, fp8_dtype)
    q, s, rstd, _ = rmsnorm_fp8_forward(*args)
    q_ref, s_ref, rstd_ref, _ = rmsnorm_fp8_forward(*args, cast_in_kernel=False)
    # The two builds are two compilations: each sums a row's squares in the order its register
    # layout gives, and their different stores (16 fp8 codes a thread against 8 fp32 values)
    # choose different layouts where N is a multiple of 16 (16x65536 fp16 on the H200: 4 rows
    # of 16 an ulp apart). So the cast is compared where the fp32 values are the same ones,
    # on the rows whose rstd is, which must be most rows; the oracle below checks every row.
    rows = (rstd == rstd_ref) | (rstd.isnan() & rstd_ref.isnan())
    assert rows.sum() * 2 >= rows.numel(), f"rstd differs between the builds in {(~rows).sum()}"
    ulp = torch.finfo(torch.float32).eps * rstd_ref.abs()
    assert bool(((rstd - rstd_ref).abs() <= ulp)[~rows].all()), "rstd more than an ulp apart"
    # bitwise, NaN payloads aside (a NaN is a NaN code whatever its sign bit)
    kept, kept_ref = q[rows], q_ref[rows]
    nan = torch.isnan(kept.float())
    assert torch.equal(nan, torch.isnan(kept_ref.float()))
    same = kept.view(torch.uint8) == kept_ref.view(torch.uint8)
    assert bool((same | nan).all()), f"kernel cast != torch's at {(~same & ~nan).nonzero()[:4]}"
    if s is not None:
        assert _same(s[rows], s_ref[rows])
    reports = check_fp8(q, scale if s is None else s, x, w, EPS, scaling=scaling,
                        fp8_dtype=fp8_dtype, static_scale=scale)  # fmt: skip
    assert all(r.passed for r in reports), "; ".join(r.summary() for r in reports)


@pytest.mark.parametrize("scaling", ["per_token", "block"])
def test_compile_fullgraph_inductor_and_backward(scaling):
    inp = make_inputs((256, 4096), torch.bfloat16, "cuda", seed=1, with_residual=True)
    x = inp.x.detach().requires_grad_()
    w = inp.weight.detach().requires_grad_()
    r = inp.residual.detach().requires_grad_()

    def f(x, w, r):
        return rmsnorm_fp8(x, w, EPS, residual=r, scaling=scaling, grad_port=True)

    torch._dynamo.reset()
    q, s, h, port = torch.compile(f, fullgraph=True)(x, w, r)
    q0, s0, h0, _ = f(x, w, r)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)
    assert torch.equal(h, h0) and s.stride() == s0.stride()
    got = torch.autograd.grad((port, h), (x, w, r), (inp.dy, inp.dh))
    y, h1 = rmsnorm(x, w, EPS, residual=r)
    want = torch.autograd.grad((y, h1), (x, w, r), (inp.dy, inp.dh))
    for g, e in zip(got, want, strict=True):
        assert torch.equal(g, e)


def test_cuda_graph_capture_replays_forward_and_backward():
    inp = make_inputs((512, 4096), torch.bfloat16, "cuda", seed=2)
    x = inp.x.detach().requires_grad_()
    w = inp.weight.detach().requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile and warm up outside the capture
            q, s, port = rmsnorm_fp8(x, w, EPS, scaling="block", grad_port=True)
            torch.autograd.grad(port, (x, w), inp.dy)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        q, s, port = rmsnorm_fp8(x, w, EPS, scaling="block", grad_port=True)
        dx, dw = torch.autograd.grad(port, (x, w), inp.dy)
    with torch.no_grad():
        x.copy_(make_inputs((512, 4096), torch.bfloat16, "cuda", seed=3).x)
    graph.replay()
    torch.cuda.synchronize()
    q1, s1 = rmsnorm_fp8(x.detach(), w.detach(), EPS, scaling="block")
    assert torch.equal(q.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s, s1)
    want = torch.autograd.grad(rmsnorm(x, w, EPS), (x, w), inp.dy)
    assert torch.equal(dx, want[0]) and torch.equal(dw, want[1])
