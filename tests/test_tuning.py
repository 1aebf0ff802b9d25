"""The tuner (impls/triton_rmsnorm/tuning.py): it times configurations on copies that must run the
same binary as the real launch, leaves the caller's tensors and RNG alone, times work in
proportion to what a launch does, runs only when asked (dispatch.tuning) and never inside a
CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
import triton
from triton.runtime.errors import OutOfResources

from harness.oracle import TOLERANCES, compare, reference
from impls import get_backend
from impls.triton_rmsnorm import (
    direct,
    dispatch,
    kernel_launch,
    kernels,
    launch,
    replays,
    rmsnorm,
    tuning,
)
from tests.conftest import DEVICE, ON_GPU

OURS = TOLERANCES[get_backend("triton").numerics]


@pytest.fixture
def tuning_session():
    """Runtime tuning on for the test (dispatch.tuning, in memory): each new call class
    measures its paths and tunes its kernels; yields the session's table."""
    with dispatch.tuning() as table:
        yield table


def _misaligned(m, n, dtype=torch.bfloat16, offset=1, row_pad=3):
    base = torch.randn(m, n + offset + row_pad, device=DEVICE, dtype=dtype)
    return base[:, offset : offset + n]


def test_copies_keep_layout_alignment_values_and_aliases():
    x = _misaligned(16, 64)
    w = torch.randn(64, device=DEVICE, dtype=torch.float16)[2:]
    dy = torch.randn(64, device=DEVICE, dtype=torch.bfloat16).expand(16, 64)  # stride 0 rows
    args = (x, w, x, dy, 16, 1e-6, None)
    sets = tuning.rotating_arguments(args, l2_bytes=64 * 1024)
    assert len(sets) > 2 and sets[0] is args
    for copy in sets[1:]:
        cx, cw, alias, cdy, *rest = copy
        assert alias is cx, "an argument passed twice must stay one tensor"
        assert rest == [16, 1e-6, None]
        for got, want in ((cx, x), (cw, w), (cdy, dy)):
            assert got.data_ptr() != want.data_ptr()
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert got.data_ptr() % 16 == want.data_ptr() % 16
            assert torch.equal(got, want)


def test_set_count_follows_the_touched_bytes_the_l2_and_the_caps():
    x = torch.zeros(1024, device=DEVICE, dtype=torch.float32)  # 4 KiB
    assert len(tuning.rotating_arguments((x,), l2_bytes=4096)) == 4  # 3 x L2 exceeded
    assert len(tuning.rotating_arguments((x,), l2_bytes=1 << 30)) == tuning.MAX_SETS
    assert len(tuning.rotating_arguments((x,), l2_bytes=0)) == 1
    # 4 KiB touched in rows 64 KiB apart: sets count the touched bytes, copies stop at the cap
    rows = torch.zeros(16, 4096, device=DEVICE)[:, :64]
    spanned = (15 * 4096 + 64) * 4
    sets = tuning.rotating_arguments((rows,), l2_bytes=4 * spanned)
    assert len(sets) == 1 + tuning.MAX_COPY_L2_MULTIPLE * 4


@pytest.mark.parametrize(
    "kernel_name", [name for name, kernel in launch.KERNELS.items() if kernel.prune is not None]
)
def test_candidates_carry_the_keywords_a_launch_takes(kernel_name):
    """What the tuner tries (CPU-checkable: plain Python) is never empty and sets exactly the
    keywords the untuned launch sets."""
    kernel = getattr(kernels, kernel_name)
    x = torch.empty(4096, 4096)
    values = {"X": x, "W": torch.empty(4096), "M": 4096, "rows_per_program": 32}
    args = tuple(values.get(name, 0) for name in kernel.arg_names)
    block_n = launch.SPLIT_BLOCK_N if "_split_" in kernel_name else 4096
    switches = {
        k: False for k in ("HAS_RESIDUAL", "HAS_DH_OUT", "MAY_WRAP") if k in kernel.arg_names
    }
    candidates = launch._candidates(kernel_name, args, {"BLOCK_N": block_n, **switches})
    assert candidates
    expected = launch._heuristic_config(kernel_name, block_n).keys()
    for config in candidates:
        assert config.keys() == expected


def _forward_candidates(m, n, dtype, residual=False):
    kernel = kernels.rmsnorm_fwd_kernel
    values = {"X": torch.empty(1, dtype=dtype), "M": m}
    args = tuple(values.get(name, 0) for name in kernel.arg_names)
    constexprs = {"BLOCK_N": launch.block_size(n), "HAS_RESIDUAL": residual}
    return launch._candidates("rmsnorm_fwd_kernel", args, constexprs)


def test_forward_persistent_grids_need_a_second_tile_and_fit_the_shared_memory(
    pretend_device, monkeypatch
):
    """The single-tile forward's persistent grids (PROGRAMS_PER_SM > 0) are tried only where a
    program gets more than one tile, and never stage more than PIPELINE_SHARED_BYTES."""
    pretend_device(sm_count=132)
    few = _forward_candidates(132, 4096, torch.bfloat16)  # one tile of a row per SM at most
    assert few and all(c["PROGRAMS_PER_SM"] == 0 for c in few)
    many = _forward_candidates(65536, 4096, torch.bfloat16)
    assert {(c["PROGRAMS_PER_SM"], c["LOOP_STAGES"]) for c in many} == set(
        launch.FORWARD_GRID_CHOICES
    )
    for m, n, dtype, residual, pipelined in (
        (8192, 32768, torch.bfloat16, False, {1, 3, 4}),  # 64 KB tiles: 128 / 192 KB staged
        (8192, 32768, torch.float32, False, {1}),  # 128 KB tiles: 256 KB at 3 stages
        (8192, 32768, torch.bfloat16, True, {1}),  # x and r: 256 KB at 3 stages
    ):
        candidates = _forward_candidates(m, n, dtype, residual)
        assert {c["LOOP_STAGES"] for c in candidates} == pipelined, (n, dtype, residual)
        for c in candidates:
            staged = (c["LOOP_STAGES"] - 1) * c["BLOCK_M"] * launch.block_size(n)
            staged *= torch.finfo(dtype).bits // 8 * (2 if residual else 1)
            assert staged <= launch.PIPELINE_SHARED_BYTES


needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the tuner times CUDA graphs: GPU only")


def _forward_args(m=2048, n=4096):
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    y, rstd = torch.empty_like(x), torch.empty(m, device=DEVICE)
    return launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)


def _run_forward(repeats, launch_args):
    m = launch_args[0].shape[0]
    for _ in range(repeats):
        kernels.rmsnorm_fwd_kernel[(m,)](
            *launch_args, BLOCK_M=1, BLOCK_N=4096, HAS_RESIDUAL=False, PERSISTENT=False,
            LOOP_STAGES=1, num_warps=8,
        )  # fmt: skip


@needs_gpu
def test_every_candidate_is_compiled_before_the_timing_loop():
    """_compile_in_parallel leaves each candidate in Triton's kernel cache, so the timing loop
    compiles nothing: a warm-up of any candidate afterwards adds no entry. fp16 x, fp32 w and
    bf16 y: a specialization no other test compiles."""
    m, n = 4096, 2048
    x = torch.randn(m, n, device=DEVICE, dtype=torch.float16)
    w = torch.randn(n, device=DEVICE, dtype=torch.float32)
    y, rstd = torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16), torch.empty(m, device=DEVICE)
    args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
    constexprs = {"BLOCK_N": n, "HAS_RESIDUAL": False}
    kernel = kernels.rmsnorm_fwd_kernel
    candidates = launch._candidates("rmsnorm_fwd_kernel", args, constexprs)
    assert len(candidates) > 1

    def grid(meta):
        return (launch._tile_programs(m, meta, x.device),)

    launches = [launch._kernel_grid_and_meta("rmsnorm_fwd_kernel", grid, {**constexprs, **c})
                for c in candidates]  # fmt: skip
    cache = kernel.device_caches[x.get_device()][0]
    before = len(cache)
    launch._compile_in_parallel(kernel, args, launches)
    compiled = len(cache)
    assert compiled > before
    assert all(isinstance(k, triton.compiler.CompiledKernel) for k in cache.values())
    for launch_grid, meta in launches:
        assert kernel.warmup(*args, grid=launch_grid, **meta) is not None
    assert len(cache) == compiled


@needs_gpu
def test_the_timer_counts_device_work_and_the_tuner_picks_the_cheaper():
    """Negative control: the same kernel once or four times per launch must time ~4x apart (a
    timer of host time, of one set only, or of nothing would not), and the tuner must pick
    the single launch, whichever order it meets them in. x and y (128 MiB each) are larger than
    the L2, so the repeated launches re-read HBM as the first does (at 2048 rows they ran 2.8x
    the single launch on the H200: the repeats hit the L2)."""
    args = _forward_args(m=16384)
    sets = tuning.rotating_arguments(args, tuning.l2_bytes(0))
    stream = torch.cuda.Stream()
    once = tuning._median_ms(lambda a: _run_forward(1, a), sets, stream)
    four = tuning._median_ms(lambda a: _run_forward(4, a), sets, stream)
    assert 3.0 < four / once < 5.0, (once, four)
    for order in ([4, 1], [1, 4]):
        assert tuning.fastest(order, _run_forward, args) == 1
        assert tuning.fastest(order, _run_forward, args, passes=2) == 1  # as paths are chosen


@needs_gpu
def test_every_argument_set_is_launched_inside_the_capture():
    args = _forward_args(512, 4096)
    sets = tuning.rotating_arguments(args, tuning.l2_bytes(0))
    captured = []

    def launch_and_note(launch_args):
        if torch.cuda.is_current_stream_capturing():
            captured.append(launch_args[0].data_ptr())
        _run_forward(1, launch_args)

    tuning._median_ms(launch_and_note, sets, torch.cuda.Stream())
    assert len(sets) > 1 and captured == [s[0].data_ptr() for s in sets]


def _check_against_oracle(x, w, dy, y, dx, dw):
    ref = reference(x.detach(), w.detach(), 1e-6, dy)
    m, n = x.shape
    for name, got, want, k in (("y", y, ref.y, n), ("dx", dx, ref.dx, n), ("dw", dw, ref.dw, m)):
        report = compare(name, got, want, x.dtype, OURS[name], k)
        assert report.passed, report.summary()


def _tuned_kernels(x, dy) -> set[str]:
    """The kernels a training call's first forward and backward tune: the single tiles, and the
    two-role backward where it is measured beside the single tile."""
    tuned = {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"}
    if launch.backward_takes_two_roles(x.detach(), dy, None):
        tuned.add("rmsnorm_bwd_two_role_kernel")
    return tuned


@needs_gpu
def test_tuning_leaves_inputs_and_rng_alone_and_gives_oracle_results(monkeypatch, tuning_session):
    x = _misaligned(300, 1000).requires_grad_(True)
    w = torch.randn(1000, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(300, 1000, device=DEVICE, dtype=torch.bfloat16)
    saved = [t.detach().clone() for t in (x, w, dy)]
    rng = torch.cuda.get_rng_state()
    y = rmsnorm(x, w)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert {key[0] for key in kernel_launch._TUNED} == _tuned_kernels(x, dy)
    assert torch.equal(torch.cuda.get_rng_state(), rng)
    for got, want in zip((x, w, dy), saved, strict=True):
        assert torch.equal(got.detach(), want)
    _check_against_oracle(x, w, dy, y, dx, dw)


@needs_gpu
def test_tuning_with_a_stride_0_gradient_pending_work_and_a_side_stream(
    monkeypatch, tuning_session
):
    """dy from y.sum(0).backward() has stride-0 rows; x is made by a kernel still queued
    behind a long sleep on the caller's (non-default) stream when the call tunes."""
    stream = torch.cuda.Stream()
    source = torch.randn(257, 768, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(768, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(768, device=DEVICE, dtype=torch.bfloat16)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time before x is written
        x = (source * 2).requires_grad_(True)
        y = rmsnorm(x, w)
        dy = g.expand_as(y)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    torch.cuda.synchronize()
    assert {key[0] for key in kernel_launch._TUNED} == _tuned_kernels(x, dy)
    _check_against_oracle(x, w, dy.contiguous(), y, dx, dw)


@needs_gpu
def test_contiguous_and_strided_rows_share_one_tuning(monkeypatch, tuning_session):
    """The forward's binary depends on whether every row stride is N (ROWS_CONTIGUOUS), its
    best configuration does not: rows strided after contiguous ones of the same shape reuse
    the tuning (no second key), and both match the oracle."""
    w = torch.randn(2048, device=DEVICE, dtype=torch.bfloat16)
    contiguous = torch.randn(512, 2048, device=DEVICE, dtype=torch.bfloat16)
    strided = torch.randn(512, 2048 + 64, device=DEVICE, dtype=torch.bfloat16)[:, :2048]
    with torch.no_grad():
        outputs = [rmsnorm(contiguous, w)]
        keys = set(kernel_launch._TUNED)
        outputs.append(rmsnorm(strided, w))
    assert {key[0] for key in keys} == {"rmsnorm_fwd_kernel"} and set(kernel_launch._TUNED) == keys
    for x, y in zip((contiguous, strided), outputs, strict=True):
        report = compare("y", y, reference(x, w, 1e-6).y, x.dtype, OURS["y"], 2048)
        assert report.passed, report.summary()


@needs_gpu
def test_a_capture_inside_a_tuning_takes_the_heuristic_unremembered(monkeypatch, python_host_path):
    """Nothing tuned yet, a capture inside a tuning session that meets a new shape times
    nothing: the heuristic serves it (its binary compiled by a call before the session, as
    the tests run heuristic-only) and nothing is remembered. The next call outside the capture
    tunes and adds its entry, and a later capture takes the entry and replays bitwise the eager
    result."""
    x = torch.randn(256, 3072, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(3072, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        warm = rmsnorm(x, w)  # heuristic-only outside a session: compiles that binary
    replays.forget()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with dispatch.tuning() as table:
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, stream=stream):
            heuristic = rmsnorm(x, w)
        graph.replay()
        torch.cuda.synchronize()
        assert not kernel_launch._TUNED and len(table) == 0
        assert torch.equal(heuristic, warm)
        with torch.no_grad():
            expected = rmsnorm(x, w)
        assert kernel_launch._TUNED and len(table) == 1 and replays.recorded() == {}
        torch.testing.assert_close(heuristic, expected)
        with torch.no_grad():
            assert torch.equal(rmsnorm(x, w), expected)  # recorded now
        assert replays.recorded()
        graph = torch.cuda.CUDAGraph()
        before = direct.replayed_launches
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.graph(graph, stream=stream):
            captured = rmsnorm(x, w)
        graph.replay()
        torch.cuda.synchronize()
        assert direct.replayed_launches == before + 1 and torch.equal(captured, expected)


def test_the_residual_looped_forward_is_tuned_unpipelined_only():
    """Its second pass reads h written by the first (perf log v8): LOOP_STAGES stays 1 there,
    while the plain looped forward tries 1, 2 and 4."""
    kernel = kernels.rmsnorm_fwd_looped_kernel
    values = {"X": torch.empty(0), "W": torch.empty(0), "M": 4096}
    args = tuple(values.get(name, 0) for name in kernel.arg_names)
    for residual, expected in ((True, {1}), (False, set(launch.NUM_STAGES_CHOICES))):
        constexprs = {"BLOCK_N": launch.WIDE_BLOCK_N, "HAS_RESIDUAL": residual}
        candidates = launch._candidates("rmsnorm_fwd_looped_kernel", args, constexprs)
        assert {c["LOOP_STAGES"] for c in candidates} == expected


@pytest.mark.parametrize(
    "x_dtype, w_dtype, pipelined_wide_chunks",
    [
        (torch.bfloat16, torch.bfloat16, {1, 3, 4}),
        (torch.float32, torch.float32, {1}),
        (torch.bfloat16, torch.float32, {1, 3}),
    ],
    ids=["bf16", "fp32", "bf16-fp32w"],
)
def test_the_looped_forward_stages_only_what_fits_the_shared_memory(
    x_dtype, w_dtype, pipelined_wide_chunks
):
    """LOOP_STAGES - 1 chunks of x and w in flight: fp32 16384-wide chunks at 3 stages asked the
    H200 for 256 KB and failed to launch (a compile spent for nothing), so the prune drops
    them; bf16 ones at 4 stages (192 KB) ran and stay; bf16 x with an fp32 w at 4 stages would
    take 288 KB. 4096-wide chunks fit at every stage count."""
    kernel = kernels.rmsnorm_fwd_looped_kernel
    x, w = torch.empty(1, dtype=x_dtype), torch.empty(1, dtype=w_dtype)
    values = {"X": x, "W": w, "M": 4096}
    args = tuple(values.get(name, 0) for name in kernel.arg_names)
    constexprs = {"BLOCK_N": launch.WIDE_BLOCK_N, "HAS_RESIDUAL": False}
    candidates = launch._candidates("rmsnorm_fwd_looped_kernel", args, constexprs)
    stages_by_chunk = {}
    for c in candidates:
        stages_by_chunk.setdefault(c["BLOCK_N"], set()).add(c["LOOP_STAGES"])
        staged = (c["LOOP_STAGES"] - 1) * c["BLOCK_N"] * (x.element_size() + w.element_size())
        assert staged <= launch.PIPELINE_SHARED_BYTES
    assert stages_by_chunk == {
        launch.WIDE_BLOCK_N: set(launch.NUM_STAGES_CHOICES),
        max(launch.LOOPED_FORWARD_CHUNKS): pipelined_wide_chunks,
    }


class _NoStream:
    def wait_stream(self, stream):
        pass


def _stub_timer(monkeypatch, times: dict, unrunnable=()):
    """tuning's timer replaced (no GPU needed): candidate i's k-th timing is times[i][k], and a
    candidate in `unrunnable` raises as a kernel that cannot compile does. The candidates'
    indices in the order timed are returned (the list fills as fastest runs)."""
    timed = []

    def median_ms(run, arg_sets, stream):
        index = run(arg_sets[0])
        timed.append(index)
        if index in unrunnable:
            raise OutOfResources(1, 0, "shared memory")
        return times[index].pop(0)

    monkeypatch.setattr(tuning, "_median_ms", median_ms)
    monkeypatch.setattr(tuning, "l2_bytes", lambda device_index: 1)
    monkeypatch.setattr(tuning, "rotating_arguments", lambda args, l2: [args])
    monkeypatch.setattr(dispatch, "private_stream", lambda device_index: _NoStream())
    monkeypatch.setattr(torch.cuda, "current_stream", _NoStream)
    return timed


def _fastest_of(candidates, passes):
    return tuning.fastest(candidates, lambda c, args: c, (torch.zeros(1),), passes=passes)


def test_fastest_times_every_other_pass_in_reverse_and_keeps_each_best(monkeypatch):
    """As launch._fastest times paths (PATH_MEASURE_PASSES): a candidate's best time over the
    passes counts, whichever pass it came in (first its second time, then its first)."""
    timed = _stub_timer(monkeypatch, {0: [5.0, 1.0], 1: [2.0, 3.0], 2: [4.0, 4.0]})
    assert _fastest_of([0, 1, 2], passes=2) == 0
    assert timed == [0, 1, 2, 2, 1, 0]
    _stub_timer(monkeypatch, {0: [1.0, 5.0], 1: [2.0, 2.0]})  # the best in the first pass
    assert _fastest_of([0, 1], passes=2) == 0
    timed = _stub_timer(monkeypatch, {0: [5.0], 1: [2.0], 2: [4.0]})
    assert _fastest_of([0, 1, 2], passes=1) == 1 and timed == [0, 1, 2]


def test_fastest_skips_an_unrunnable_candidate_in_later_passes(monkeypatch):
    timed = _stub_timer(monkeypatch, {0: [5.0, 5.0, 5.0], 2: [4.0, 4.0, 4.0]}, unrunnable=(1,))
    assert _fastest_of([0, 1, 2], passes=3) == 2
    assert timed == [0, 1, 2, 2, 0, 0, 2]


def test_times_gives_every_candidates_best_time_and_inf_for_an_unrunnable_one(monkeypatch):
    """tuning.times (what fastest ranks, and the joint re-pick compares across trees): each
    candidate's best time over the passes, inf where it cannot run; one candidate is timed too
    (fastest returns it untimed)."""
    _stub_timer(monkeypatch, {0: [5.0, 1.0], 2: [4.0, 3.0]}, unrunnable=(1,))
    ms = tuning.times([0, 1, 2], lambda c, args: c, (torch.zeros(1),), passes=2)
    assert ms == [1.0, float("inf"), 3.0]
    timed = _stub_timer(monkeypatch, {0: [2.5]})
    assert tuning.times([0], lambda c, args: c, (torch.zeros(1),)) == [2.5] and timed == [0]
    timed = _stub_timer(monkeypatch, {0: [2.5]})
    assert _fastest_of([0], passes=1) == 0 and timed == []


def test_fastest_raises_when_nothing_runs_or_no_pass_is_asked(monkeypatch):
    _stub_timer(monkeypatch, {}, unrunnable=(0, 1))
    with pytest.raises(OutOfResources):
        _fastest_of([0, 1], passes=2)
    with pytest.raises(ValueError, match="passes"):
        _fastest_of([0, 1], passes=0)
