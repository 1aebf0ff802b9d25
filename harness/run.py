"""Backends x shapes x dtypes x modes x timings -> long-format rows, each with its oracle check.

One row per (backend, shape, dtype, mode, timing). A backend that cannot run a case, raises, or
fails the oracle still gets its rows, with a status and the reason: a failing backend never takes
the run down, and never disappears from the table.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness import traffic
from harness.calls import DTYPE_NAMES, backward_call, error_text, forward_calls
from harness.checks import QUANTITIES, CheckResult, check_backend
from harness.inputs import DEFAULT_EPS, Inputs
from harness.layouts import case_skip_reason, make_case_inputs
from harness.oracle import reference
from harness.shapes import HeadView, shape_label
from impls import Backend

MODES = ("fwd", "bwd")
TIMINGS = ("host", "device")

#: A bandwidth more than this factor above the measured copy ceiling is flagged as suspect.
SUSPECT_ABOVE_CEILING = 1.05
#: A step that built a backend and left at least this much more device memory allocated than it
#: found (after dropping its callable) gets a full gc.collect(): see _release.
COLLECT_LEFT_BEHIND_BYTES = 256 * 2**20


@dataclass(frozen=True)
class RunConfig:
    backends: Sequence[Backend]
    shapes: Sequence[tuple[int, int]]
    dtypes: Sequence[torch.dtype]
    modes: Sequence[str] = MODES
    timings: Sequence[str] = TIMINGS
    eps: float = DEFAULT_EPS
    ceiling_gbps: float | None = None
    #: Opt-in cost columns (harness.costs): "host_us", "batch_invariance" (in this process),
    #: "first_call" (cold and warm caches, first-call memory and cross-process determinism:
    #: two fresh subprocesses per backend and dtype; slow) and the cases first_call covers
    #: (None: every case; cases outside config.shapes are ignored).
    costs: Sequence[str] = ()
    #: (shape label, dtype name) cases already measured (a resumed run's): skipped.
    done_cases: frozenset = frozenset()
    first_call_shapes: Sequence | None = None


def _on_cuda() -> bool:
    return torch.cuda.is_available()


def _sets(shape, dtype: torch.dtype, eps: float, with_residual: bool) -> list[Inputs]:
    """Input sets for one case: enough distinct ones on CUDA to exceed 3x the L2 per graph."""
    device = "cuda" if _on_cuda() else "cpu"
    count = 1
    if _on_cuda():
        from harness.timing import rotating_sets

        m, n = shape
        count = rotating_sets(
            traffic.counted_bytes("fwd", m, n, torch.empty((), dtype=dtype).element_size())
        )
    return [
        make_case_inputs(shape, dtype, device, eps=eps, seed=1000 + i, with_residual=with_residual)
        for i in range(count)
    ]


def _time_mode(backend: Backend, fn, mode: str, timing: str, sets: list[Inputs]):
    """One timing of one mode; raises on failure (the caller records it)."""
    from harness import timing as timers

    forwards, leaves = forward_calls(backend, fn, sets)
    if not _on_cuda() or timing == "host":
        timer = timers.time_host if _on_cuda() else timers.time_cpu
        if mode == "fwd":
            return timer(forwards[0])
        return timer(backward_call(backend, forwards[0](), leaves[0], sets[0]))
    stream = torch.cuda.Stream()
    if mode == "fwd":
        calls = forwards
    else:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # autograd replays each backward op on its forward's stream
            outputs = [forward() for forward in forwards]
        calls = [
            backward_call(backend, out, leaf, s)
            for out, leaf, s in zip(outputs, leaves, sets, strict=True)
        ]
    timers.warm_up(calls, stream)
    try:
        return timers.time_device(calls, stream)
    except Exception:
        torch.cuda.synchronize()
        # The first backward capture of a process can fail; one retry tells it from a real refusal.
        timers.warm_up(calls, stream, rounds=1)
        return timers.time_device(calls, stream)


def _floor(shape, dtype, timing: str, sets: list[Inputs]) -> float | None:
    """Time of a same-shape copy kernel (read x once, write once) with this timer."""
    if not _on_cuda() or timing == "check":
        return None
    from harness import timing as timers
    from harness.ceiling import triton_copy

    # The floor copies the case's logical bytes contiguously: a qk-norm view's x is strided, so
    # its same-sized, contiguous dy is copied instead.
    srcs = [s.x if s.x.is_contiguous() else s.dy for s in sets]
    outs = [torch.empty_like(src) for src in srcs]
    if timing == "host":
        return timers.time_host(lambda: triton_copy(srcs[0], outs[0])).ms
    calls = [lambda s=s, o=o: triton_copy(s, o) for s, o in zip(srcs, outs, strict=True)]
    stream = torch.cuda.Stream()
    timers.warm_up(calls, stream)
    return timers.time_device(calls, stream).ms


def _oracle_fields(check: CheckResult | None, op: str, mode: str) -> dict:
    if check is None:
        return {
            "oracle_passed": None,
            "oracle_bound_use": None,
            "oracle_max_ulps": None,
            "oracle_detail": None,
        }
    wanted = QUANTITIES[(op, mode)]
    reports = [r for r in check.reports if r.quantity.split("#")[0] in wanted]
    if len(reports) < 2 * len(wanted):  # the check raised before judging this mode
        return {"oracle_passed": False, "oracle_bound_use": None, "oracle_max_ulps": None,
                "oracle_detail": check.error or "not checked"}  # fmt: skip
    return {
        "oracle_passed": all(r.passed for r in reports),
        "oracle_bound_use": max(r.bound_use for r in reports),
        "oracle_max_ulps": max(r.max_ulps for r in reports),
        "oracle_detail": "; ".join(r.summary() for r in reports if not r.passed) or None,
    }


def run(
    config: RunConfig,
    sink: Callable[[dict], None],
    progress: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> None:
    """Measure every case of ``config`` and hand each finished row to ``sink`` at once."""
    device = "cuda" if _on_cuda() else "cpu"
    first_calls = _FirstCalls(config, progress)
    cases = [(s, d) for s in config.shapes for d in config.dtypes
             if (shape_label(s), DTYPE_NAMES[d]) not in config.done_cases]  # fmt: skip
    total = len(cases) * len(config.backends)
    done = 0
    started = time.perf_counter()
    for shape, dtype in cases:
        m, n = shape
        es = torch.empty((), dtype=dtype).element_size()
        with_residual = any(b.op == "add_rmsnorm" for b in config.backends) and not isinstance(
            shape, HeadView
        )
        try:
            sets = _sets(shape, dtype, config.eps, with_residual)
            # One oracle for every rmsnorm backend on these inputs; add_rmsnorm checks need the
            # h each backend returns, so they compute their own.
            needs_ref = any(b.op == "rmsnorm" for b in config.backends)
            ref = (
                reference(sets[0].x, sets[0].weight, sets[0].eps, sets[0].dy) if needs_ref else None
            )
        except Exception as exc:  # out of memory for this shape: record it, go on
            progress(f"  {shape_label(shape)} {DTYPE_NAMES[dtype]}: cannot make inputs: "
                     f"{error_text(exc)}")  # fmt: skip
            _free()
            continue
        floors = {}
        for timing in config.timings:
            try:
                floors[timing] = _floor(shape, dtype, timing, sets)
            except Exception as exc:
                progress(f"  copy floor {timing} failed: {error_text(exc)}")
                floors[timing] = None
        for backend in config.backends:
            done += 1
            elapsed = time.perf_counter() - started
            left = f" ~{elapsed / (done - 1) * (total - done + 1):.0f}s left" if done > 1 else ""
            progress(
                f"[{done}/{total} {elapsed:5.0f}s{left}] {backend.name} {DTYPE_NAMES[dtype]} "
                f"{shape_label(shape)}"
            )
            base = {
                "backend": backend.name, "label": backend.label, "op": backend.op, "m": m, "n": n,
                "shape": shape_label(shape), "dtype": DTYPE_NAMES[dtype],
            }  # fmt: skip
            if isinstance(shape, HeadView):
                base.update(layout="qkv-view", tokens=shape.tokens, heads=shape.heads,
                            kv_heads=shape.kv_heads)  # fmt: skip
            for row in _backend_rows(backend, shape, dtype, device, sets, ref, floors, config):
                row = {**base, **row}
                row.update(first_calls.columns(backend, dtype, base["shape"], row["mode"]))
                row["bytes"] = traffic.counted_bytes(row["mode"], m, n, es, backend.op)
                _add_bandwidth(row, config.ceiling_gbps, m, n, es)
                sink(row)
        del sets, ref
        _free()


class _FirstCalls:
    """First-call columns (harness.costs) for the cases config.first_call_shapes names (all when
    None; cases outside the run, or a resumed run's kept cases, are ignored): a cold and a warm
    process per backend and dtype, covering every such case at once, run when the first of them
    comes up for that backend (not its first case of the run: a run cut before a named case and
    resumed would pay the processes again and attach nothing), so rows keep streaming out."""

    def __init__(self, config: RunConfig, progress) -> None:
        self.enabled = "first_call" in config.costs and _on_cuda()
        wanted = list(config.shapes)
        if config.first_call_shapes is not None:
            wanted = [s for s in config.first_call_shapes if s in wanted]
        #: dtype name -> the wanted cases this run still measures (a resume kept the rest)
        self.wanted = {
            DTYPE_NAMES[d]: [s for s in wanted
                             if (shape_label(s), DTYPE_NAMES[d]) not in config.done_cases]
            for d in config.dtypes
        }  # fmt: skip
        self.progress = progress
        self.table: dict[tuple, dict] = {}
        self.done: set[tuple] = set()

    def columns(self, backend: Backend, dtype: torch.dtype, label: str, mode: str) -> dict:
        if not self.enabled:
            return {}
        name = DTYPE_NAMES[dtype]
        wanted = self.wanted.get(name, [])
        if (backend.name, name) not in self.done and label in map(shape_label, wanted):
            self.done.add((backend.name, name))
            self._measure(backend, dtype, wanted)
        return self.table.get((backend.name, label, name, mode), {})

    def _measure(self, backend: Backend, dtype: torch.dtype, wanted: list) -> None:
        from harness import costs

        cases = [s for s in wanted if case_skip_reason(backend, s, dtype, "cuda") is None]
        if not cases:
            return
        started = time.perf_counter()
        found = costs.first_call_costs(backend.name, cases, DTYPE_NAMES[dtype])
        self.progress(f"  first calls: {backend.name} {DTYPE_NAMES[dtype]}, {len(cases)} cases, "
                      f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        for (label, mode), columns in found.items():
            self.table[(backend.name, label, DTYPE_NAMES[dtype], mode)] = columns


def _launch_configs(backend: Backend) -> dict | None:
    """The launch configurations the backend reports for its latest launches (our autotuned
    kernels: kernel name -> config), or None."""
    if backend.launch_configs is None:
        return None
    try:
        return backend.launch_configs()
    except Exception as exc:  # a record, never a reason to lose the row
        return {"error": error_text(exc)}


def _backend_rows(backend, shape, dtype, device, sets, ref, floors, config):
    reason = case_skip_reason(backend, shape, dtype, device)
    check = None
    fn = None
    costs: dict = {}
    built = reason is None  # a step that cannot run builds nothing, so has nothing to free
    raised = False
    held_before = torch.cuda.memory_allocated() if built else 0
    if reason is None:
        try:
            fn = backend.build()
            check = check_backend(backend, fn, sets[0], ref=ref)
        except Exception as exc:
            reason = f"error: {error_text(exc)}"
            raised = True
        # the check's launches: what "check" rows record; each timed row records its own
        check_launch = _launch_configs(backend)
    if reason is None and config.costs:
        from harness import costs as cost_columns

        costs = cost_columns.measure(backend, fn, shape, dtype, sets[0], config)
        _launch_configs(backend)
    for mode in config.modes:
        for timing in config.timings:
            row = {"mode": mode, "timing": timing, "floor_ms": floors.get(timing)}
            if mode == "fwd" or backend.has_backward:
                row.update(_oracle_fields(check, backend.op, mode))
            row.update(costs.get(mode, {}))
            if reason is not None:
                status, _, why = reason.partition(": ")
                yield {**row, "status": status, "reason": why}
                continue
            if mode == "bwd" and not backend.has_backward:
                yield {**row, "status": "forward-only", "reason": "no backward"}
                continue
            if timing == "check":  # oracle only, nothing timed (harness.compare without CUDA)
                yield {**row, "status": "checked", "reason": None, "launch": check_launch}
                continue
            if device != "cuda" and timing == "device":
                yield {**row, "status": "unsupported", "reason": "device-only timing needs CUDA"}
                continue
            if timing == "device" and mode == "bwd" and not backend.graph_capturable_backward:
                yield {**row, "status": "host-only",
                       "reason": "backward cannot be captured in a CUDA graph"}  # fmt: skip
                continue
            try:
                t = _time_mode(backend, fn, mode, timing, sets)
            except Exception as exc:
                raised = True
                _recover()
                _launch_configs(backend)  # not this row's: the next row records its own
                yield {**row, "status": "error", "reason": error_text(exc)}
                continue
            yield {**row, "status": "ok", "reason": None, "ms": t.ms, "p20": t.p20, "p80": t.p80,
                   "launch": _launch_configs(backend)}  # fmt: skip
    raised = raised or (check is not None and check.error is not None)
    del fn, check
    if built:
        _release(raised, held_before)


def _add_bandwidth(row: dict, ceiling: float | None, m: int, n: int, es: int) -> None:
    if row.get("status") != "ok":
        return
    row["gbps"] = traffic.gbps(row["bytes"], row["ms"])
    floor_ms = row.get("floor_ms")
    if floor_ms:
        row["floor_gbps"] = traffic.gbps(traffic.copy_bytes(m, n, es), floor_ms)
    if ceiling:
        row["pct_ceiling"] = 100.0 * row["gbps"] / ceiling
        row["suspect"] = row["gbps"] > SUSPECT_ABOVE_CEILING * ceiling


def _recover() -> None:
    if _on_cuda():
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()


def _release(raised: bool, held_before: int) -> None:
    """After a step that built a backend: hand the allocator's cached blocks back, so the next
    backend starts from the same free memory, and collect reference cycles only where they may
    hold device memory (a full gc.collect() costs a good fraction of a second in a process that
    has imported torch, CuTe DSL and FlashInfer; the end of each case still does one)."""
    # Refcounting already freed what the step dropped; a raise (its traceback keeps frames and
    # their tensors) or memory left allocated (a cycle may hold it) is what a collect can free.
    left = torch.cuda.memory_allocated() - held_before
    if raised or left >= COLLECT_LEFT_BEHIND_BYTES:
        gc.collect()
    torch.cuda.empty_cache()  # a no-op until CUDA is initialized


def _free() -> None:
    """After a case (its inputs dropped) or a case whose inputs could not be made: everything."""
    gc.collect()
    if _on_cuda():
        torch.cuda.empty_cache()
