"""rmsnorm_fp8 on the CPU (the Triton interpreter) and the fp8 oracle: every scaling, e4m3 and
e5m2, saturation, NaN, residual, offset, strided rows, odd N, the backward, the custom op, and
the negative controls. The interpreter's own fp32 -> fp8 conversion is wrong (see fp8.py), so
there the kernel stores the saturated fp32 value and torch converts it; the GPU test
(test_rmsnorm_fp8_gpu.py) checks the kernel's own conversion bitwise."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle_fp8 import FLT_MIN, check_fp8
from impls.triton_rmsnorm import rmsnorm, rmsnorm_fp8
from impls.triton_rmsnorm.fp8 import BLOCK_GROUP, FP8_SINGLE_TILE_MAX_N, SCALE_ROW_ALIGN
from impls.triton_rmsnorm.launch import next_power_of_2
from tests import negative_controls_fp8 as wrong
from tests.conftest import DEVICE

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = {"e4m3": E4, "e5m2": E5}
EPS = 1e-6


def _inputs(shape, dtype=torch.bfloat16, seed=0, residual=False):
    return make_inputs(shape, dtype, DEVICE, seed=seed, with_residual=residual)


def _static_scale(x, w, fp8_dtype, headroom=1.0):
    """A per-tensor scale: amax of y over the tensor / max, times headroom (< 1: saturates)."""
    from harness.oracle_fp8 import reference_fp8

    y = reference_fp8(x, w, EPS, scaling="per_tensor", fp8_dtype=fp8_dtype).y
    fmax = torch.finfo(fp8_dtype).max
    return torch.tensor([y.abs().max().item() / fmax * headroom], dtype=torch.float32,
                        device=x.device)  # fmt: skip


def _assert_passes(reports):
    assert all(r.passed for r in reports), "; ".join(r.summary() for r in reports)


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("shape", [(3, 1), (4, 127), (5, 130), (3, 1000), (6, 256)],
                         ids=lambda s: f"{s[0]}x{s[1]}")  # fmt: skip
def test_matches_oracle(shape, scaling, fp8):
    inp = _inputs(shape, seed=shape[1])
    dt = FP8[fp8]
    scale = _static_scale(inp.x, inp.weight, dt) if scaling == "per_tensor" else None
    q, s = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling=scaling, scale=scale, fp8_dtype=dt)
    assert q.dtype == dt and q.shape == inp.x.shape
    m, n = shape
    if scaling == "per_token":
        assert s.shape == (m,)
    elif scaling == "block":
        groups = -(-n // BLOCK_GROUP)
        assert s.shape == (m, groups)
        assert s.stride() == (1, -(-m // SCALE_ROW_ALIGN) * SCALE_ROW_ALIGN)
    else:
        assert s is scale
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling=scaling, fp8_dtype=dt,
                             static_scale=scale))  # fmt: skip


#: Past the single tile: a last step of 200 columns (a part-filled block), and of a whole one.
_WIDE_N = (FP8_SINGLE_TILE_MAX_N + 200, FP8_SINGLE_TILE_MAX_N + 4096)


@pytest.mark.parametrize("reciprocal", [True, False], ids=["reciprocal", "divide"])
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("n", _WIDE_N)
def test_rows_past_the_single_tile_match_the_oracle(n, scaling, reciprocal):
    """Rows wider than the single tile are walked in steps (rmsnorm_fp8_fwd_looped_kernel):
    every scaling within the fp8 oracle, both ways of applying the scale, and rstd the plain
    op's (the backward reads it)."""
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((3, n), seed=n)
    scale = _static_scale(inp.x, inp.weight, E4) if scaling == "per_tensor" else None
    q, s, rstd, _ = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale, E4,
                                        reciprocal=reciprocal)  # fmt: skip
    _assert_passes(check_fp8(q, s if scale is None else scale, inp.x, inp.weight, EPS,
                             scaling=scaling, fp8_dtype=E4, static_scale=scale))  # fmt: skip
    want = torch.rsqrt(inp.x.double().pow(2).mean(-1) + EPS)
    assert torch.allclose(rstd.double(), want, rtol=1e-6)


def test_wide_rows_with_residual_nan_and_saturation():
    """The looped kernel's residual (h written, y normalizing the rounded h), a NaN row (NaN
    scale and codes), a zero row (zeros), and a static scale that saturates."""
    n = _WIDE_N[0]
    inp = _inputs((4, n), seed=5, residual=True)
    x = inp.x.clone()
    x[1, 1234] = float("nan")
    x[2] = 0
    q, s, h = rmsnorm_fp8(x, inp.weight, EPS, residual=inp.residual, scaling="block")
    # h as the plain op forms it (the interpreter truncates fp32 -> bf16; a GPU rounds)
    plain_h = rmsnorm(x, inp.weight, EPS, residual=inp.residual)[1]
    assert torch.equal(h[[0, 2, 3]], plain_h[[0, 2, 3]]) and torch.isnan(h[1, 1234])
    _assert_passes(check_fp8(q[[0, 3]], s[[0, 3]], x[[0, 3]], inp.weight, EPS, scaling="block",
                             fp8_dtype=E4, normalized=h[[0, 3]]))  # fmt: skip
    assert torch.isnan(q[1].float()).all() and torch.isnan(s[1]).all()
    q2, s2 = rmsnorm_fp8(torch.zeros(2, n, dtype=torch.bfloat16, device=DEVICE), inp.weight,
                         EPS, scaling="per_token")  # fmt: skip
    assert not q2.float().any() and torch.all(s2 == FLT_MIN)
    scale = _static_scale(inp.x, inp.weight, E4, headroom=0.25)
    q3, _ = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling="per_tensor", scale=scale)
    assert q3.float().abs().max() == torch.finfo(E4).max
    _assert_passes(check_fp8(q3, scale, inp.x, inp.weight, EPS, scaling="per_tensor",
                             fp8_dtype=E4, static_scale=scale))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_other_input_dtypes(dtype):
    inp = _inputs((4, 300), dtype)
    q, s = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling="block")
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="block", fp8_dtype=E4))


def test_block_row_major_layout_same_values():
    inp = _inputs((5, 700))
    q, s = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling="block")
    q2, s2 = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling="block", scale_layout="row_major")
    assert (
        s2.is_contiguous()
        and torch.equal(s, s2)
        and torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
    )


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
def test_saturates_at_the_format_max(fp8):
    dt = FP8[fp8]
    inp = _inputs((8, 256))
    scale = _static_scale(inp.x, inp.weight, dt, headroom=0.25)
    q, s = rmsnorm_fp8(inp.x, inp.weight, EPS, scaling="per_tensor", scale=scale, fp8_dtype=dt)
    qf = q.float()
    fmax = torch.finfo(dt).max
    assert torch.isfinite(qf).all() and (qf.abs() == fmax).sum() > 10 and qf.abs().max() == fmax
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_tensor", fp8_dtype=dt,
                             static_scale=scale))  # fmt: skip


@pytest.mark.parametrize("scaling", ["per_token", "block", "per_tensor"])
def test_nan_stays_nan_and_zero_rows_give_zeros(scaling):
    inp = _inputs((4, 300))
    x = inp.x.clone()
    x[1, 7] = float("nan")
    x[2] = 0
    scale = torch.ones(1, device=x.device) if scaling == "per_tensor" else None
    q, s = rmsnorm_fp8(x, inp.weight, EPS, scaling=scaling, scale=scale)
    qf = q.float()
    assert torch.isnan(qf[1]).all() and not torch.isnan(qf[[0, 2, 3]]).any()
    assert (qf[2] == 0).all()
    if scaling != "per_tensor":
        assert torch.isnan(s[1]).all() and (s[2] == FLT_MIN).all()
    _assert_passes(check_fp8(q, s, x, inp.weight, EPS, scaling=scaling, fp8_dtype=E4,
                             static_scale=scale))  # fmt: skip


def test_residual_offset_strided_rows():
    inp = _inputs((6, 260), residual=True)
    wide = torch.randn(6, 400, dtype=torch.bfloat16, device=DEVICE)
    wide[:, :260] = inp.x
    x = wide[:, :260]  # rows strided by 400
    assert x.stride(0) == 400
    q, s, h = rmsnorm_fp8(x, inp.weight, EPS, residual=inp.residual, offset=1.0, scaling="block")
    # h as the plain op forms it (the interpreter truncates fp32 -> bf16; a GPU rounds)
    assert torch.equal(h, rmsnorm(x, inp.weight, EPS, residual=inp.residual)[1])
    _assert_passes(check_fp8(q, s, x, inp.weight, EPS, scaling="block", fp8_dtype=E4,
                             offset=1.0, normalized=h))  # fmt: skip


def test_leading_dimensions():
    inp = _inputs((2, 3, 130))
    q, s = rmsnorm_fp8(inp.x, inp.weight, EPS)
    assert q.shape == (2, 3, 130) and s.shape == (2, 3)
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=E4))


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_backward_is_the_plain_ops_straight_through(with_residual):
    """dx, dw (and dr) from dy arriving on dy_port equal the plain op's for the same dy."""
    inp = _inputs((5, 300), residual=with_residual)
    extra = {"residual": inp.residual.detach().requires_grad_()} if with_residual else {}
    x, w = inp.x.detach().requires_grad_(), inp.weight.detach().requires_grad_()
    outs = rmsnorm_fp8(x, w, EPS, offset=1.0, grad_port=True, **extra)
    port = outs[-1]
    assert port.shape == x.shape and port.dtype == x.dtype and port.stride() == (0, 0)
    assert not outs[0].requires_grad and not outs[1].requires_grad
    inference = rmsnorm_fp8(x.detach(), w.detach(), EPS, offset=1.0,
                            **{k: v.detach() for k, v in extra.items()})  # fmt: skip
    assert torch.equal(outs[0].view(torch.uint8), inference[0].view(torch.uint8))
    assert torch.equal(outs[1], inference[1])
    leaves = (x, w, *extra.values())
    got = torch.autograd.grad(port, leaves, inp.dy)
    plain = rmsnorm(x, w, EPS, offset=1.0, **extra)
    y = plain[0] if with_residual else plain
    want = torch.autograd.grad(y, leaves, inp.dy)
    for g, e in zip(got, want, strict=True):
        assert torch.equal(g, e)


def test_custom_op_under_compile_fullgraph():
    inp = _inputs((4, 260))
    x, w = inp.x.detach().requires_grad_(), inp.weight.detach().requires_grad_()

    def f(x, w):
        q, s, port = rmsnorm_fp8(x, w, EPS, scaling="block", grad_port=True)
        return q, s, port

    torch._dynamo.reset()
    q, s, port = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w)
    q0, s0, _ = f(x, w)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)
    assert s.stride() == s0.stride()
    dx, dw = torch.autograd.grad(port, (x, w), inp.dy)
    want = torch.autograd.grad(rmsnorm(x, w, EPS), (x, w), inp.dy)
    assert torch.equal(dx, want[0]) and torch.equal(dw, want[1])


def test_bad_arguments_name_themselves():
    inp = _inputs((2, 64))
    x, w = inp.x, inp.weight
    with pytest.raises(ValueError, match="scaling"):
        rmsnorm_fp8(x, w, EPS, scaling="per_row")
    with pytest.raises(TypeError, match="fp8_dtype"):
        rmsnorm_fp8(x, w, EPS, fp8_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="scale"):
        rmsnorm_fp8(x, w, EPS, scaling="per_tensor", scale=0.5)
    with pytest.raises(ValueError, match="scale"):
        rmsnorm_fp8(x, w, EPS, scale=torch.ones(1))
    with pytest.raises(ValueError, match="scale"):
        rmsnorm_fp8(x, w, EPS, scaling="per_tensor", scale=torch.ones(2))
    with pytest.raises(ValueError, match="scale_layout"):
        rmsnorm_fp8(x, w, EPS, scaling="block", scale_layout="tma")


# ---- the oracle itself ---------------------------------------------------------------------------


def test_oracle_accepts_a_right_fp32_implementation():
    inp = _inputs((64, 1024), seed=3)
    for dt in (E4, E5):
        q, s = wrong.fp32_torch(inp.x, inp.weight, EPS, dt)
        _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=dt))


def _fails(reports, quantity):
    failed = {r.quantity for r in reports if not r.passed}
    assert quantity in failed, "; ".join(r.summary() for r in reports)


def test_rejects_amax_over_the_wrong_axis():
    inp = _inputs((256, 256), seed=4)
    q, s = wrong.amax_over_wrong_axis(inp.x, inp.weight, EPS)
    _fails(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=E4), "scales")


def test_rejects_y_rounded_to_bf16_before_quantizing():
    """The scales are right; the codes alone must catch the extra rounding."""
    inp = _inputs((64, 1024), seed=5)
    q, s = wrong.rounds_y_to_bf16(inp.x, inp.weight, EPS)
    reports = check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=E4)
    _fails(reports, "q")
    # ... and the looser class for a bf16 y (eager's) accepts it
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=E4,
                             numerics="bf16_y"))  # fmt: skip


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
def test_rejects_forgotten_saturation(fp8):
    dt = FP8[fp8]
    inp = _inputs((16, 512), seed=6)
    scale = _static_scale(inp.x, inp.weight, dt, headroom=0.5)
    q, s = wrong.forgets_saturation(inp.x, inp.weight, EPS, scale, dt)
    _fails(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_tensor", fp8_dtype=dt,
                     static_scale=scale), "q")  # fmt: skip


def test_torch_conversions_as_documented():
    """torch (CPU) saturates float -> e4m3fn, not float -> e5m2; the oracle clamps first."""
    v = torch.tensor([464.0, 1e4, float("inf"), float("nan"), 61440.0])
    e4 = v.to(E4).float()
    assert e4[:3].tolist() == [448.0, 448.0, 448.0] and torch.isnan(e4[3])
    e5 = v.to(E5).float()
    assert e5[4].item() == float("inf") and torch.isnan(e5[3])


# ---- registry, byte model, benchmark -------------------------------------------------------------


def test_fp8_byte_model():
    from harness.traffic import fp8_counted_bytes

    m, n = 4, 300
    assert fp8_counted_bytes("fwd", m, n, 2, scaling="per_tensor") == 2 * m * n + m * n
    assert fp8_counted_bytes("fwd", m, n, 2, scaling="per_token") == 3 * m * n + 4 * m
    assert fp8_counted_bytes("fwd", m, n, 2, scaling="block", residual=True) == (
        6 * m * n + m * n + 4 * m * 3
    )
    assert fp8_counted_bytes("bwd", m, n, 2, scaling="block") == 3 * m * n * 2
    with pytest.raises(ValueError, match="scaling"):
        fp8_counted_bytes("fwd", m, n, 2, scaling="tensor")


def test_registry_lists_fp8_backends_apart():
    from impls import all_backends

    names = [b.name for b in all_backends("rmsnorm_fp8")]
    assert names[:3] == ["triton-fp8", "eager-fp8", "compile-fp8"] and "vllm-fp8" in names
    assert not any(b.op == "rmsnorm_fp8" for b in all_backends(None))
    vllm = next(b for b in all_backends("rmsnorm_fp8") if b.name == "vllm-fp8")
    assert "not installed" in vllm.skip_reason((1, 1), torch.bfloat16, DEVICE)


def test_bench_checks_every_backend(tmp_path):
    """On the CPU the bench only checks (status "checked"); on a GPU it also times ("ok")."""
    import json

    from harness.fp8_bench import CASES, main

    out = tmp_path / "fp8.jsonl"
    main(["--preset", "--shape", "16x256", "--backends", "triton-fp8", "eager-fp8",
          "--modes", "fwd", "--out", str(out)])  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["case"] == "provenance" and "torch" in str(rows[0])
    judged = [r for r in rows if r.get("backend") in ("triton-fp8", "eager-fp8")]
    assert len(judged) == 2 * len(CASES)
    assert all(r["status"] in ("checked", "ok") for r in judged), judged
    assert all(r["oracle_passed"] for r in judged), [r["oracle"] for r in judged]


# ---- the kernel as a GPU compiles it (sm_90, without a GPU) ---------------------------------------


def test_kernel_compiles_for_sm90_with_one_conversion_per_two_codes():
    """The interpreter never compiles: compile every scaling, both formats, with and without a
    residual, for sm_90, and check the PTX converts by cvt.rn.satfinite (two codes an
    instruction) and divides correctly rounded, one division a code (plus one a scale)."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": n, "warps": w, "fp8": f, "x": "bf16", "residual": r}
             for s in (0, 1, 2) for f in ("fp8e4nv", "fp8e5") for r in (False, True)
             for n, w in ((4096, 16), (1000, 4))]  # fmt: skip
    for case, found in zip(cases, sm90_compile_fp8.run(cases), strict=True):
        per_thread = next_power_of_2(case["n"]) // (32 * case["warps"])
        key = "cvt e4m3x2" if case["fp8"] == "fp8e4nv" else "cvt e5m2x2"
        assert found[key] == per_thread // 2, (case, found)
        assert found["div.rn"] >= per_thread, (case, found)


def _forward(x, w, scaling, scale=None, fp8_dtype=E4, reciprocal=False):
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    q, s, _rstd, _h = rmsnorm_fp8_forward(x, w, EPS, 0.0, scaling, scale, fp8_dtype,
                                          reciprocal=reciprocal)  # fmt: skip
    return q, (scale if scaling == "per_tensor" else s)


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("shape", [(4, 127), (5, 130), (3, 1000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_reciprocal_scaling_matches_oracle(shape, scaling, fp8):
    """The RECIPROCAL variant (one division a scale, a multiply an element) passes the oracle,
    and its scales are the exact variant's (only the codes may differ, next to ties)."""
    inp = _inputs(shape, seed=shape[1] + 1)
    dt = FP8[fp8]
    scale = _static_scale(inp.x, inp.weight, dt) if scaling == "per_tensor" else None
    q, s = _forward(inp.x, inp.weight, scaling, scale, dt, reciprocal=True)
    _q_exact, s_exact = _forward(inp.x, inp.weight, scaling, scale, dt)
    assert torch.equal(s, s_exact)
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling=scaling, fp8_dtype=dt,
                             static_scale=scale))  # fmt: skip


@pytest.mark.parametrize(
    "static", [1e-40, 0.0, float("inf"), float("nan")], ids=["subnormal", "zero", "inf", "nan"]
)
def test_reciprocal_static_scale_edge_cases_divide_exactly(static):
    """A static scale whose reciprocal is not finite (subnormal, 0, inf, NaN) takes the exact
    division: the same codes as the exact variant, zero rows included (0 / s, not 0 * inf)."""
    inp = _inputs((3, 200))
    x = inp.x.clone()
    x[1] = 0
    scale = torch.tensor([static], dtype=torch.float32, device=x.device)
    q, _ = _forward(x, inp.weight, "per_tensor", scale, reciprocal=True)
    q_exact, _ = _forward(x, inp.weight, "per_tensor", scale)
    assert torch.equal(q.view(torch.uint8), q_exact.view(torch.uint8))


def test_reciprocal_nan_and_zero_rows():
    inp = _inputs((4, 300))
    x = inp.x.clone()
    x[1, 7] = float("nan")
    x[2] = 0
    for scaling in ("per_token", "block"):
        q, s = _forward(x, inp.weight, scaling, reciprocal=True)
        qf = q.float()
        assert torch.isnan(qf[1]).all() and not torch.isnan(qf[[0, 2, 3]]).any()
        assert (qf[2] == 0).all()
        _assert_passes(check_fp8(q, s, x, inp.weight, EPS, scaling=scaling, fp8_dtype=E4))


def test_reciprocal_kernel_divides_once_a_scale_on_sm90():
    """Compiled for sm_90, the RECIPROCAL variant keeps the conversions but divides once a
    scale a thread holds (per token: the row's scale and its reciprocal; per tensor: the
    reciprocal, plus the exact fallback's divisions in its branch; block: per group), where
    the exact variant divides once a code."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 4096, "warps": 16, "fp8": "fp8e4nv", "x": "bf16",
              "residual": False, "reciprocal": r} for s in (0, 1, 2) for r in (False, True)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    per_thread = 4096 // (32 * 16)
    for case, exact, recip in zip(cases[::2], found[::2], found[1::2], strict=True):
        assert recip["cvt e4m3x2"] == exact["cvt e4m3x2"] == per_thread // 2, (case, recip)
        assert exact["div.rn"] >= per_thread, (case, exact)
        if case["scaling"] == 1:  # the non-finite-reciprocal branch keeps the exact division
            assert recip["div.rn"] <= per_thread + 1, (case, recip)
        else:
            assert recip["div.rn"] < per_thread, (case, recip)


def test_leaving_the_clamp_to_the_cast_keeps_its_conversions_and_drops_the_clamp():
    """SATURATE=False, compiled for sm_90: the same saturating conversions (cvt.rn.satfinite,
    one per two codes), and at least two compares and two selects an element fewer (the
    explicit clamp's); the division count is the same."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 4608, "warps": 8, "fp8": f, "x": "bf16", "residual": False,
              "reciprocal": True, "saturate": sat}
             for s in (0, 1, 2) for f in ("fp8e4nv", "fp8e5") for sat in (True, False)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    per_thread = 8192 // (32 * 8)
    for case, clamped, left in zip(cases[::2], found[::2], found[1::2], strict=True):
        key = "cvt e4m3x2" if case["fp8"] == "fp8e4nv" else "cvt e5m2x2"
        assert left[key] == clamped[key] == per_thread // 2, (case, left)
        assert left["div.rn"] == clamped["div.rn"], (case, left)
        assert clamped["setp"] - left["setp"] >= 2 * per_thread, (case, clamped, left)
        assert clamped["selp"] - left["selp"] >= 2 * per_thread, (case, clamped, left)
        assert left["instructions"] < clamped["instructions"], (case, left)


def test_the_clamp_is_left_to_the_cast_only_where_a_compiled_cast_saturates(monkeypatch):
    """clamp_before_cast=None: no clamp where the cast is in the kernel, compiled and on CUDA at
    capability 8.9 or later (cvt.rn.satfinite); a clamp on older GPUs, ROCm, the CPU, the
    interpreter (whose fp8 cast does not saturate) and torch's conversion."""
    from impls.triton_rmsnorm import common, launch
    from impls.triton_rmsnorm.fp8 import clamps_before_cast

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert launch.interpreting()  # the CPU tests' interpreter: always a clamp
    with common.pretend_device(capability=(9, 0)):
        assert clamps_before_cast(None, True, cuda)
    monkeypatch.setattr(launch, "interpreting", lambda: False)  # as a compiled call decides
    for capability, clamps in (((8, 0), True), ((8, 9), False), ((9, 0), False)):
        with common.pretend_device(capability=capability):
            assert clamps_before_cast(None, True, cuda) is clamps, capability
            assert clamps_before_cast(None, False, cuda)  # torch's conversion: a clamp
            assert clamps_before_cast(None, True, cpu)
            assert clamps_before_cast(True, True, cuda) and not clamps_before_cast(
                False, True, cuda
            )
    monkeypatch.setattr(torch.version, "hip", "6.2")
    with common.pretend_device(capability=(9, 0)):
        assert clamps_before_cast(None, True, cuda)


@pytest.mark.parametrize(("name", "value"), [("clamp_before_cast", 1), ("split_tile", 0.0),
                                             ("amax_with_sum", "False"), ("w_as_row", None),
                                             ("narrow_codes", 1)])  # fmt: skip
def test_a_switch_that_is_not_a_bool_names_itself(name, value):
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((2, 256), seed=4)
    with pytest.raises(TypeError, match=f"{name}: expected True"):
        rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, "per_token", None, E4, **{name: value})


@pytest.mark.parametrize("shape", [(3, 640), (2, 2048)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_earlier_per_token_amax_passes_the_oracle_on_the_padded_tile(shape):
    """amax_with_sum=False: the row's amax in a second reduction after y, the padded tile."""
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs(shape, seed=shape[1] + 9)
    q, s, _rstd, _h = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, "per_token", None, E4,
                                          split_tile=False, amax_with_sum=False)  # fmt: skip
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=E4))


def test_leaving_the_clamp_to_the_cast_needs_the_in_kernel_cast():
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((4, 256), seed=3)
    with pytest.raises(ValueError, match="clamp_before_cast=False needs the in-kernel cast"):
        rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, "per_token", None, E4,
                            cast_in_kernel=False, clamp_before_cast=False)  # fmt: skip


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [(3, 640), (2, 1152), (4, 130), (3, 700)],
                         ids=lambda s: f"{s[0]}x{s[1]}")  # fmt: skip
def test_the_split_tile_passes_the_oracle(shape, scaling, residual, fp8):
    """split_tile: a power-of-two tile and a tail (640 = 512 + 128, 1152 = 1024 + 128, 130 =
    128 + 2, 700 = 512 + 256 padded past N) in place of one padded tile; every scaling, both
    formats, with the residual add (h as one tile writes it)."""
    from impls.triton_rmsnorm.fp8 import fp8_tiles, rmsnorm_fp8_forward

    block_n, tail_n = fp8_tiles(shape[1], scaling, split=True)
    if scaling == "block" and shape[1] == 130:
        assert tail_n == 0  # a tail of one whole group would fill the padded tile: not split
    else:
        assert tail_n > 0 and block_n + tail_n < fp8_tiles(shape[1], scaling)[0]
    inp = _inputs(shape, seed=shape[1], residual=residual)
    dt = FP8[fp8]
    scale = _static_scale(inp.x, inp.weight, dt) if scaling == "per_tensor" else None
    r = inp.residual if residual else None
    q, s, _rstd, h = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale, dt, r,
                                         reciprocal=True, split_tile=True)  # fmt: skip
    if residual:
        _q, _s, _rstd1, h_one = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale,
                                                    dt, r, reciprocal=True)  # fmt: skip
        assert torch.equal(h, h_one)
    used = scale if scaling == "per_tensor" else s
    _assert_passes(check_fp8(q, used, inp.x, inp.weight, EPS, scaling=scaling, fp8_dtype=dt,
                             static_scale=scale, normalized=h))  # fmt: skip


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("fused", [False, True], ids=["apart", "amax_with_sum"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_the_split_tile_one_row_a_tile_passes_the_oracle(monkeypatch, scaling, fused, residual):
    """BLOCK_M 1 with a split tile takes a row's sums, rstd and scale as scalars (ROW_SCALARS),
    so that the two tiles meet without a layout conversion: the same results, by the oracle."""
    from impls.triton_rmsnorm import fp8 as fp8_op

    block_n, tail_n = fp8_op.fp8_tiles(640, scaling, split=True)
    monkeypatch.setitem(fp8_op.FP8_LAUNCH_TABLE, (scaling, block_n, 2, tail_n),
                        {"BLOCK_M": 1, "num_warps": 4})  # fmt: skip
    inp = _inputs((3, 640), seed=31, residual=residual)
    scale = _static_scale(inp.x, inp.weight, E4) if scaling == "per_tensor" else None
    r = inp.residual if residual else None
    q, s, _rstd, h = fp8_op.rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale, E4,
                                                r, split_tile=True, amax_with_sum=fused)  # fmt: skip
    used = scale if scaling == "per_tensor" else s
    _assert_passes(check_fp8(q, used, inp.x, inp.weight, EPS, scaling=scaling, fp8_dtype=E4,
                             static_scale=scale, normalized=h))  # fmt: skip


def test_the_split_tile_one_row_a_tile_compiles_without_a_conversion():
    """sm_90, 4608 = 4096 + 512 at 8 warps, w as a row: with a row's values as scalars no tile
    goes through shared memory (the tail's layout differs from the main tile's)."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 4608, "warps": 8, "fp8": "fp8e4nv", "x": "bf16",
              "residual": False, "reciprocal": True, "tail": 512, "w_as_row": True}
             for s in (0, 1, 2)]  # fmt: skip
    for case, found in zip(cases, sm90_compile_fp8.run(cases), strict=True):
        assert found["shared bytes"] <= 1024, (case, found)
        assert found["cvt e4m3x2"] == (4096 + 512) // 256 // 2, (case, found)


@pytest.mark.parametrize("scaling", ["per_token", "block"])
def test_the_split_tile_carries_a_nan_in_the_tail_to_its_whole_row(scaling):
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((3, 640), seed=5)
    x = inp.x.clone()
    x[1, 600] = float("nan")  # in the tail tile (columns 512..639)
    q, s, _rstd, _h = rmsnorm_fp8_forward(x, inp.weight, EPS, 0.0, scaling, None, E4,
                                          reciprocal=True, split_tile=True)  # fmt: skip
    qf = q.float()
    assert torch.isnan(qf[1]).all() and not torch.isnan(qf[[0, 2]]).any()
    # the tail's sum of squares reaches the row's rstd: the whole row is NaN, main tile too
    assert torch.isnan(s[1]).all() and not torch.isnan(s[[0, 2]]).any()


def test_the_split_tile_compiles_for_sm90_with_fewer_conversions_and_instructions():
    """4608 columns at 8 warps: 4096 + 512 in place of 8192, so 18 codes a thread instead of
    32, and fewer PTX instructions, in every scaling."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 4608, "warps": 8, "fp8": "fp8e4nv", "x": "bf16",
              "residual": False, "reciprocal": True, "tail": t}
             for s in (0, 1, 2) for t in (0, 512)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    for case, padded, split in zip(cases[::2], found[::2], found[1::2], strict=True):
        assert padded["cvt e4m3x2"] == 8192 // 256 // 2, (case, padded)
        assert split["cvt e4m3x2"] == (4096 + 512) // 256 // 2, (case, split)
        assert split["instructions"] < padded["instructions"], (case, split, padded)


@pytest.mark.parametrize("fp8", list(FP8), ids=list(FP8))
@pytest.mark.parametrize("split", [False, True], ids=["padded", "split"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [(3, 640), (4, 127), (2, 1000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_amax_in_the_sums_reduction_passes_the_oracle(shape, residual, split, fp8):
    """amax_with_sum (per token): y = (x * w) * rstd and amax = rn(max|x * w| * rstd), which is
    max|y| exactly, in one reduction with the sum."""
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs(shape, seed=shape[1] + 7, residual=residual)
    dt = FP8[fp8]
    r = inp.residual if residual else None
    q, s, _rstd, h = rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, "per_token", None, dt, r,
                                         reciprocal=True, split_tile=split,
                                         amax_with_sum=True)  # fmt: skip
    # the oracle holds each scale to 1 ulp of the fp64 amax / max: a wrong amax fails it
    _assert_passes(check_fp8(q, s, inp.x, inp.weight, EPS, scaling="per_token", fp8_dtype=dt,
                             normalized=h))  # fmt: skip


def test_the_amax_in_the_sums_reduction_keeps_nan_and_zero_rows():
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((4, 640), seed=11)
    x = inp.x.clone()
    x[1, 600] = float("nan")
    x[2] = 0
    q, s, _rstd, _h = rmsnorm_fp8_forward(x, inp.weight, EPS, 0.0, "per_token", None, E4,
                                          reciprocal=True, split_tile=True,
                                          amax_with_sum=True)  # fmt: skip
    qf = q.float()
    assert torch.isnan(qf[1]).all() and torch.isnan(s[1])
    assert (qf[2] == 0).all() and s[2] == FLT_MIN
    assert not torch.isnan(qf[[0, 3]]).any()


def test_the_amax_in_the_sums_reduction_compiles_with_fewer_barriers():
    """Per token, compiled for sm_90: one cross-warp reduction fewer (its barrier), the same
    conversions; with the split tile, 23 barriers -> 7 at 4608 columns, 8 warps."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": 0, "n": n, "warps": 8, "fp8": "fp8e4nv", "x": "bf16", "residual": False,
              "reciprocal": True, "tail": tail, "amax_with_sum": fused}
             for n, tail in ((8192, 0), (4608, 512)) for fused in (False, True)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    for case, apart, fused in zip(cases[::2], found[::2], found[1::2], strict=True):
        assert fused["cvt e4m3x2"] == apart["cvt e4m3x2"], (case, fused)
        assert fused["barriers"] < apart["barriers"], (case, apart, fused)
        assert fused["instructions"] <= apart["instructions"], (case, apart, fused)


def test_w_as_a_row_skips_its_layout_conversion():
    """W_AS_ROW, compiled for sm_90 at 8192 columns, 8 warps: w no longer goes through shared
    memory (8 KB a row before) and its barriers go, in every scaling; the conversions stay."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 8192, "warps": 8, "fp8": "fp8e4nv", "x": "bf16",
              "residual": False, "reciprocal": True, "w_as_row": row}
             for s in (0, 1, 2) for row in (False, True)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    for case, vector, row in zip(cases[::2], found[::2], found[1::2], strict=True):
        assert vector["shared bytes"] >= 8192 > 1024 >= row["shared bytes"], (case, vector, row)
        assert row["barriers"] <= vector["barriers"] - 4, (case, vector, row)
        assert row["cvt e4m3x2"] == vector["cvt e4m3x2"] == 8192 // 256 // 2, (case, row)


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_w_as_a_row_gives_the_same_bits(scaling, residual):
    """The same arithmetic in another layout: outputs bitwise the vector load's (the
    interpreter's fp32 values before the cast, every element)."""
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs((5, 700), seed=21, residual=residual)
    scale = _static_scale(inp.x, inp.weight, E4) if scaling == "per_tensor" else None
    r = inp.residual if residual else None
    outs = [rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 1.0, scaling, scale, E4, r,
                                cast_in_kernel=False, w_as_row=row) for row in (False, True)]  # fmt: skip
    for a, b in zip(*outs, strict=True):
        if a is not None:
            assert torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0))


def test_narrow_code_stores_take_the_residuals_layout_without_a_conversion():
    """With a residual, sm_90: the codes stored 8 a thread share h's 16-bit store layout, so no
    tile goes through shared memory (4-8 KB a row otherwise); as many conversions."""
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": n, "warps": w, "fp8": "fp8e4nv", "x": "bf16", "residual": True,
              "reciprocal": True, "saturate": False, "w_as_row": True, "amax_with_sum": s == 0,
              "narrow_codes": narrow}
             for s in (0, 1, 2) for n, w in ((2048, 4), (8192, 8))
             for narrow in (False, True)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    for case, wide, narrow in zip(cases[::2], found[::2], found[1::2], strict=True):
        assert wide["shared bytes"] >= case["n"] > 256 >= narrow["shared bytes"], (case, wide,
                                                                                       narrow)  # fmt: skip
        assert narrow["barriers"] < wide["barriers"], (case, wide, narrow)
        per_thread = case["n"] // (32 * case["warps"])
        assert narrow["cvt e4m3x2"] == wide["cvt e4m3x2"] == per_thread // 2, (case, narrow)


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [(3, 640), (4, 130), (2, 2048)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_narrow_code_stores_pass_the_oracle(shape, residual, scaling):
    from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward

    inp = _inputs(shape, seed=shape[1] + 13, residual=residual)
    x = inp.x.clone()
    x[0, 5] = float("nan")
    scale = _static_scale(inp.x[1:], inp.weight, E4) if scaling == "per_tensor" else None
    r = inp.residual if residual else None
    q, s, _rstd, h = rmsnorm_fp8_forward(x, inp.weight, EPS, 0.0, scaling, scale, E4, r,
                                         narrow_codes=True)  # fmt: skip
    assert torch.isnan(q[0].float()).all()  # the NaN reaches its row's rstd: the whole row
    rows = slice(1, None)
    used = scale if scaling == "per_tensor" else s[rows]
    _assert_passes(check_fp8(q[rows], used, x[rows], inp.weight, EPS, scaling=scaling,
                             fp8_dtype=E4, static_scale=scale,
                             normalized=None if h is None else h[rows]))  # fmt: skip


def test_looped_kernel_compiles_for_sm90_with_the_single_tiles_conversions():
    """The kernel for rows past the single tile, compiled for sm_90: one conversion per two
    codes of a step (FP8_LOOPED_CHUNK columns over FP8_LOOPED_WARPS warps), the per-token
    reciprocal dividing twice (the row's scale and its reciprocal), per block once a group."""
    from impls.triton_rmsnorm.fp8 import FP8_LOOPED_CHUNK, FP8_LOOPED_WARPS
    from tests import sm90_compile_fp8

    cases = [{"looped": True, "scaling": sc, "warps": FP8_LOOPED_WARPS, "fp8": "fp8e4nv",
              "x": "bf16", "residual": res, "reciprocal": True}
             for sc in (0, 1, 2) for res in (False, True)]  # fmt: skip
    found = sm90_compile_fp8.run(cases)
    per_thread = FP8_LOOPED_CHUNK // (32 * FP8_LOOPED_WARPS)
    for case, got in zip(cases, found, strict=True):
        assert got["cvt e4m3x2"] == per_thread // 2, (case, got)
        if case["scaling"] == 0:
            assert got["div.rn"] == 2, (case, got)
        if case["scaling"] == 2:
            assert got["div.rn"] < per_thread, (case, got)


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "block"])
def test_w_loaded_early_at_small_grids_gives_the_same_bits(pretend_device, monkeypatch, scaling):
    """W_EARLY (at most one program an SM) loads w with x; the codes, scales and rstd are the
    bits of w loaded after the reduction."""
    from impls.triton_rmsnorm import fp8, fp8_kernels

    inp = _inputs((64, 300), residual=True)
    scale = _static_scale(inp.x, inp.weight, E4) if scaling == "per_tensor" else None
    seen, outputs = [], []
    launch_fixed = fp8.launch._launch_fixed

    def spy(kernel, grid, *args, **meta):
        if kernel is fp8_kernels.rmsnorm_fp8_fwd_kernel:
            seen.append(meta["W_EARLY"])
        return launch_fixed(kernel, grid, *args, **meta)

    monkeypatch.setattr(fp8.launch, "_launch_fixed", spy)
    for sms in (1, 64):  # 64 rows: more programs than SMs (one), then not more
        pretend_device(sm_count=sms)
        outputs.append(fp8.rmsnorm_fp8_forward(inp.x, inp.weight, EPS, 0.0, scaling, scale, E4,
                                               residual=inp.residual))  # fmt: skip
    assert seen == [False, True]
    for late, early in zip(*outputs, strict=True):
        if late is not None:
            assert torch.equal(late.view(torch.uint8) if late.dtype == E4 else late,
                               early.view(torch.uint8) if early.dtype == E4 else early)  # fmt: skip


def test_bench_resumes_a_run_cut_short(tmp_path):
    """harness.fp8_bench --resume: the shapes a cut run finished are kept, the one cut mid-way
    is measured again whole, the rest measured with the file's options; options cannot be
    given beside it, and another commit's run is refused."""
    import json

    from harness.fp8_bench import main

    out = tmp_path / "fp8.jsonl"
    argv = ["--preset", "--shape", "16x256", "8x512", "--backends", "triton-fp8",
            "--cases", "per_token", "block", "--modes", "fwd", "--out", str(out)]  # fmt: skip
    main(argv)
    full = [json.loads(line) for line in out.read_text().splitlines()]
    cut = [r for r in full if r.get("shape") != "8x512"]  # the second shape never finished
    cut += [r for r in full if r.get("shape") == "8x512" and r.get("case") == "per_token"]
    # and killed inside a write: its last record in part, without a newline (dropped)
    out.write_text("".join(json.dumps(r) + "\n" for r in cut) + json.dumps(full[-1])[:30])
    assert main(["--resume", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    judged = [(r["shape"], r["case"], r["mode"]) for r in rows if r.get("backend") == "triton-fp8"]
    assert sorted(judged) == sorted(
        (s, c, "fwd") for s in ("16x256", "8x512") for c in ("per_token", "block")
    )  # each once: the cut shape's first case was dropped and measured again
    assert rows[0]["case"] == "provenance" and len(rows[0]["resumed"]) == 1
    assert {r["shape"] for r in rows if r.get("case") == "shape-done"} == {"16x256", "8x512"}
    assert main(["--resume", str(out), "--budget-s", "60"]) == 0  # this call's own budget
    assert [json.loads(line) for line in out.read_text().splitlines()][1:] == rows[1:]
    out.write_text("".join(json.dumps(r) + "\n" for r in cut))  # cut again: a budget of 0
    assert main(["--resume", str(out), "--budget-s=0"]) == 0
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r for r in again if r.get("shape") == "8x512" and r.get("backend") == "all"] == [
        {"backend": "all", "case": "all", "shape": "8x512", "status": "not-run",
         "reason": "time budget (0 s)"}]  # fmt: skip
    with pytest.raises(SystemExit):
        main(["--resume", str(out), "--dtype", "fp16"])
    other = tmp_path / "other.jsonl"
    rows[0]["commit"] = "0123456789ab"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit):
        main(["--resume", str(other)])
