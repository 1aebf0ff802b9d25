"""A default call decided ahead of time (impls/triton_rmsnorm/dispatch.py; issue 30, items 1, 2
and 4), on a GPU: the first call of a shape class only compiles (no host synchronization, no
memory beyond a steady call's, safe beside another thread's first call or CUDA-graph capture),
the same inputs give the same bits in every process, a row's y keeps its bits whatever M, and
runtime tuning, when asked for, runs as documented (private stream, lock, refuses under
sync-debug mode, a cache file that later processes read).

The calls take the dispatch table of this GPU (the tests otherwise run heuristic-only:
conftest sets RMSNORM_TRITON_AUTOTUNE=0), or the heuristic where it has none. Each test takes
hidden sizes no other test in the process calls (_fresh_n), so its call is a first call."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from impls.triton_rmsnorm import common, configs, dispatch, dispatch_table, kernels, launch, rmsnorm
from tests.conftest import ON_GPU

pytestmark = pytest.mark.skipif(not ON_GPU, reason="first calls, streams and captures: GPU only")

REPO = Path(__file__).resolve().parents[1]
_USED: set[int] = set()


def _fresh_n(near: int) -> int:
    """A hidden size below `near` of the same padded width, a multiple of 8 and 24 below it at
    least, that no earlier test of this module used: each N is a kernel specialization of its
    own, so the call is the first of its class in the process."""
    n = near - 24
    while n in _USED:
        n -= 8
    assert dispatch_table.next_power_of_2(n) == dispatch_table.next_power_of_2(near)
    _USED.add(n)
    return n


@pytest.fixture
def table_dispatch(monkeypatch, tmp_path):
    """Default dispatch as a user gets it: the committed table (no runtime tuning, no cache)."""
    monkeypatch.setattr(dispatch, "_TUNE_ENV", False)
    monkeypatch.setenv("RMSNORM_TRITON_TUNE_CACHE", str(tmp_path / "no-cache.json"))
    with dispatch.reading_tables(True):
        yield dispatch.table(torch.cuda.current_device())


def _has_table() -> bool:
    return dispatch_table.committed_table_path(torch.cuda.get_device_name()).exists()


def _inputs(m: int, n: int, dtype=torch.bfloat16, seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=generator).requires_grad_(True)
    w = torch.randn(n, device="cuda", dtype=dtype, generator=generator).requires_grad_(True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=generator)
    return x, w, dy


def _step(x, w, dy):
    y = rmsnorm(x, w, 1e-6)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    return y.detach(), dx, dw


def _reference(x, w, dy):
    xf, wf = x.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * wf
    dx, dw = torch.autograd.grad(y, (xf, wf), dy.float())
    return y, dx, dw


def _assert_close(got, x, w, dy):
    for name, a, b in zip(("y", "dx", "dw"), got, _reference(x, w, dy), strict=True):
        tol = 0.05 * float(b.abs().max()) + 1e-3
        assert float((a.float() - b).abs().max()) <= tol, name


# ---- item 4: a first call that only compiles ----------------------------------------------


@pytest.mark.parametrize("m, near", [(2432, 4096), (512, 20480), (64, 131072)])
def test_the_first_call_does_not_synchronize(table_dispatch, m, near):
    n = _fresh_n(near)
    x, w, dy = _inputs(m, n)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = _step(x, w, dy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    _assert_close(got, x, w, dy)


def test_the_first_call_compiles_only_what_it_launches(table_dispatch):
    n = _fresh_n(4096)
    x, w, _ = _inputs(512, n)
    cache = kernels.rmsnorm_fwd_kernel.device_caches[x.get_device()][0]
    before = len(cache)
    with torch.no_grad():
        rmsnorm(x, w)
    assert "rmsnorm_fwd_kernel" in launch.take_launch_configs()
    assert len(cache) == before + 1  # one binary: no candidate compiled beside it


def _settle(base: int, timeout_s: float = 5.0) -> int:
    """torch.cuda.memory_allocated() once it is back at base (the tensors of the calls since
    base released), or after timeout_s. A backward's gradients can outlive the
    torch.autograd.grad that returned them for a while: autograd's CUDA worker thread may hold
    the last reference and free them only once it gets the GIL, and tensors in reference
    cycles wait for the collector. Until then they count in memory_allocated(), and a call that
    frees them before its peak would measure less than it takes."""
    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        torch.cuda.synchronize()
        now = torch.cuda.memory_allocated()
        if now <= base or time.monotonic() > deadline:
            return now
        time.sleep(0.001)  # releases the GIL to the thread holding the last reference


def _peak_extra(fn) -> int:
    """The device memory fn takes at its peak beyond what was allocated before it; fn's own
    tensors must all be released after it (checked, so that a later measurement starts clean)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    left = _settle(base)
    assert left == base, f"{left - base} bytes of the call still allocated after it"
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.parametrize("m, near", [(2432, 4096), (1024, 8192), (512, 32768), (64, 131072)])
def test_the_first_call_takes_no_memory_beyond_a_steady_call(table_dispatch, m, near):
    x, w, dy = _inputs(m, _fresh_n(near))
    first = _peak_extra(lambda: _step(x, w, dy))
    steady = _peak_extra(lambda: _step(x, w, dy))
    assert first == steady, (first, steady)


_ENV = {k: v for k, v in os.environ.items() if not k.startswith("RMSNORM_TRITON_")}


def _python(code: str, env: dict | None = None, timeout: int = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env={**_ENV, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_memory_cap_that_fits_a_steady_call_fits_the_first():
    """In a fresh process: the device memory a steady [2432, 4096] bf16 forward+backward has the
    allocator reserve (segments, not only bytes: a 2 MB scratch takes a 20 MB segment) is
    measured, the process capped at what it holds plus that; a steady call fits under the cap,
    and so does the first call of a new class 8 columns narrower (its buffers no larger); the
    cap is real (as much again does not fit)."""
    out = _python("""
        import torch
        from impls.triton_rmsnorm import rmsnorm
        m, n = 2432, 4096

        def inputs(n):
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            return x, w, torch.randn_like(x)

        def step(x, w, dy):
            y = rmsnorm(x, w)
            torch.autograd.grad(y, (x, w), dy)
            torch.cuda.synchronize()

        a, b = inputs(n), inputs(n - 8)
        step(*a)  # A's first call
        torch.cuda.empty_cache()
        held = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        step(*a)
        need = torch.cuda.max_memory_reserved() - held
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((held + need + (1 << 20)) / total)
        step(*a)
        print("STEADY CALL FITS", need)
        torch.cuda.empty_cache()
        step(*b)  # B's first call
        print("FIRST CALL FITS")
        torch.cuda.empty_cache()
        try:
            torch.empty(need + (2 << 20), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("CAP HOLDS")
    """)
    assert "FIRST CALL FITS" in out and "CAP HOLDS" in out, out


def _step_in_two_threads(x, w, dy) -> list:
    """_step(x, w, dy) made by two threads at once (released together by a barrier): each
    thread's outputs; any thread's error fails the test."""
    barrier = threading.Barrier(2)
    results, errors = [None, None], []

    def call(i):
        try:
            barrier.wait(timeout=60)
            results[i] = _step(x, w, dy)
            torch.cuda.synchronize()
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return results


def test_two_threads_making_the_first_call_of_one_shape_get_the_same_bits(table_dispatch):
    x, w, dy = _inputs(1024, _fresh_n(8192))
    results = _step_in_two_threads(x, w, dy)
    later = _step(x, w, dy)
    for a, b, c in zip(results[0], results[1], later, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_first_call_beside_another_threads_global_capture(table_dispatch):
    """Thread A captures a CUDA graph in the global mode; meanwhile this thread makes the first
    call of a new shape class on a side stream whose allocator pool holds free blocks (a fresh
    cudaMalloc is itself not allowed beside a global capture, whoever makes it: the reservoir is
    freed into the pool once the capture has begun). Neither the call nor the capture fails,
    and both compute what they should."""
    m, n = 1024, _fresh_n(4096)
    x, w, dy = _inputs(m, n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # held through torch.cuda.graph's empty_cache, freed after
        reservoir = [torch.empty(6 * m * n * 2 + (64 << 20), dtype=torch.uint8, device="cuda"),
                     torch.empty(512 << 10, dtype=torch.uint8, device="cuda")]  # fmt: skip
    torch.cuda.synchronize()
    a = torch.randn(512, 512, device="cuda")
    capturing, called, box = threading.Event(), threading.Event(), {}

    def capture():
        try:
            a @ a  # this thread's cuBLAS handle, made outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="global"):
                b = a @ a
                capturing.set()
                called.wait(timeout=120)
                box["out"] = b @ a
            box["graph"] = graph
        except Exception as error:
            box["error"] = error
            capturing.set()

    thread = threading.Thread(target=capture)
    thread.start()
    assert capturing.wait(timeout=120)
    reservoir.clear()  # its blocks back to the side stream's pool: no cudaMalloc below
    try:
        with torch.cuda.stream(side):
            got = _step(x, w, dy)
    finally:
        called.set()
        thread.join(timeout=120)
    # only now: a synchronization is itself not allowed in any thread beside a global capture
    # (the H200 run raised cudaErrorStreamCaptureUnsupported at side.synchronize() there)
    side.synchronize()
    assert "error" not in box, box.get("error")
    box["graph"].replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(box["out"], a @ a @ a)
    _assert_close(got, x, w, dy)
    for u, v in zip(got, _step(x, w, dy), strict=True):
        assert torch.equal(u, v)


# ---- item 2: the same bits in every process, and whatever M -------------------------------

_HASHES = """
    import hashlib, json, sys, torch
    from impls.triton_rmsnorm import rmsnorm
    out = {}
    for m, n, dtype in json.loads(sys.argv[1]):
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
        dtype = getattr(torch, dtype)
        x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g).requires_grad_(True)
        w = torch.randn(n, device="cuda", dtype=dtype, generator=g).requires_grad_(True)
        dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
        y = rmsnorm(x, w, 1e-6)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        out[f"{m}x{n}"] = [hashlib.sha256(t.detach().cpu().view(torch.uint8).numpy().tobytes())
                           .hexdigest() for t in (y, dx, dw)]
    print(json.dumps(out))
"""

_PROCESS_SHAPES = [(2048, 8192, "bfloat16"), (4096, 2048, "float16"), (512, 20480, "bfloat16"),
                   (256, 65536, "bfloat16"), (37, 5120, "float16")]  # fmt: skip


def _hashes_in_a_process(cache: Path) -> dict:
    code = _HASHES.replace("sys.argv[1]", repr(json.dumps(_PROCESS_SHAPES)))
    out = _python(code, env={"RMSNORM_TRITON_TUNE_CACHE": str(cache)})
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_give_the_same_bits(tmp_path, table_dispatch):
    first = _hashes_in_a_process(tmp_path / "none.json")
    second = _hashes_in_a_process(tmp_path / "none.json")
    assert first == second
    for m, n, dtype in _PROCESS_SHAPES:  # and this process, with the same table, agrees
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
        dt = getattr(torch, dtype)
        x = torch.randn(m, n, device="cuda", dtype=dt, generator=g).requires_grad_(True)
        w = torch.randn(n, device="cuda", dtype=dt, generator=g).requires_grad_(True)
        dy = torch.randn(m, n, device="cuda", dtype=dt, generator=g)
        here = [hashlib.sha256(t.detach().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
                for t in _step(x, w, dy)]  # fmt: skip
        assert here == first[f"{m}x{n}"], (m, n)


_INVARIANCE_ROWS = 256
_INVARIANCE_M = (1, 3, 8, 37, 64, 131, 132, 512, 1000, 4096, 16384)


def _rows_across_m(n: int, dtype, ms) -> dict:
    """y of the first _INVARIANCE_ROWS rows of one input, computed in calls of m rows each
    (chunk after chunk), for each m in ms: {m: y rows}."""
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(max(ms), n, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    out = {}
    with torch.no_grad():
        for m in ms:
            rows = min(_INVARIANCE_ROWS, max(ms))
            parts = [rmsnorm(x[s : s + m], w) for s in range(0, rows, m)]
            out[m] = torch.cat(parts)[:rows]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "n", [128, 1024, 2560, 4096, 5120, 8192, 16384, 20480, 32768, 65536, 131072, 262144]
)
def test_a_rows_y_keeps_its_bits_whatever_m(table_dispatch, n, dtype):
    """Under the table every forward width's entries give a row the same bits (the tuner's
    batch_invariance makes them so); the heuristic alone (no table) picks one path and
    configuration for every M up to 65536 columns, and splits few wider rows."""
    if n > launch.SINGLE_TILE_MAX_N and not _has_table():
        pytest.skip("no dispatch table for this GPU: the heuristic splits few wide rows")
    ms = [m for m in _INVARIANCE_M if m * n <= 1 << 27]
    rows = _rows_across_m(n, dtype, ms)
    want = rows[max(ms)]
    differ = [m for m in ms if not torch.equal(rows[m], want)]
    assert not differ, f"N={n}: y rows differ from M={max(ms)}'s at M in {differ}"


def test_every_table_family_keeps_a_rows_bits(table_dispatch):
    """Each forward (dtypes, N) of the committed table whose entries pick more than one path
    or configuration across M, checked at its own classes and between them."""
    if not _has_table():
        pytest.skip("no dispatch table for this GPU")
    families = {}
    for entry in table_dispatch.entries():
        if entry.key.direction == "fwd" and not entry.key.residual:
            families.setdefault((entry.key.dtypes, entry.n), []).append(entry)
    checked = 0
    for (dtypes, n), entries in families.items():
        if len({(e.path, json.dumps(e.configs, sort_keys=True)) for e in entries}) == 1:
            continue
        classes = sorted(e.m for e in entries)
        ms = sorted({*classes, *(3 * c // 2 + 1 for c in classes[:-1])})
        rows = _rows_across_m(n, dispatch_table.parse_dtype(dtypes[0]), ms)
        want = rows[max(ms)]
        assert all(torch.equal(rows[m], want) for m in ms), (dtypes, n, ms)
        checked += 1
    print(f"{checked} forward families with choices that change with M checked")


# ---- runtime tuning, opt-in ---------------------------------------------------------------


def test_tuning_refuses_where_synchronizing_is_not_allowed(monkeypatch):
    x, w, _ = _inputs(256, _fresh_n(4096))
    with dispatch.tuning():
        torch.cuda.synchronize()
        for mode in ("warn", "error"):
            torch.cuda.set_sync_debug_mode(mode)
            try:
                with torch.no_grad(), pytest.raises(RuntimeError, match="get_sync_debug_mode"):
                    rmsnorm(x, w)
            finally:
                torch.cuda.set_sync_debug_mode(0)


def test_the_tuning_stream_is_not_one_of_the_pooled_streams():
    private = dispatch.private_stream(torch.cuda.current_device())
    pooled = {torch.cuda.Stream().cuda_stream for _ in range(128)}  # the pool cycles: all of it
    pooled |= {torch.cuda.Stream(priority=-1).cuda_stream for _ in range(128)}
    assert private.cuda_stream not in pooled
    assert private.cuda_stream != torch.cuda.current_stream().cuda_stream
    assert dispatch.private_stream(torch.cuda.current_device()) is private


def test_two_threads_tuning_one_new_class_get_the_same_bits():
    x, w, dy = _inputs(512, _fresh_n(4096))
    with dispatch.tuning() as table:
        results = _step_in_two_threads(x, w, dy)
        assert len(table) == 2  # one forward and one backward entry: each tuned once
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_env_tuning_writes_a_cache_that_a_later_process_reads(tmp_path):
    cache = tmp_path / "cache.json"
    code = """
        import json, torch
        from impls.triton_rmsnorm import launch, rmsnorm
        x = torch.randn(512, 3000, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
        launch.take_launch_configs()
        with torch.no_grad():
            rmsnorm(x, w)
            launch.take_launch_configs()
            rmsnorm(x, w)
        print(json.dumps(launch.take_launch_configs()))
    """
    tuned = json.loads(_python(code, {"RMSNORM_TRITON_TUNE": "1",
                                      "RMSNORM_TRITON_TUNE_CACHE": str(cache)}).splitlines()[-1])  # fmt: skip
    (entry,) = dispatch_table.Table.load(cache).entries()
    assert (entry.key.direction, entry.n, entry.m, entry.path) == ("fwd", 3000, 512, "single_tile")
    # the second call launches the entry, with one row a tile where 512 rows in its tiles would
    # not fill the SMs (configs.one_row_tiles)
    sms = common._programs_cap(torch.device("cuda", 0))
    as_launched = {"rmsnorm_fwd_kernel": configs.one_row_tiles(
        entry.configs["rmsnorm_fwd_kernel"], 512, 4096, 2, sms)}  # fmt: skip
    assert tuned == as_launched
    later = json.loads(_python(code, {"RMSNORM_TRITON_TUNE_CACHE": str(cache)}).splitlines()[-1])
    assert later == as_launched  # read, not tuned again (the file is unchanged)
    assert len(dispatch_table.Table.load(cache)) == 1
