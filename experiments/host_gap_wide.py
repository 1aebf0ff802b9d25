"""Probe: why the wide paths' host-inclusive time (do_bench) falls far below their device-only
time (CUDA-graph replay) while the peers' does not.

In the wide run of 05adc346041a, 256x262144 bf16: our forward 3123 GB/s device-only, 2041
host-inclusive (QuACK 3824 and 3663); our backward 2702 and 1684 (torch.compile 1725 and 1165).
do_bench flushes L2 before each rep (a 256 MB zero_, ~85 µs of device time) and launches
asynchronously, so the host's work for a call hides behind the device's unless it exceeds the
device time of a flush and a call, or something waits on the device. Here, per path (the
product's measured choice, and the looped or wide path forced):
- enqueue: host µs per call of 20 calls back to back, no synchronization;
- synced: median µs of a call followed by a synchronize;
- do_bench: the harness's host-inclusive median; graph: device-only (tuning._median_ms);
- the CUDA runtime calls of 5 calls under torch.profiler (cudaStreamSynchronize, cudaMalloc,
  cudaLaunchCooperativeKernel...), with their host time;
- the Python functions with the most host time over 20 calls (cProfile).

Run from the repository root on a CUDA GPU:
    PYTHONPATH=.:experiments python experiments/host_gap_wide.py out.txt
"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
import triton.testing

from impls.triton_rmsnorm import launch, rmsnorm, tuning

SHAPES = [(256, 262144), (1024, 65536), (4096, 16384)]


def _paths(m, n, x, w, dy):
    def fwd():
        launch.rmsnorm_forward(x, w, 1e-6)

    xr = x.detach().requires_grad_(True)
    wr = w.detach().requires_grad_(True)
    y = rmsnorm(xr, wr, 1e-6)

    def bwd():
        torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)

    return {"fwd": fwd, "bwd": bwd}


def _measure(fn, out, graphable):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        fn()
    enqueue = (time.perf_counter() - start) / 20 * 1e6
    torch.cuda.synchronize()
    synced = []
    for _ in range(20):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        synced.append((time.perf_counter() - t) * 1e6)
    bench = triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3
    graph = float("nan")
    if graphable:  # (autograd's backward cannot be captured on the tuner's side stream)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = tuning._median_ms(lambda a: fn(), [()], stream) * 1e3
        torch.cuda.current_stream().wait_stream(stream)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    calls = {}
    for e in prof.key_averages():
        if e.key.startswith("cuda") or e.key.startswith("cu"):
            calls[e.key] = (e.count, round(e.cpu_time_total / 5, 1))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(8)
    hot = [ln for ln in text.getvalue().splitlines() if ln.strip()][-9:]
    line = (f"enqueue {enqueue:7.1f}  synced {statistics.median(synced):7.1f}  do_bench {bench:7.1f}"
            f"  graph {graph:7.1f} µs")  # fmt: skip
    print(line, flush=True)
    print(f"      runtime calls a call (count over 5, host µs a call): {calls}", flush=True)
    print("\n".join(hot), flush=True)
    out.write(line + "\n" + f"      {calls}\n" + "\n".join(hot) + "\n")


DECISIONS = ("forward_holds_row_in_group", "forward_holds_row_on_chip",
             "backward_holds_row_in_group", "backward_holds_row_on_chip")  # fmt: skip


def main(out_path):
    original = {name: getattr(launch, name) for name in DECISIONS}
    with open(out_path, "w") as out:
        for m, n in SHAPES:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            for forced in (False, True):
                for decision in DECISIONS:  # forced: the looped / wide paths only
                    setattr(launch, decision, (lambda *a: False) if forced else original[decision])
                for name, fn in _paths(m, n, x, w, dy).items():
                    fn()
                    torch.cuda.synchronize()
                    used = sorted(launch.take_launch_configs())
                    head = f"{m}x{n} {name} {'forced default' if forced else 'product'} {used}"
                    print(head, flush=True)
                    out.write(head + "\n")
                    _measure(fn, out, graphable=name == "fwd")
            for decision in DECISIONS:
                setattr(launch, decision, original[decision])


if __name__ == "__main__":
    main(sys.argv[1])
