"""The costs beside the bandwidth, per (backend, case, mode): opt-in columns of harness.run rows.

- ``host_us``: host microseconds per call with the GPU kept busy. A long ``torch.cuda._sleep``
  is queued first, then ``CALLS`` calls; the host clock around the calls measures only the host
  (Python, checks, autograd, launches), since no call waits for the GPU. An event recorded right
  after the sleep tells whether the GPU caught up before the host finished queuing; then the
  sleep doubles and the sample is taken again (``host_us_gpu_caught_up`` counts such retries
  that still caught up: a figure to distrust). Few calls per sample (32), so the launch queue
  (about a thousand pending launches) never fills and blocks the host.
- ``batch_invariant`` / ``batch_diff``: whether the rows of a smaller batch (the first row
  alone, and the first third of the rows) come out bitwise the same as those rows of the whole
  batch: y in fwd, dx in bwd (dw sums over the rows, so it cannot be). ``batch_diff`` counts the
  differing elements. None (n/a) for a single-row case.
- first-call columns (``first_call``, slow: two fresh processes per backend and dtype, see
  ``first_call_costs``): ``first_call_cold_s`` with empty compile caches (TRITON_CACHE_DIR,
  TORCHINDUCTOR_CACHE_DIR, CUTE_DSL_CACHE_DIR, QUACK_CACHE_DIR, FlashInfer's workspace, the
  driver's CUDA_CACHE_PATH, XDG_CACHE_HOME, all pointed at a new folder),
  ``first_call_warm_s`` in a second process with those caches as the first left them; ``first_extra_mem_bytes``: the first call's
  peak allocation above a steady call's (workspaces, compile-time buffers, caches);
  ``deterministic`` / ``determinism_diff``: y (fwd), dx and dw (bwd) bitwise equal across the two
  processes, and how many elements differ.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

#: Calls per host sample: few enough that the launch queue never fills while the GPU sleeps.
CALLS = 32
#: Samples per host figure (median).
REPEATS = 5
#: GPU sleep per sample to start with, in seconds; doubled while the GPU catches up.
FIRST_SLEEP_S = 0.005
#: Each first-call subprocess gets this long before it is killed (a library call never hangs).
WORKER_TIMEOUT_S = 300.0
#: Cache variables a cold first call empties (every compiler the backends use).
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUTE_DSL_CACHE_DIR",
                   "QUACK_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH",
                   "XDG_CACHE_HOME")  # fmt: skip


class CudaClock:
    """What the host-time measurement needs from the GPU; tests pass a fake."""

    def sleep(self, seconds: float) -> None:
        # _sleep spins for a number of GPU clock cycles: counted at 2 GHz (about the H200's
        # boost clock), so a slower clock only sleeps longer, which is safe here.
        torch.cuda._sleep(int(seconds * 2e9))

    def marker(self):
        event = torch.cuda.Event()
        event.record()
        return event

    def sync(self) -> None:
        torch.cuda.synchronize()


def host_us_busy(
    call: Callable[[], object],
    gpu: CudaClock | None = None,
    *,
    calls: int = CALLS,
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    max_doublings: int = 6,
) -> dict:
    """Host µs per call of ``call`` while the GPU is busy (median of ``repeats`` samples)."""
    gpu = gpu or CudaClock()
    for _ in range(3):
        call()
    gpu.sync()
    sleep_s, samples, caught_up = FIRST_SLEEP_S, [], 0
    for _ in range(repeats):
        for attempt in range(max_doublings + 1):
            gpu.sleep(sleep_s)
            asleep = gpu.marker()  # completes when the sleep ends
            start = clock()
            for _ in range(calls):
                call()
            elapsed = clock() - start
            woke_early = bool(asleep.query())
            gpu.sync()
            if not woke_early:
                break
            if attempt == max_doublings:
                caught_up += 1
                break
            sleep_s *= 2
        samples.append(elapsed / calls * 1e6)
    return {"host_us": statistics.median(samples), "host_us_gpu_caught_up": caught_up}


def bitwise_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of a and b differ bit for bit (NaNs with equal bits are equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    es = a.element_size()
    left = a.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, es)
    right = b.detach().contiguous().reshape(-1).view(torch.uint8).reshape(-1, es).to(left.device)
    return int((left != right).any(dim=1).sum())


def subset_sizes(rows: int) -> list[int]:
    """Leading sizes a batch-invariance check compares against the whole: 1 and a third."""
    return sorted({1, max(1, rows // 3)} - {rows})


def batch_invariance(run_rows: Callable[[int], torch.Tensor], rows: int) -> dict:
    """run_rows(k) -> the output for the first k rows (k = rows: the whole batch)."""
    sizes = subset_sizes(rows)
    if not sizes:
        return {"batch_invariant": None, "batch_diff": None, "batch_sizes": []}
    whole = run_rows(rows)
    diff = sum(bitwise_diff(run_rows(k), whole[:k]) for k in sizes)
    return {"batch_invariant": diff == 0, "batch_diff": diff, "batch_sizes": sizes}


def _rows_call(backend, fn, inputs, mode: str) -> Callable[[int], torch.Tensor]:
    """k -> y (fwd) or dx (bwd) of the backend on the first k rows (first k tokens of a view)."""
    from harness.layouts import private_copy

    def run_rows(k: int) -> torch.Tensor:
        grad = mode == "bwd"
        fresh = private_copy if backend.in_place else torch.Tensor.detach
        x = fresh(inputs.x[:k]).requires_grad_(grad)
        w = inputs.weight.detach().requires_grad_(grad)
        if backend.op == "add_rmsnorm":
            r = fresh(inputs.residual[:k]).requires_grad_(grad)
            y, h = fn(x, r, w, inputs.eps)
            if not grad:
                return y.detach().clone()
            (dx,) = torch.autograd.grad((y, h), (x,), (inputs.dy[:k], inputs.dh[:k]))
            return dx
        y = fn(x, w, inputs.eps)
        if not grad:
            return y.detach().clone()
        (dx,) = torch.autograd.grad(y, (x,), inputs.dy[:k])
        return dx

    return run_rows


def measure(backend, fn, shape, dtype, inputs, config) -> dict:
    """The in-process cost columns config.costs asks for, per mode: {mode: {column: value}}."""
    from harness.calls import backward_call, error_text, forward_calls

    out: dict[str, dict] = {}
    modes = [m for m in config.modes if m == "fwd" or backend.has_backward]
    on_cuda = torch.cuda.is_available()
    for mode in modes:
        columns: dict = {}
        if "host_us" in config.costs and on_cuda:
            try:
                forwards, leaves = forward_calls(backend, fn, [inputs])
                call = forwards[0]
                if mode == "bwd":
                    call = backward_call(backend, forwards[0](), leaves[0], inputs)
                columns.update(host_us_busy(call))
            except Exception as exc:
                columns["host_us_error"] = error_text(exc)
        if "batch_invariance" in config.costs:
            try:
                columns.update(batch_invariance(_rows_call(backend, fn, inputs, mode),
                                                inputs.x.shape[0]))  # fmt: skip
            except Exception as exc:
                columns["batch_error"] = error_text(exc)
        out[mode] = columns
    return out


# ---- first call: two fresh processes, cold then warm caches --------------------------------


def cache_env(folder: Path, base: dict | None = None) -> dict:
    """The environment of a first-call worker: every compile cache inside ``folder``."""
    env = dict(os.environ if base is None else base)
    for name in CACHE_VARIABLES:
        env[name] = str(folder / name.lower())
    return env


def first_call_costs(
    backend_name: str,
    shapes: Sequence,
    dtype_name: str,
    *,
    runner: Callable[[list[str], dict, float], subprocess.CompletedProcess] | None = None,
) -> dict:
    """{(shape label, mode): columns} from a cold and a warm worker process (see the module
    docstring); an error in either becomes ``first_call_error`` on every entry."""
    from harness.shapes import shape_label

    runner = runner or _run_worker
    labels = [shape_label(s) for s in shapes]
    with tempfile.TemporaryDirectory(prefix="rmsnorm-first-call-") as tmp:
        folder = Path(tmp)
        env = cache_env(folder)
        results = []
        for phase in ("cold", "warm"):
            out = folder / f"{phase}.pt"
            argv = [sys.executable, "-m", "harness.costs", "--worker", "--backend", backend_name,
                    "--dtype", dtype_name, "--out", str(out), "--shapes", *labels]  # fmt: skip
            try:
                done = runner(argv, env, WORKER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return _errors(labels, f"{phase} worker ran past {WORKER_TIMEOUT_S:.0f} s")
            if done.returncode != 0 or not out.exists():
                tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
                return _errors(labels, f"{phase} worker exited {done.returncode}: {tail[0][:200]}")
            results.append(torch.load(out, weights_only=False))
    return combine_first_calls(*results)


def _errors(labels, text: str) -> dict:
    return {
        (label, mode): {"first_call_error": text} for label in labels for mode in ("fwd", "bwd")
    }


def combine_first_calls(cold: dict, warm: dict) -> dict:
    """The columns from a cold and a warm worker's records (worker() returns one)."""
    out = {}
    for label, modes in cold["cases"].items():
        for mode, first in modes.items():
            second = warm["cases"].get(label, {}).get(mode)
            columns = {
                "first_call_cold_s": first.get("first_call_s"),
                "first_call_warm_s": second.get("first_call_s") if second else None,
                "import_build_cold_s": cold.get("import_build_s"),
                "import_build_warm_s": warm.get("import_build_s"),
                "first_extra_mem_bytes": first.get("extra_mem_bytes"),
            }
            if first.get("error") or (second and second.get("error")):
                columns["first_call_error"] = first.get("error") or second.get("error")
            elif second is not None:
                diffs = {q: bitwise_diff(first["outputs"][q], second["outputs"][q])
                         for q in first["outputs"]}  # fmt: skip
                columns["deterministic"] = not any(diffs.values())
                columns["determinism_diff"] = diffs
            out[(label, mode)] = columns
    return out


def _run_worker(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(Path(__file__).resolve().parent.parent))  # fmt: skip


def _timed_first_and_steady(call: Callable[[], object]) -> tuple[object, float, int]:
    """(output, seconds of the first call, its peak allocation above a steady call's)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = call()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    first_peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    steady_peak = torch.cuda.max_memory_allocated() - base
    return out, seconds, first_peak - steady_peak


def worker(backend_name: str, dtype_name: str, labels: Sequence[str]) -> dict:
    """One fresh process's first calls: per case, fwd then bwd (what the parent compares)."""
    from harness.calls import DTYPES
    from harness.layouts import make_case_inputs
    from harness.shapes import parse_shape
    from impls import get_backend

    torch.empty(1, device="cuda")  # CUDA context: not any backend's first-call cost
    torch.cuda.synchronize()
    start = time.perf_counter()
    backend = get_backend(backend_name)
    reason = backend.unavailable()
    if reason is not None:
        raise SystemExit(f"{backend_name}: unavailable: {reason}")
    fn = backend.build()
    import_build_s = time.perf_counter() - start
    dtype = DTYPES[dtype_name]
    cases: dict = {}
    for label in labels:
        shape = parse_shape(label)
        inputs = make_case_inputs(shape, dtype, "cuda", seed=4242, with_residual=backend.op
                                  == "add_rmsnorm")  # fmt: skip
        cases[label] = _worker_case(backend, fn, inputs)
    return {"backend": backend_name, "import_build_s": import_build_s, "cases": cases}


def _worker_case(backend, fn, inputs) -> dict:
    from harness.layouts import private_copy

    grad = backend.has_backward
    fresh = private_copy if backend.in_place else torch.Tensor.detach
    w = inputs.weight.detach().requires_grad_(grad)
    add = backend.op == "add_rmsnorm"

    def forward():
        x = fresh(inputs.x).requires_grad_(grad)
        if add:
            r = fresh(inputs.residual).requires_grad_(grad)
            return (x, r), fn(x, r, w, inputs.eps)
        return (x,), fn(x, w, inputs.eps)

    record: dict = {}
    try:
        (_, out), seconds, extra = _timed_first_and_steady(forward)
        y = out[0] if add else out
        record["fwd"] = {"first_call_s": seconds, "extra_mem_bytes": extra,
                         "outputs": {"y": y.detach().cpu()}}  # fmt: skip
    except Exception as exc:
        return {"fwd": {"error": f"{type(exc).__name__}: {exc}"[:300]}}
    if not grad:
        return record
    try:
        leaves, out = forward()
        grads = (inputs.dy, inputs.dh) if add else inputs.dy

        def backward():
            return torch.autograd.grad(out, (*leaves, w), grads, retain_graph=True)

        result, seconds, extra = _timed_first_and_steady(backward)
        record["bwd"] = {"first_call_s": seconds, "extra_mem_bytes": extra,
                         "outputs": {"dx": result[0].cpu(), "dw": result[-1].cpu()}}  # fmt: skip
    except Exception as exc:
        record["bwd"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return record


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m harness.costs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--worker", action="store_true", help="run as a first-call worker process")
    p.add_argument("--backend", required=True)
    p.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--shapes", nargs="+", required=True, metavar="SHAPE")
    p.add_argument("--out", type=Path, required=True, help="worker: where its record goes")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("harness.costs measures first calls on a CUDA GPU; none is visible here.")
        return 1
    if args.worker:
        torch.save(worker(args.backend, args.dtype, args.shapes), args.out)
        return 0
    from harness.shapes import parse_shape

    table = first_call_costs(args.backend, [parse_shape(s) for s in args.shapes], args.dtype)
    args.out.write_text(json.dumps({f"{k[0]} {k[1]}": v for k, v in table.items()}, indent=1,
                                   default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
