"""Issue 33's pieces on the CPU: the new backends' reasons, the presets and strided views, the
in-place and offset forms through the oracle, the cost columns' logic (with fakes), the ncu
parser and the tables built from it all."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness import cost_tables, costs, ncu_bytes, provenance, shapes
from harness.checks import check_backend
from harness.inputs import make_inputs
from harness.layouts import make_case_inputs, private_copy
from impls import Backend, get_backend

NEW_BACKENDS = {
    # name: (module holding its reason function, the package import that must fail)
    "flashinfer": ("impls.flashinfer", "flashinfer"),
    "flashinfer-cuda": ("impls.flashinfer", "flashinfer"),
    "flashinfer-nopdl": ("impls.flashinfer", "flashinfer"),
    "flashinfer-gemma": ("impls.flashinfer", "flashinfer"),
    "flashinfer-add": ("impls.flashinfer", "flashinfer"),
    "cudnn": ("impls.cudnn_frontend", "cudnn"),
    "fla": ("impls.fla", "fla"),
    "fla-add": ("impls.fla", "fla"),
    "liger-cutedsl": ("impls.liger", "liger_kernel"),
    "transformer-engine": ("impls.not_runnable", "transformer_engine"),
    "vllm": ("impls.not_runnable", "vllm"),
    "sglang": ("impls.not_runnable", "sgl_kernel"),
}


def _clear_reason_caches(backend: Backend) -> None:
    for fn in (backend.unavailable,):
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
    import impls.flashinfer as fi
    import impls.liger as lg

    for f in (fi._unavailable, fi._unavailable_cute, fi._unavailable_cuda, lg._unavailable,
              lg._unavailable_cutedsl):  # fmt: skip
        f.cache_clear()


@pytest.mark.parametrize("name", sorted(NEW_BACKENDS))
def test_new_backend_names_its_missing_package(name, monkeypatch):
    """With a (pretended) Hopper GPU but the package absent, the reason names the package."""
    backend = get_backend(name)
    _, package = NEW_BACKENDS[name]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, key)
    monkeypatch.setitem(sys.modules, package, None)  # import now raises ImportError
    _clear_reason_caches(backend)
    try:
        reason = backend.skip_reason((8, 64), torch.bfloat16, "cuda")
    finally:
        _clear_reason_caches(backend)
    assert reason is not None and reason.startswith("unavailable: ")
    hint = {
        "flashinfer": "flashinfer",
        "cudnn": "cudnn",
        "fla": "fla",
        "liger_kernel": "liger",
        "transformer_engine": "TransformerEngine",
        "vllm": "vLLM",
        "sgl_kernel": "SGLang",
    }
    assert hint[package] in reason


def test_not_runnable_backends_say_how_to_rank_them_and_why_the_h200_runs_lack_them():
    for name in ("transformer-engine", "vllm", "sglang"):
        reason = get_backend(name).unavailable()
        assert reason is not None and "pip install" in reason and "to rank it" in reason
        assert "the committed H200 runs lack it" in reason


def test_cpu_reasons_of_new_backends():
    for name in ("flashinfer", "cudnn", "fla", "liger-cutedsl"):
        assert "no CUDA device" in get_backend(name).unavailable()


def test_unsupported_cases_are_stated():
    cutedsl = get_backend("liger-cutedsl")
    assert "multiple of 8" in cutedsl.unsupported((4, 4095), torch.bfloat16, "cuda")
    assert "32768" in cutedsl.unsupported((4, 65536), torch.bfloat16, "cuda")
    assert cutedsl.unsupported((4, 4096), torch.bfloat16, "cuda") is None
    assert "64 KB" in get_backend("fla").unsupported((4, 65536), torch.bfloat16, "cuda")
    add = get_backend("flashinfer-add")
    assert "[M, N] rows only" in add.unsupported((4, 2, 64), torch.bfloat16, "cuda")
    assert get_backend("flashinfer").unsupported((4, 2, 64), torch.bfloat16, "cuda") is None


def test_flashinfer_rows_differ_only_in_pdl(monkeypatch):
    """flashinfer leaves enable_pdl to FlashInfer (on for Hopper), flashinfer-nopdl turns it off;
    both call the same rmsnorm (a fake flashinfer.norm records the calls)."""
    import types

    calls = []
    fake = types.ModuleType("flashinfer.norm")
    fake.rmsnorm = lambda x, w, eps, **kwargs: calls.append(kwargs) or x
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.norm", fake)
    x = torch.ones(2, 8)
    for name in ("flashinfer", "flashinfer-nopdl"):
        assert get_backend(name).build()(x, torch.ones(8), 1e-6) is x
    assert calls == [{}, {"enable_pdl": False}]


def test_registry_flags_of_the_new_forms():
    assert get_backend("flashinfer-add").in_place and not get_backend("flashinfer-add").has_backward
    assert get_backend("flashinfer-gemma").weight_offset == 1.0
    assert get_backend("fla-add").add_normalizes == "exact_sum"


# ---- presets and strided views ----------------------------------------------------------------


def test_new_presets():
    decode = shapes.PRESETS["decode"][1]
    assert {m for m, _ in decode} <= set(range(1, 257)) and {n for _, n in decode} == {
        2048,
        4096,
        8192,
    }
    qk = shapes.PRESETS["qk-norm"][1]
    assert all(isinstance(v, shapes.HeadView) for v in qk)
    assert {v.head_dim for v in qk} == {64, 128, 256} and len({v.heads for v in qk}) >= 3
    assert len({tuple(v) for v in qk}) == len(qk)  # the tables key cases by (M, N, dtype)
    models = shapes.PRESETS["models"][1]
    assert {n for _, n in models} == set(shapes.MODELS.values())
    assert min(m for m, _ in models) == 1 and max(m for m, _ in models) == 16384
    assert shapes.MODELS["DeepSeek-V3 / R1"] == 7168 and shapes.MODELS["GPT-OSS-120B / 20B"] == 2880


def test_head_view_parses_unpacks_and_differs_from_plain_rows():
    view = shapes.parse_shape("16x32x128/qkv6144")
    assert view == shapes.HeadView(16, 32, 128, 8) and view.packed_width == 6144
    m, n = view
    assert (m, n) == (512, 128) and view != (512, 128)
    assert shapes.resolve([], ["16x32x128/qkv6144", "512x128"]) == [view, (512, 128)]
    assert shapes.shape_label(view) == "16x32x128/qkv6144"
    with pytest.raises(ValueError, match="packed width"):
        shapes.parse_shape("16x32x128/qkv6100")
    with pytest.raises(ValueError, match="heads"):
        shapes.HeadView(16, 0, 128, 8)


def test_head_view_inputs_are_strided_views_with_the_plain_values():
    view = shapes.HeadView(5, 4, 64, 2)
    inputs = make_case_inputs(view, torch.bfloat16, "cpu", seed=3)
    plain = make_inputs(view.dims, torch.bfloat16, "cpu", seed=3)
    assert inputs.x.shape == (5, 4, 64) and inputs.x.stride() == (view.packed_width, 64, 1)
    assert not inputs.x.is_contiguous()
    assert torch.equal(inputs.x, plain.x) and torch.equal(inputs.dy, plain.dy)
    copy = private_copy(inputs.x)
    assert copy.stride() == inputs.x.stride() and copy.data_ptr() != inputs.x.data_ptr()


def test_byte_model_counts_a_views_logical_bytes():
    from harness import traffic

    m, n = shapes.HeadView(16, 32, 128, 8)
    assert traffic.counted_bytes("fwd", m, n, 2) == 2 * 16 * 32 * 128 * 2


# ---- in-place and offset forms through the oracle ----------------------------------------------


def _inplace_add(x, r, w, eps):
    with torch.no_grad():
        h = x.float() + r.float()
        r.copy_(h.to(r.dtype))
        x.copy_((h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype))
    return x, r


def _fake(name, fn, **kw):
    return Backend(name=name, label=name, build=lambda: fn, numerics="fused_fp32",
                   own_backward=False, has_backward=False, **kw)  # fmt: skip


def test_in_place_backend_gets_copies_and_passes():
    backend = _fake("fake-inplace", _inplace_add, op="add_rmsnorm", in_place=True,
                    add_normalizes="exact_sum")  # fmt: skip
    inputs = make_inputs((6, 64), torch.float16, "cpu", seed=5, with_residual=True)
    x0, r0 = inputs.x.clone(), inputs.residual.clone()
    result = check_backend(backend, _inplace_add, inputs)
    assert result.passed, result.summary()
    assert torch.equal(inputs.x, x0) and torch.equal(inputs.residual, r0)


def test_in_place_forward_calls_use_private_buffers():
    from harness.calls import forward_calls

    backend = _fake("fake-inplace", _inplace_add, op="add_rmsnorm", in_place=True)
    inputs = make_inputs((4, 32), torch.float16, "cpu", seed=6, with_residual=True)
    x0 = inputs.x.clone()
    calls, leaves = forward_calls(backend, _inplace_add, [inputs])
    calls[0]()
    assert torch.equal(inputs.x, x0) and not torch.equal(leaves[0][0], x0)
    assert not leaves[0][0].requires_grad  # forward-only: no leaf needs a gradient


def _gemma(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (1 + w.float())).to(
        x.dtype
    )


def test_offset_backend_is_judged_with_its_offset():
    inputs = make_inputs((6, 64), torch.float16, "cpu", seed=7)
    good = _fake("fake-gemma", _gemma, weight_offset=1.0)
    assert check_backend(good, _gemma, inputs).passed
    wrong = _fake("fake-gemma-as-plain", _gemma)  # the same kernel claimed as the plain form
    assert not check_backend(wrong, _gemma, inputs).passed


# ---- cost columns ----------------------------------------------------------------------------


class FakeGpu:
    """A GPU whose sleep ends after `wakes` host clock ticks; the host clock ticks per call."""

    def __init__(self, clock, calls_until_awake):
        self.clock, self.calls_until_awake, self.sleeps, self.deadline = (
            clock,
            calls_until_awake,
            [],
            0,
        )

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.deadline = self.clock.now + self.calls_until_awake(seconds)

    def marker(self):
        gpu = self

        class Marker:
            def query(self):
                return gpu.clock.now >= gpu.deadline

        return Marker()

    def sync(self):
        pass


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_host_us_busy_doubles_the_sleep_until_the_gpu_stays_busy():
    clock = FakeClock()

    def call():
        clock.now += 10e-6  # 10 us of host time per call

    # 32 calls take 320 us; a sleep of s seconds keeps the GPU busy for s / 2 (a slow clock)
    gpu = FakeGpu(clock, lambda s: s / 2)
    got = costs.host_us_busy(call, gpu, calls=32, repeats=3, clock=clock)
    assert got["host_us"] == pytest.approx(10.0)
    assert got["host_us_gpu_caught_up"] == 0
    assert gpu.sleeps[0] == costs.FIRST_SLEEP_S
    # a GPU that always wakes at once: the sample is kept but counted as caught up
    gpu2 = FakeGpu(clock, lambda s: 0.0)
    got2 = costs.host_us_busy(call, gpu2, calls=32, repeats=2, clock=clock, max_doublings=2)
    assert got2["host_us_gpu_caught_up"] == 2 and len(gpu2.sleeps) == 2 * 3


def test_bitwise_diff_counts_elements():
    a = torch.randn(4, 8).to(torch.bfloat16)
    b = a.clone()
    assert costs.bitwise_diff(a, b) == 0
    b[1, 2] = -b[1, 2]
    b[3, 0] = b[3, 0] + 1
    assert costs.bitwise_diff(a, b) == 2
    nan = torch.full((3,), float("nan"))
    assert costs.bitwise_diff(nan, nan.clone()) == 0
    assert costs.bitwise_diff(torch.zeros(2), -torch.zeros(2)) == 2  # +0 and -0 differ in bits


def test_batch_invariance_detects_a_batch_dependent_kernel():
    x = torch.randn(9, 16)

    def invariant(k):
        return x[:k] * 2

    def dependent(k):  # the row's result depends on how many rows came with it
        return x[:k] * 2 + (k == 9) * 1e-3

    assert costs.batch_invariance(invariant, 9) == {"batch_invariant": True, "batch_diff": 0,
                                                    "batch_sizes": [1, 3]}  # fmt: skip
    bad = costs.batch_invariance(dependent, 9)
    assert bad["batch_invariant"] is False and bad["batch_diff"] == 16 + 3 * 16
    assert costs.batch_invariance(invariant, 1)["batch_invariant"] is None


def test_batch_invariance_of_real_backends_on_cpu():
    from harness.costs import _rows_call

    backend = get_backend("eager")
    inputs = make_inputs((7, 64), torch.bfloat16, "cpu", seed=9)
    for mode in ("fwd", "bwd"):
        got = costs.batch_invariance(_rows_call(backend, backend.build(), inputs, mode), 7)
        assert got["batch_invariant"] is True


def _record(y, dx=None, dw=None, seconds=1.0, mem=1024):
    cases = {"fwd": {"first_call_s": seconds, "extra_mem_bytes": mem, "outputs": {"y": y}}}
    if dx is not None:
        cases["bwd"] = {"first_call_s": seconds / 2, "extra_mem_bytes": 0,
                        "outputs": {"dx": dx, "dw": dw}}  # fmt: skip
    return {"import_build_s": 0.5, "cases": {"8x64": cases}}


def test_first_call_columns_from_two_processes():
    y, dx, dw = torch.randn(8, 64), torch.randn(8, 64), torch.randn(64)
    dw2 = dw.clone()
    dw2[:3] += 1
    got = costs.combine_first_calls(
        _record(y, dx, dw, 2.0), _record(y.clone(), dx.clone(), dw2, 0.3)
    )
    fwd, bwd = got[("8x64", "fwd")], got[("8x64", "bwd")]
    assert fwd["first_call_cold_s"] == 2.0 and fwd["first_call_warm_s"] == 0.3
    assert fwd["deterministic"] is True and fwd["first_extra_mem_bytes"] == 1024
    assert bwd["deterministic"] is False and bwd["determinism_diff"] == {"dx": 0, "dw": 3}


def test_first_call_runs_cold_then_warm_in_one_cache_folder(tmp_path):
    seen = []

    def runner(argv, env, timeout):
        out = Path(argv[argv.index("--out") + 1])
        seen.append({k: env[k] for k in costs.CACHE_VARIABLES})
        torch.save(_record(torch.ones(8, 64), seconds=3.0 if len(seen) == 1 else 0.2), out)
        import subprocess

        return subprocess.CompletedProcess(argv, 0, "", "")

    got = costs.first_call_costs("eager", [(8, 64)], "bf16", runner=runner)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert all("rmsnorm-first-call-" in v for v in seen[0].values())
    assert got[("8x64", "fwd")]["first_call_cold_s"] == 3.0
    assert got[("8x64", "fwd")]["first_call_warm_s"] == 0.2


def test_first_call_reports_a_failing_worker():
    import subprocess

    def runner(argv, env, timeout):
        return subprocess.CompletedProcess(argv, 1, "", "Traceback...\nRuntimeError: boom")

    got = costs.first_call_costs("eager", [(8, 64)], "bf16", runner=runner)
    assert "cold worker exited 1: RuntimeError: boom" in got[("8x64", "fwd")]["first_call_error"]


def _cost_row(backend, shape, host, inv, diff, det=None, cold=None):
    return {"backend": backend, "op": "rmsnorm", "mode": "fwd", "timing": "device",
            "shape": shape, "dtype": "bf16", "host_us": host, "batch_invariant": inv,
            "batch_diff": diff, "deterministic": det, "determinism_diff": {"y": 0 if det else 5},
            "first_call_cold_s": cold, "first_call_warm_s": cold and cold / 10}  # fmt: skip


def test_costs_table():
    rows = [_cost_row("a", "8x64", 5.0, True, 0, True, 2.0), _cost_row("a", "9x64", 7.0, True, 0),
            _cost_row("b", "8x64", 3.0, False, 12, False, 0.5)]  # fmt: skip
    assert cost_tables.has_costs(rows, "rmsnorm", "fwd")
    assert not cost_tables.has_costs(rows, "rmsnorm", "bwd")
    entries = {e["backend"]: e for e in cost_tables.cost_entries(rows, "rmsnorm", "fwd")}
    assert entries["a"]["host_us"] == 6.0 and entries["a"]["batch"] == "yes (2 cases)"
    assert entries["b"]["batch"] == "no (12 elements differ in 1 of 1 cases)"
    assert entries["b"]["deterministic"].startswith("no (5 elements")
    assert entries["a"]["first_cold_s"] == 2.0 and entries["a"]["first_warm_s"] == pytest.approx(
        0.2
    )
    text = cost_tables.costs_table(rows, "rmsnorm", "fwd")
    assert "host us/call" in text and text.index("| b ") < text.index("| a ")


# ---- ncu byte check and provenance -----------------------------------------------------------


def test_ncu_csv_parsing_sums_the_kernels_of_each_call():
    text = (Path(__file__).parent / "data" / "ncu_sample.csv").read_text()
    got = ncu_bytes.parse_csv(text)
    assert got[0] == {"read": 33_619_968.0, "write": 33_554_432.0, "kernels": 1}
    assert got[1]["kernels"] == 2
    assert got[1]["read"] == pytest.approx(67_174_400 + 540_670)
    assert got[1]["write"] == 33_554_432 + 8_192
    with pytest.raises(ValueError, match="no CSV header"):
        ncu_bytes.parse_csv("==PROF== nothing profiled\n")


def test_ncu_records_put_dram_beside_the_model():
    plan = ncu_bytes.plan("x", ["4096x4096"], ["fwd", "bwd"])
    measured = {0: {"read": 33_619_968.0, "write": 33_554_432.0, "kernels": 1}}
    recs = ncu_bytes.records(plan, measured, "bf16", "rmsnorm", {})
    assert recs[0]["model_bytes"] == 2 * 4096 * 4096 * 2
    assert recs[0]["ratio"] == pytest.approx((33_619_968 + 33_554_432) / (2 * 4096 * 4096 * 2))
    assert recs[1]["error"] == "no kernel profiled for this call"
    # reads are the check (x once: 32 MiB); writes are what reached DRAM while the call ran
    assert recs[0]["model_read_bytes"] == recs[0]["model_write_bytes"] == 4096 * 4096 * 2
    assert recs[0]["read_ratio"] == pytest.approx(33_619_968 / (4096 * 4096 * 2))
    assert (recs[1]["model_read_bytes"], recs[1]["model_write_bytes"]) == (
        2 * 4096 * 4096 * 2, 4096 * 4096 * 2)  # fmt: skip
    reads_and_writes = ["33.62", "33.55", "1.00", "33.55", "33.55", "1.00"]
    assert cost_tables.ncu_rows(recs)[0][5:11] == reads_and_writes
    assert "read / model" in cost_tables.ncu_table(recs)
    cmd = ncu_bytes.ncu_command("ncu", ["python3", "-m", "x"])
    assert "dram__bytes_read.sum,dram__bytes_write.sum" in cmd and "--profile-from-start" in cmd


def test_add_backends_skip_the_head_views_everywhere():
    """The qk-norm views have no residual add: compare and the ncu check skip add backends
    there with one reason (layouts.case_skip_reason), and run them on rows."""
    from harness.layouts import case_skip_reason
    from impls import get_backend

    view = shapes.parse_shape("4096x32x128/qkv6144")
    add, plain = get_backend("triton-add"), get_backend("triton")
    assert "no residual add" in case_skip_reason(add, view, torch.bfloat16, "cpu")
    assert case_skip_reason(plain, view, torch.bfloat16, "cpu") is None
    assert case_skip_reason(add, (64, 512), torch.bfloat16, "cpu") is None


def test_route_of_names_what_f_rms_norm_ran():
    assert provenance.route_of(["void cutlass_kernel_RMSNorm_fwd"]).startswith("CuTe DSL")
    assert provenance.route_of(["void at::native::vectorized_layer_norm_kernel"]) == (
        "aten fused CUDA kernels"
    )
    assert provenance.route_of(["elementwise_kernel", "reduce_kernel"]).startswith("composite")
    assert provenance.route_of([]) == "no CUDA kernel seen"


# ---- on the GPU (skipped without CUDA) ---------------------------------------------------------

_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
_GPU_CASES = [(64, 4096), (3, 2880), shapes.HeadView(8, 32, 128, 8)]


@_GPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", _GPU_CASES, ids=shapes.shape_label)
@pytest.mark.parametrize("name", sorted(set(NEW_BACKENDS) | {"flashinfer-cuda-add",
                                                              "liger-cutedsl-add"}))  # fmt: skip
def test_new_backend_passes_the_oracle_on_gpu(name, shape, dtype):
    from harness.layouts import case_dims

    backend = get_backend(name)
    reason = backend.skip_reason(case_dims(shape), dtype, "cuda")
    if reason is None and backend.op == "add_rmsnorm" and isinstance(shape, shapes.HeadView):
        reason = "no residual add on qk-norm views"
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    inputs = make_case_inputs(
        shape, dtype, "cuda", seed=11, with_residual=backend.op == "add_rmsnorm"
    )
    x0 = inputs.x.clone()
    result = check_backend(backend, backend.build(), inputs)
    assert result.passed, result.summary()
    assert torch.equal(inputs.x, x0)  # in-place backends worked on copies


@_GPU
def test_host_us_and_first_call_on_gpu():
    from harness.calls import forward_calls

    backend = get_backend("eager")
    inputs = make_inputs((16, 4096), torch.bfloat16, "cuda", seed=12)
    calls, _ = forward_calls(backend, backend.build(), [inputs])
    got = costs.host_us_busy(calls[0])
    assert got["host_us"] > 0 and got["host_us_gpu_caught_up"] == 0
    first = costs.first_call_costs("eager", [(16, 4096)], "bf16")
    fwd = first[("16x4096", "fwd")]
    assert "first_call_error" not in fwd, fwd
    assert fwd["first_call_cold_s"] > 0 and fwd["deterministic"] is True


def test_first_calls_run_once_per_backend_and_dtype_for_the_wanted_cases(monkeypatch):
    from harness import run

    seen = []

    def fake(name, cases, dtype):
        seen.append((name, [shapes.shape_label(c) for c in cases], dtype))
        return {(shapes.shape_label(c), m): {"first_call_cold_s": 1.0} for c in cases
                for m in ("fwd", "bwd")}  # fmt: skip

    monkeypatch.setattr(run, "_on_cuda", lambda: True)
    monkeypatch.setattr(costs, "first_call_costs", fake)
    eager = get_backend("eager")
    config = run.RunConfig(backends=[eager], shapes=[(8, 64), (9, 64)], dtypes=[torch.bfloat16],
                           costs=["first_call"], first_call_shapes=[(9, 64), (1, 1)])  # fmt: skip
    first = run._FirstCalls(config, progress=lambda msg: None)
    assert first.columns(eager, torch.bfloat16, "8x64", "fwd") == {}
    assert seen == []  # not at the backend's first case: at the first case named (9x64)
    assert first.columns(eager, torch.bfloat16, "9x64", "bwd") == {"first_call_cold_s": 1.0}
    assert seen == [("eager", ["9x64"], "bf16")]  # once, and (1, 1) is not a case of the run
    off = run._FirstCalls(run.RunConfig(backends=[eager], shapes=[(8, 64)], dtypes=[torch.bfloat16]),
                          progress=lambda msg: None)  # fmt: skip
    assert off.columns(eager, torch.bfloat16, "8x64", "fwd") == {} and len(seen) == 1


def test_a_resumed_run_measures_first_calls_only_for_the_cases_it_still_measures(monkeypatch):
    """A run cut after the named case 8x64 and resumed: its kept rows carry their columns, so the
    fresh processes cover 9x64 alone (the H200's models run at 93acdef366da, cut and resumed,
    paid every backend's two processes again before reaching the one case named)."""
    from harness import run

    seen = []

    def fake(name, cases, dtype):
        seen.append([shapes.shape_label(c) for c in cases])
        return {(shapes.shape_label(c), m): {"first_call_cold_s": 2.0} for c in cases
                for m in ("fwd", "bwd")}  # fmt: skip

    monkeypatch.setattr(run, "_on_cuda", lambda: True)
    monkeypatch.setattr(costs, "first_call_costs", fake)
    eager = get_backend("eager")
    config = run.RunConfig(backends=[eager], shapes=[(8, 64), (9, 64)], dtypes=[torch.bfloat16],
                           costs=["first_call"], done_cases=frozenset({("8x64", "bf16")}))  # fmt: skip
    first = run._FirstCalls(config, progress=lambda msg: None)
    assert first.columns(eager, torch.bfloat16, "9x64", "fwd") == {"first_call_cold_s": 2.0}
    assert seen == [["9x64"]]
