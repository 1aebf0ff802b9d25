"""Our RMSNorm where one process drives several GPUs, and beside other streams' work.

The kernel keeps per-device state (SM counts, tuned configurations, compiled kernels, replays):
each test here calls it with x on a GPU that is not the current one, or on a side stream, and
checks the bits against the same call made on cuda:0 alone (itself checked against the fp32
oracle). Every path of impls/triton_rmsnorm/launch.py is forced in turn (PATH_CASES; through
the public kernel-test override, dispatch.override(offered_only=False): conftest's
force_paths), after checking that the launch offers it for that shape on this GPU.

What needs what:
- two GPUs (skipped with the count found otherwise): test_every_path_on_two_gpus_in_turn,
  the cuda:1 cases of test_a_graph_captured_on_a_gpu, test_no_wait_on_another_streams_kernels
  and test_tuned_first_call_with_another_gpu_current;
- one GPU: test_every_path_on_one_gpu_and_a_side_stream and the cuda:0 cases of the others;
- the held-row and grouped paths also need a Hopper-class GPU with Gluon (else skipped by
  the launch's own offer, with the reason).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch

from harness.checks import poison_free_memory
from harness.inputs import make_inputs
from harness.oracle import compare, reference
from impls.triton_rmsnorm import dispatch, launch, rmsnorm
from tests.cases import DTYPE_NAMES
from tests.test_triton_features import TOL

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; none here")
needs_two_gpus = pytest.mark.skipif(
    GPUS < 2,
    reason=f"needs 2 CUDA GPUs in one process (the nvidia-h200-x2 machine); this one has {GPUS}",
)
#: A GPU index parameter: cuda:0 runs on one GPU, cuda:1 needs two.
ON_EACH_GPU = pytest.mark.parametrize(
    "index", [pytest.param(0, id="cuda0"), pytest.param(1, id="cuda1", marks=needs_two_gpus)]
)

#: ~0.1 s of spinning at the H200's ~2 GHz: queued ahead of an input's copy on the stream the
#: call must use, so that a kernel launched on any other stream reads the poisoned input.
ORDERING_SLEEP_CYCLES = 2 * 10**8
#: ~1 s: another stream's work that a call must not wait for (the call takes microseconds).
OTHER_STREAM_SLEEP_CYCLES = 2 * 10**9


# ---- the paths --------------------------------------------------------------------------

#: The launch's path objects by name (looked up at call time: test-time patches stay visible).
FORWARDS = {
    "single tile": lambda: launch._forward_single_tile,
    "looped": lambda: launch._forward_looped,
    "split": lambda: launch._forward_split,
    "held row": lambda: launch._forward_held_row,
    "group, 4096-column slices": lambda: launch._held_group_forward_path(
        launch.HELD_GROUP_FORWARDS[0]
    ),
    "group, 8192-column slices": lambda: launch._held_group_forward_path(
        launch.HELD_GROUP_FORWARDS[1]
    ),
}
BACKWARDS = {
    "single tile": lambda: launch._backward_single_tile,
    "two-role": lambda: launch._backward_two_role,
    "two-step": lambda: launch._backward_wide,
    "held row, 16 warps": lambda: launch._HELD_ROW_BACKWARDS[0],
    "held row, 32 warps": lambda: launch._HELD_ROW_BACKWARDS[1],
    "group, 8192-column slices": lambda: launch._held_group_backward_path(
        launch.HELD_GROUP_BACKWARDS[0]
    ),
    "group, 16384-column slices": lambda: launch._held_group_backward_path(
        launch.HELD_GROUP_BACKWARDS[1]
    ),
}


@dataclass(frozen=True)
class PathCase:
    """A shape whose launch offers `forward` and `backward` (each forced alone), and kernels
    that the call must then launch (as take_launch_configs names them)."""

    name: str
    shape: tuple[int, int]
    dtype: torch.dtype
    forward: str
    backward: str
    kernels: tuple[str, ...] = ()


PATH_CASES = (
    # N <= 16384: the single tile both ways (calls after the first replay their launches)
    PathCase("single-tile", (512, 4096), torch.bfloat16, "single tile", "single tile"),
    PathCase("single-tile-odd", (203, 4095), torch.float16, "single tile", "single tile"),
    PathCase("two-role", (1024, 4096), torch.bfloat16, "single tile", "two-role",
             ("rmsnorm_bwd_two_role_kernel",)),
    # 16385-65536: the looped forward (x read twice), the two-step backward
    PathCase("looped-two-step", (300, 24576), torch.bfloat16, "looped", "two-step",
             ("rmsnorm_fwd_looped_kernel", "rmsnorm_bwd_row_dot_kernel",
              "rmsnorm_bwd_columns_kernel")),
    # fewer rows than SMs past 65536: rows split across programs both ways
    PathCase("split", (8, 131072), torch.bfloat16, "split", "two-step",
             ("rmsnorm_fwd_split_sumsq_kernel", "rmsnorm_fwd_split_scale_kernel",
              "rmsnorm_bwd_split_dot_kernel", "rmsnorm_bwd_columns_kernel")),
    # the held rows (Gluon): the forward's at 65537-131072, the backward's at 16385-32768
    PathCase("held-row-forward", (200, 131072), torch.bfloat16, "held row", "two-step",
             ("rmsnorm_fwd_held_row_kernel",)),
    PathCase("held-row-backward-16w", (300, 32768), torch.bfloat16, "single tile",
             "held row, 16 warps", ("rmsnorm_bwd_held_row_kernel",)),
    PathCase("held-row-backward-32w", (1001, 20480), torch.float16, "single tile",
             "held row, 32 warps", ("rmsnorm_bwd_held_row_kernel",)),
    # the groups (Gluon, cooperative launches exchanging through global memory)
    PathCase("group-4096-8192", (64, 131072), torch.bfloat16, "group, 4096-column slices",
             "group, 8192-column slices",
             ("rmsnorm_fwd_held_group_kernel", "rmsnorm_bwd_held_group_kernel")),
    PathCase("group-8192-16384", (40, 262144), torch.float16, "group, 8192-column slices",
             "group, 16384-column slices",
             ("rmsnorm_fwd_held_group_kernel", "rmsnorm_bwd_held_group_kernel")),
    PathCase("group-backward-32768", (256, 32768), torch.bfloat16, "single tile",
             "group, 8192-column slices", ("rmsnorm_bwd_held_group_kernel",)),
)  # fmt: skip
CASES = {case.name: case for case in PATH_CASES}


def _case_param(case: PathCase):
    return pytest.param(case, id=f"{case.name}-{DTYPE_NAMES[case.dtype]}-{case.shape[0]}x"
                                 f"{case.shape[1]}")  # fmt: skip


def _offered_or_skip(case: PathCase, x, w, dy) -> None:
    """Skip unless the launch itself offers both paths for these tensors on their GPU (the
    lists rmsnorm_forward and _backward_launches assemble, before any forcing)."""
    m, n = x.shape
    y = torch.empty_like(x)
    forwards = list(launch._forward_paths(m, n, x.device))
    if launch.forward_holds_row_on_chip(x, y, False):
        forwards.append(launch._forward_held_row)
    forwards += map(launch._held_group_forward_path, launch.held_group_forwards(x, y, w, False))
    if FORWARDS[case.forward]() not in forwards:
        pytest.skip(f"the launch does not offer the {case.forward} forward for {case.shape} "
                    f"{DTYPE_NAMES[case.dtype]} on {torch.cuda.get_device_name(x.device)}")  # fmt: skip
    if BACKWARDS[case.backward]() not in launch.backward_paths(x, dy, w, None):
        pytest.skip(f"the launch does not offer the {case.backward} backward for {case.shape} "
                    f"{DTYPE_NAMES[case.dtype]} on {torch.cuda.get_device_name(x.device)}")  # fmt: skip


def _force(force_paths, case: PathCase) -> None:
    """The case's forward and backward every call's only paths (offered: _offered_or_skip)."""
    force_paths(forward=dispatch.path_name(FORWARDS[case.forward]()),
                backward=dispatch.path_name(BACKWARDS[case.backward]()))  # fmt: skip


# ---- one call and its placement ---------------------------------------------------------


@contextlib.contextmanager
def _placed(index: int, current: int, side: bool):
    """cuda:`current` the current device; cuda:`index`'s current stream a new side stream if
    `side`. Yields the stream of cuda:index that the call's kernels must go to."""
    if not side:
        with torch.cuda.device(current):
            yield torch.cuda.current_stream(index)
        return
    stream = torch.cuda.Stream(device=index)
    stream.wait_stream(torch.cuda.current_stream(index))
    # torch.cuda.stream makes the stream's device current too; the inner context switches the
    # current device back to `current`, leaving cuda:index's current stream the side stream.
    with torch.cuda.stream(stream), torch.cuda.device(current):
        yield stream


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_same_bits(name: str, got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (name, where)
    differ = _bits(got) != _bits(want)
    if differ.any():
        first = differ.nonzero()[:3].tolist()
        raise AssertionError(
            f"{name} {where}: {int(differ.sum())} of {differ.numel()} elements differ in their "
            f"bits from the call on cuda:0 alone (first at {first})"
        )


def _call(inputs, index: int, current: int, side: bool) -> dict[str, torch.Tensor]:
    """Forward and backward of inputs (CPU tensors) on cuda:index with cuda:current current,
    on a side stream of cuda:index if `side`: through the launch directly (the backward too
    with cuda:current current), then through autograd. The inputs reach the device on the
    call's stream behind ORDERING_SLEEP_CYCLES, over copies filled with NaN: a kernel on any
    other stream would read NaN. Returns the results on the CPU."""
    device = torch.device("cuda", index)
    sources = [t.to(device) for t in (inputs.x, inputs.weight, inputs.dy)]
    x, w, dy = (torch.full_like(t, float("nan")) for t in sources)
    torch.cuda.synchronize(device)
    with _placed(index, current, side) as stream:
        with torch.cuda.device(index):  # cuda:index's current stream is `stream` here
            poison_free_memory(device, 4 * x.numel() * x.element_size())
            torch.cuda._sleep(ORDERING_SLEEP_CYCLES)
            for target, source in zip((x, w, dy), sources, strict=True):
                target.copy_(source)
        assert torch.cuda.current_device() == current
        y, rstd, _ = launch.rmsnorm_forward(x, w, inputs.eps)
        dx, dw = launch.rmsnorm_backward(dy, x, w, rstd)
        x_leaf, w_leaf = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        y_autograd = rmsnorm(x_leaf, w_leaf, inputs.eps)
        y_autograd.backward(dy)
        assert torch.cuda.current_device() == current
        assert torch.cuda.current_stream(index) == stream
        stream.synchronize()
    out = {"y": y, "rstd": rstd, "dx": dx, "dw": dw, "y (autograd)": y_autograd,
           "dx (autograd)": x_leaf.grad, "dw (autograd)": w_leaf.grad}  # fmt: skip
    for name, t in out.items():
        assert t.device == device, f"{name} is on {t.device}, x on {device}"
    return {name: t.detach().cpu() for name, t in out.items()}


def _assert_matches_oracle(inputs, got: dict) -> None:
    x, w, dy = inputs.x.float(), inputs.weight.float(), inputs.dy.float()
    ref = reference(x, w, inputs.eps, dy)
    m, n = inputs.x.shape
    for name, k in (("y", n), ("dx", n), ("dw", m)):
        report = compare(name, got[name], getattr(ref, name), inputs.x.dtype, TOL[name], k)
        assert report.passed, report.summary()


def _run_sequence(force_paths, case: PathCase, calls) -> None:
    """The first call, on cuda:0 with nothing else before it, is the reference (checked
    against the oracle); each later call's results must have its bits."""
    inputs = make_inputs(case.shape, case.dtype, "cpu", seed=35)
    probe = [t.to("cuda:0") for t in (inputs.x, inputs.weight, inputs.dy)]
    _offered_or_skip(case, *probe)
    del probe
    _force(force_paths, case)
    launch.take_launch_configs()
    want = _call(inputs, 0, 0, False)
    _assert_matches_oracle(inputs, want)
    launched = launch.take_launch_configs()
    assert all(k in launched for k in case.kernels), (case.kernels, sorted(launched))
    for name in ("y", "dx", "dw"):
        _assert_same_bits(f"{name} (autograd)", want[f"{name} (autograd)"], want[name], "cuda:0")
    for index, current, side in calls:
        got = _call(inputs, index, current, side)
        where = f"on cuda:{index}, cuda:{current} current, {'a side' if side else 'the'} stream"
        for name, tensor in got.items():
            _assert_same_bits(name, tensor, want[name.split(" ")[0]], where)
        launched = launch.take_launch_configs()
        assert all(k in launched for k in case.kernels), (where, case.kernels, sorted(launched))


# ---- the tests --------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("case", [_case_param(c) for c in PATH_CASES])
def test_every_path_on_one_gpu_and_a_side_stream(force_paths, case):
    """One GPU: each path on cuda:0's default stream, on a side stream (its kernels must go
    there: the ordering check), and again on the default stream (replays where recorded),
    each bitwise the first call's."""
    _run_sequence(force_paths, case, [(0, 0, True), (0, 0, False), (0, 0, True)])


#: (x's GPU, the current GPU, a side stream) for each call after the reference on cuda:0.
TWO_GPU_CALLS = (
    (1, 0, False),  # x on cuda:1 while cuda:0 is current
    (0, 0, False),  # back on cuda:0 (its replays, if recorded, are still its own)
    (1, 0, True),  # cuda:1's side stream while cuda:0 is current
    (1, 1, False),  # cuda:1 current (replays recorded for cuda:1 now serve)
    (0, 1, True),  # cuda:0's side stream while cuda:1 is current
    (1, 1, True),
    (0, 0, False),
)


@needs_two_gpus
@pytest.mark.parametrize("case", [_case_param(c) for c in PATH_CASES])
def test_every_path_on_two_gpus_in_turn(force_paths, case):
    """Two GPUs: each path's forward and backward on cuda:0 and cuda:1 in turn from one
    process, each GPU current or not, default and side streams: every result bitwise the call
    on cuda:0 alone."""
    _run_sequence(force_paths, case, TWO_GPU_CALLS)


def _graph_case_params():
    return [_case_param(CASES[name]) for name in ("single-tile", "split", "group-4096-8192")]


@needs_gpu
@ON_EACH_GPU
@pytest.mark.parametrize("case", _graph_case_params())
def test_a_graph_captured_on_a_gpu(force_paths, index, case):
    """Forward and backward captured in one CUDA graph on cuda:index (after a warm call, as
    the README requires), replayed with cuda:0 current on new values copied into the captured
    inputs: bitwise the same call made eagerly on cuda:0."""
    device = torch.device("cuda", index)
    first = make_inputs(case.shape, case.dtype, "cpu", seed=1)
    x, w, dy = (t.to(device) for t in (first.x, first.weight, first.dy))
    _offered_or_skip(case, x, w, dy)
    _force(force_paths, case)
    with torch.cuda.device(index):
        y, rstd, _ = launch.rmsnorm_forward(x, w, first.eps)  # compiles, records replays
        launch.rmsnorm_backward(dy, x, w, rstd)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph's default capture stream is made once, on the device current then:
        # a stream of cuda:index, given explicitly.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device=index)):
            y, rstd, _ = launch.rmsnorm_forward(x, w, first.eps)
            dx, dw = launch.rmsnorm_backward(dy, x, w, rstd)
    for seed in (2, 3):
        draw = make_inputs(case.shape, case.dtype, "cpu", seed=seed)
        with torch.cuda.device(index):
            for target, source in zip((x, w, dy), (draw.x, draw.weight, draw.dy), strict=True):
                target.copy_(source)
        with torch.cuda.device(0):
            graph.replay()
        torch.cuda.synchronize(device)
        want = _call(draw, 0, 0, False)
        for name, got in (("y", y), ("rstd", rstd), ("dx", dx), ("dw", dw)):
            _assert_same_bits(name, got, want[name], f"replayed from a graph on cuda:{index}")


@needs_gpu
@ON_EACH_GPU
@pytest.mark.parametrize(
    "case", [_case_param(CASES[n]) for n in ("single-tile", "group-4096-8192")]
)
def test_no_wait_on_another_streams_kernels(force_paths, index, case):
    """A warm call on cuda:index (cuda:0 current) while another stream of that GPU runs a long
    kernel: the call's kernels finish first, so the call made its stream wait for nothing it
    did not launch. (An ordering check: the other stream's OTHER_STREAM_SLEEP_CYCLES, ~1 s,
    against a call of microseconds.)"""
    device = torch.device("cuda", index)
    inputs = make_inputs(case.shape, case.dtype, "cpu", seed=4)
    x, w, dy = (t.to(device) for t in (inputs.x, inputs.weight, inputs.dy))
    _offered_or_skip(case, x, w, dy)
    _force(force_paths, case)
    with torch.cuda.device(0):
        y, rstd, _ = launch.rmsnorm_forward(x, w, inputs.eps)  # warm: compiled, replays recorded
        launch.rmsnorm_backward(dy, x, w, rstd)
        torch.cuda.synchronize(device)
        other = torch.cuda.Stream(device=index)
        with torch.cuda.stream(other):
            torch.cuda._sleep(OTHER_STREAM_SLEEP_CYCLES)
            other_done = torch.cuda.Event()
            other_done.record(other)
        y, rstd, _ = launch.rmsnorm_forward(x, w, inputs.eps)
        dx, dw = launch.rmsnorm_backward(dy, x, w, rstd)
        with torch.cuda.device(index):
            done = torch.cuda.Event()
            done.record()
        done.synchronize()
        waited = other_done.query()
        other.synchronize()
    assert not waited, "the call's kernels finished only after another stream's kernel"
    _assert_matches_oracle(inputs, {"y": y.cpu(), "dx": dx.cpu(), "dw": dw.cpu()})


@needs_gpu
@ON_EACH_GPU
def test_tuned_first_call_with_another_gpu_current(monkeypatch, tmp_path, index):
    """Opt-in runtime tuning (dispatch.tuning) of a first call at 256x32768 bf16 whose x is on
    cuda:index while cuda:0 is current (cuda:0: on a side stream): it measures the paths and
    tunes their kernels on x's GPU (its private stream made there), stays within the oracle's
    bounds and records the forward's and the backward's entries; a second call gives the same
    bits."""
    made_on = []
    make = dispatch.private_stream
    monkeypatch.setattr(dispatch, "private_stream", lambda i: made_on.append(i) or make(i))
    inputs = make_inputs((256, 32768), torch.bfloat16, "cpu", seed=5)
    with dispatch.tuning(tmp_path / "tuned.json") as table:
        results = [_call(inputs, index, 0, index == 0) for _ in range(2)]
    _assert_matches_oracle(inputs, results[0])
    for name, tensor in results[1].items():
        _assert_same_bits(name, tensor, results[0][name], f"second tuned call on cuda:{index}")
    assert made_on and set(made_on) == {index}, made_on
    assert {e.key.direction for e in table.entries()} == {"fwd", "bwd"}, table.entries()


def test_the_path_cases_name_real_paths():
    """On any machine: every case names paths the launch has, at widths those paths serve."""
    for case in PATH_CASES:
        assert FORWARDS[case.forward]() is not None and BACKWARDS[case.backward]() is not None
        n = case.shape[1]
        if case.forward == "single tile":
            assert n <= launch.SINGLE_TILE_MAX_N, case
        if case.backward in ("single tile", "two-role"):
            assert n <= launch.BACKWARD_SINGLE_TILE_MAX_N, case
        if case.backward == "two-role":
            assert launch.TWO_ROLE_MIN_N <= n <= launch.TWO_ROLE_MAX_N, case
        if case.forward in ("held row", "split") or case.forward.startswith("group"):
            assert n > launch.SINGLE_TILE_MAX_N, case
        if case.backward.startswith("held row"):
            assert launch.BACKWARD_SINGLE_TILE_MAX_N < n <= launch.HELD_BACKWARD_MAX_N, case
    used = {c.forward for c in PATH_CASES}, {c.backward for c in PATH_CASES}
    assert used == (set(FORWARDS), set(BACKWARDS)), "a path without a case"
