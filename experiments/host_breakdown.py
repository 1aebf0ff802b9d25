"""Probe: where our op's host time goes, call by call and layer by layer, beside torch's
F.rms_norm, at a decode shape and a wide training shape (issue 30, item 5).

Each line: host microseconds a call, median of 5 back-to-back batches (the GPU never waits: every
shape's kernels take less device time than the host spends). Then a cProfile of forward+backward.
Run on a CUDA machine from the repository root:
    PYTHONPATH=. python experiments/host_breakdown.py [OUT.txt]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from triton.runtime.driver import driver

from impls.triton_rmsnorm import direct, function, launch, replays
from impls.triton_rmsnorm.function import rmsnorm

LINES: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    LINES.append(text)


def timed(label: str, f, n: int = 2000) -> float:
    for _ in range(100):
        f()
    torch.cuda.synchronize()
    batches = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n // 5):
            f()
        batches.append((time.perf_counter() - t) / (n // 5) * 1e6)
        torch.cuda.synchronize()
    us = statistics.median(batches)
    say(f"  {label:52s} {us:8.2f} us")
    return us


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def shape_lines(m: int, n: int, dtype: torch.dtype) -> None:
    say(f"== {m}x{n} {dtype}")
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    xd, wd = x.detach(), w.detach()
    # whole calls, torch then ours
    with torch.no_grad():
        timed("torch F.rms_norm no-grad forward", lambda: F.rms_norm(xd, (n,), wd, 1e-6))
        timed("ours rmsnorm no-grad forward", lambda: rmsnorm(xd, wd, 1e-6))
    timed("torch F.rms_norm grad-mode forward", lambda: F.rms_norm(x, (n,), w, 1e-6))
    timed("ours rmsnorm grad-mode forward", lambda: rmsnorm(x, w, 1e-6))
    timed("torch fwd+bwd (backward(dy))", lambda: F.rms_norm(x, (n,), w, 1e-6).backward(dy))
    timed("ours fwd+bwd (backward(dy))", lambda: rmsnorm(x, w, 1e-6).backward(dy))
    yt = F.rms_norm(x, (n,), w, 1e-6)
    timed("torch backward only (retain_graph)", lambda: yt.backward(dy, retain_graph=True))
    yo = rmsnorm(x, w, 1e-6)
    timed("ours backward only (retain_graph)", lambda: yo.backward(dy, retain_graph=True))
    x.grad = w.grad = None
    # autograd's own share: a Python Function that does nothing
    timed("Identity.apply (Python autograd.Function)", lambda: Identity.apply(x))
    timed("Identity fwd+bwd", lambda: Identity.apply(x).backward(dy))
    x.grad = None
    # our layers
    timed("validate_inputs", lambda: function.validate_inputs(x, w, 1e-6, 0.0, None))
    timed("_needs_grad", lambda: function._needs_grad(x, w, None))
    timed("_x_rows", lambda: function._x_rows(xd))
    timed("launch.rmsnorm_forward", lambda: launch.rmsnorm_forward(xd, wd, 1e-6))
    _, rstd, _ = launch.rmsnorm_forward(xd, wd, 1e-6)
    timed("launch.rmsnorm_backward", lambda: launch.rmsnorm_backward(dy, xd, wd, rstd))
    timed("fwd replay key", lambda: replays._forward_replay_key(xd, wd, None))
    timed("bwd replay key", lambda: replays._backward_replay_key(dy, xd, wd, rstd, None))
    timed("_is_current", lambda: replays._is_current(0))
    timed("x.new_empty((m, n))", lambda: xd.new_empty((m, n)))
    timed("x.new_empty((m,), fp32)", lambda: xd.new_empty((m,), dtype=torch.float32))
    timed("torch.empty((m, n)) device=", lambda: torch.empty((m, n), dtype=dtype, device=xd.device))
    timed("x.get_device()", lambda: xd.get_device())
    timed("torch.cuda.current_device()", lambda: torch.cuda.current_device())
    timed("get_current_stream(0)", lambda: driver.active.get_current_stream(0))
    timed("_tritons_path_required", lambda: direct._tritons_path_required(None))
    key = replays._forward_replay_key(xd, wd, None)
    found = replays.recorded().get(key)
    if found is None:
        say("  (no forward replay recorded)")
        return
    (replay,), _configs, _extra = found
    y = torch.empty_like(xd)
    r = torch.empty((m,), device="cuda", dtype=torch.float32)
    args = launch._single_tile_forward_args(xd, wd, y, r, xd, xd, (n, n, n, n), 1e-6, 0.0)
    timed("_single_tile_forward_args", lambda: launch._single_tile_forward_args(
        xd, wd, y, r, xd, xd, (n, n, n, n), 1e-6, 0.0))  # fmt: skip
    timed("Replay.__call__ (preallocated)", lambda: replay(0, *args))
    compiled, grid, tail = replay.compiled, replay.grid, replay.tail
    stream = driver.active.get_current_stream(0)
    run = compiled.run
    fn, meta = compiled.function, compiled.packed_metadata
    timed("compiled.run, tensor args", lambda: run(*grid, stream, fn, meta, None, None, None,
                                                  *args, *tail))  # fmt: skip
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    timed("compiled.run, data_ptr ints", lambda: run(*grid, stream, fn, meta, None, None, None,
                                                    *ints, *tail))  # fmt: skip
    timed("7 x data_ptr()", lambda: [a.data_ptr() for a in args[:6]] + [y.data_ptr()])
    # profile of forward+backward
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        rmsnorm(x, w, 1e-6).backward(dy)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    say(text.getvalue())


def main() -> None:
    say(f"torch {torch.__version__}, GPU {torch.cuda.get_device_name()}")
    for m, n, dtype in ((64, 4096, torch.bfloat16), (1024, 8192, torch.float16)):
        shape_lines(m, n, dtype)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
