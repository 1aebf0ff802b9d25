"""rmsnorm_fp8 on a CUDA GPU: the kernel's own fp32 -> fp8 conversion bitwise against torch's
(the same kernel storing its saturated fp32 values, converted by torch), the fp8 oracle, the
backward, torch.compile(fullgraph=True) with Inductor, and CUDA-graph capture. Skipped without
CUDA."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle_fp8 import check_fp8
from impls.triton_rmsnorm import fp8 as fp8_op
from impls.triton_rmsnorm import launch, rmsnorm_fp8
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
def test_kernel_cast_is_torchs_and_matches_oracle(dtype, shape, scaling, fp8, monkeypatch):
    fp8_dtype = FP8[fp8]
    inp = make_inputs(shape, dtype, "cuda", seed=shape[1])
    x, w = inp.x, inp.weight
    finite = x
    if shape[0] > 2:  # a NaN row: its codes (and scale) NaN, the other rows untouched
        x[0, 0] = float("nan")
        finite = x[1:]
    scale = _scale(finite, w, fp8_dtype, 0.5) if scaling == "per_tensor" else None  # saturates
    args = (x, w, EPS, 0.0, scaling, scale, fp8_dtype)
    # The default call, at the launch table's configuration, against the oracle.
    q, s, _, _ = rmsnorm_fp8_forward(*args)
    reports = check_fp8(q, scale if s is None else s, x, w, EPS, scaling=scaling,
                        fp8_dtype=fp8_dtype, static_scale=scale)  # fmt: skip
    assert all(r.passed for r in reports), "; ".join(r.summary() for r in reports)
    # The cast: the same kernel built twice, casting in the kernel and storing fp32 for torch.
    # Each build sums a row's squares in the order of its register layout, which follows its
    # stores: at more than 8 elements a thread the fp8 store's 16-code vectors and the fp32
    # store's 8-value ones give the two builds different layouts, and their rstd may differ by
    # an ulp or two (the H200's table at 4096 columns, 4 warps). So both run a configuration
    # of at most 8 elements a thread where there is one, and every row's rstd must agree.
    block_n = fp8_op.fp8_block_n(shape[1], scaling)
    config = fp8_op.heuristic_fp8_launch_config(block_n)
    one_layout = (
        shape[1] <= fp8_op.FP8_SINGLE_TILE_MAX_N
        and config["BLOCK_M"] * block_n <= 8 * 32 * config["num_warps"]
    )
    if one_layout:
        monkeypatch.setitem(fp8_op.FP8_LAUNCH_TABLE, (scaling, block_n, dtype.itemsize, 0), config)
    q, s, rstd, _ = rmsnorm_fp8_forward(*args, split_tile=False)  # the padded tile's entry above
    q_ref, s_ref, rstd_ref, _ = rmsnorm_fp8_forward(*args, cast_in_kernel=False, split_tile=False)
    rows = (rstd == rstd_ref) | (rstd.isnan() & rstd_ref.isnan())
    if one_layout:
        assert bool(rows.all()), f"rstd differs between the builds in {(~rows).sum()} rows"
    else:  # wider tiles (16 elements a thread at most warps) and the looped kernel
        assert rows.sum() * 2 >= rows.numel(), f"rstd differs between the builds in {(~rows).sum()}"
    # bitwise on the rows whose fp32 values are the same, NaN payloads aside (a NaN is a NaN
    # code whatever its sign bit)
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


def _straight_through_grads(x, w, dy, scaling, residual=None, dh=None):
    """dx, dw (and dr) as rmsnorm_fp8's backward must give them: the plain backward of the
    normalized rows at the fp8 forward's own rstd (straight through the quantization). Not the
    plain op's gradients: its forward is another kernel, whose rstd may differ by an ulp."""
    with torch.no_grad():
        _, _, rstd, h = rmsnorm_fp8_forward(x, w, EPS, 0.0, scaling, None, torch.float8_e4m3fn,
                                            residual)  # fmt: skip
        dx, dw = launch.rmsnorm_backward(dy, x if h is None else h, w, rstd, 0.0, dh)
    return (dx, dw) if residual is None else (dx, dw, dx)


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
    want = _straight_through_grads(x, w, inp.dy, scaling, residual=r, dh=inp.dh)
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
    want = _straight_through_grads(x.detach(), w.detach(), inp.dy, "block")
    assert torch.equal(dx, want[0]) and torch.equal(dw, want[1])


# ---- the forward's switches (experiments/fp8_padded_tile_ab.py times them) ----------------------

#: Widths whose tile is padded (4608, 5120, 640: the split tile applies) and powers of two.
SWITCH_SHAPES = [(64, 4608), (33, 640), (8, 8192), (1, 5120)]


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("shape", SWITCH_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_clamp_left_to_the_cast_and_w_as_a_row_keep_the_products_bits(shape, scaling, fp8):
    """The defaults leave the clamp to the cast (cvt.rn.satfinite clamps) and load w in x's
    layout; the earlier forms (clamp_before_cast=True, w_as_row=False) change no arithmetic:
    codes and scales bitwise the default's, NaN and saturation included."""
    fp8_dtype = FP8[fp8]
    inp = make_inputs(shape, torch.bfloat16, "cuda", seed=shape[1] + 3)
    x = inp.x
    if shape[0] > 2:
        x[0, 0] = float("nan")
    scale = _scale(x[1:] if shape[0] > 2 else x, inp.weight, fp8_dtype, 0.5)
    scale = scale if scaling == "per_tensor" else None  # half the amax: saturates
    args = (x, inp.weight, EPS, 0.0, scaling, scale, fp8_dtype)
    q, s, rstd, _ = rmsnorm_fp8_forward(*args, split_tile=False)
    for switches in ({"clamp_before_cast": True}, {"w_as_row": False},
                     {"clamp_before_cast": True, "w_as_row": False}):  # fmt: skip
        q2, s2, rstd2, _ = rmsnorm_fp8_forward(*args, split_tile=False, **switches)
        assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)), switches
        assert s is None or _same(s2, s), switches
        assert _same(rstd2, rstd), switches


@pytest.mark.parametrize("fp8", ["e4m3"])
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", SWITCH_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_split_tile_and_the_amax_with_the_sum_match_the_oracle(shape, residual, scaling,
                                                                    fp8):  # fmt: skip
    """split_tile=True, narrow_codes either way (a tile layout; the default takes it with a
    residual, but per block) and (per token) amax_with_sum (the default) against its earlier form sum or
    multiply in another order: judged by the oracle, with and without the residual add, with
    the earlier forms of the other switches too."""
    fp8_dtype = FP8[fp8]
    inp = make_inputs(shape, torch.bfloat16, "cuda", seed=shape[1] + 5, with_residual=residual)
    scale = _scale(inp.x, inp.weight, fp8_dtype, 1.0) if scaling == "per_tensor" else None
    r = inp.residual if residual else None
    earlier = {"clamp_before_cast": True, "w_as_row": False, "amax_with_sum": False}
    variants = [{"split_tile": True}, {"split_tile": True, **earlier}, {"narrow_codes": True},
                {"narrow_codes": True, "split_tile": True}, {"narrow_codes": False},
                {"narrow_codes": False, "split_tile": True}]  # fmt: skip
    if scaling == "per_token":
        variants += [{"split_tile": False}, {"split_tile": False, "amax_with_sum": False},
                     {"split_tile": True, "amax_with_sum": False}]  # fmt: skip
    for switches in variants:
        q, s, _rstd, h = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale,
                                             fp8_dtype, r, **switches)  # fmt: skip
        reports = check_fp8(q, scale if s is None else s, inp.x, inp.weight, EPS,
                            scaling=scaling, fp8_dtype=fp8_dtype, static_scale=scale,
                            normalized=h)  # fmt: skip
        assert all(rep.passed for rep in reports), (
            switches,
            "; ".join(rep.summary() for rep in reports),
        )
