"""Probe: what the grouped forward's per-call zeroing of its exchange words costs, device-only.

The product zeroes SUMS (torch.zeros: a memset node of its own under CUDA graphs) before every
grouped launch, because a word's tag is its row + 1 and a stale word from an earlier call would
look published. The fill-and-drain probes put the grouped forward's fixed cost at 5.7-7.5 µs a
call against the copy kernel's 2.1-2.8, the zeroing "1-3 µs" of it
(`...-6e0569859fab-grouped-fill-drain.txt`). Here its cost alone: a CUDA graph of K launches
over K rotating copies of the inputs, with
- "zero each": torch.zeros before each launch (the product);
- "zero once per K": one buffer of K x M x GROUP words zeroed once at the graph's start,
  launch k using slice k (each slice fresh in each replay, so no stale tags).
Time per launch = graph time / K, median of 5 samples, best of two interleaved passes; the
product's first configuration (4096-column slices, RING 3, 6 an SM) and its second (8192, 2, 4).

Prediction: 1-3 µs a call saved (the memset node and its dependency), most visible at 64 rows.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_forward_zeroing_cost.py out.json
"""

import json
import statistics
import sys

import torch
import triton

from impls.triton_rmsnorm import direct, gluon_kernels, launch, tuning

SHAPES = [(64, 131072), (256, 131072), (512, 131072), (256, 262144), (64, 1048576)]
K = 8


def _launcher(m, n, config):
    device = torch.device("cuda", 0)
    group = launch.cdiv(n, config.slice_n)
    per_sm = launch._held_group_forward_programs_per_sm(0, config)
    groups = launch._group_count(m, group, device, per_sm)
    constexprs = {"GROUP": group, "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "SLICE": config.slice_n, "RING": config.ring, "WARPS": config.warps}  # fmt: skip
    meta = {"N": n, **constexprs, "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT,
            "num_warps": config.warps, "launch_cooperative_grid": True}  # fmt: skip

    def run(a, sums):
        x, w, y, rstd = a
        args = (x, w, y, rstd, sums, x.stride(0), y.stride(0), m, 1e-6, 0.0,
                launch.HELD_GROUP_TAG_OFFSET)  # fmt: skip
        direct.launch(gluon_kernels.rmsnorm_fwd_held_group_kernel, (groups * group,), args,
                      meta, 0)  # fmt: skip

    return run, group


def _graph_us(body, stream) -> float:
    with torch.cuda.stream(stream):
        body()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            body()
        finally:
            graph.capture_end()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(5):
            start.record()
            for _ in range(20):
                graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / (20 * K))
    return statistics.median(samples)


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    rows = []
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        sets = [(x, w, torch.empty_like(x), torch.empty(m, device="cuda"))]
        sets += [tuple(tuning._copy(t) for t in sets[0]) for _ in range(K - 1)]
        for config in launch.HELD_GROUP_FORWARDS:
            run, group = _launcher(m, n, config)
            pool = torch.empty(K * m * group, dtype=torch.int64, device="cuda")

            words = m * group

            def zero_each(run=run, words=words, sets=sets):
                for a in sets:
                    run(a, torch.zeros(words, dtype=torch.int64, device="cuda"))

            def zero_once(run=run, words=words, sets=sets, pool=pool):
                pool.zero_()
                for k, a in enumerate(sets):
                    run(a, pool[k * words : (k + 1) * words])

            stream.wait_stream(torch.cuda.current_stream())
            times = {"zero each": [], "zero once per K": []}
            for rep in range(2):
                order = list(times) if rep == 0 else list(reversed(times))
                for name in order:
                    body = zero_each if name == "zero each" else zero_once
                    times[name].append(_graph_us(body, stream))
            torch.cuda.current_stream().wait_stream(stream)
            best = {name: min(ts) for name, ts in times.items()}
            saved = best["zero each"] - best["zero once per K"]
            print(f"{m}x{n} slice {config.slice_n}: zero each {best['zero each']:.2f} µs, zero "
                  f"once per {K} {best['zero once per K']:.2f} µs: {saved:.2f} µs a call "
                  f"({best['zero each'] / best['zero once per K']:.3f}x)", flush=True)  # fmt: skip
            rows.append({"m": m, "n": n, "config": config._asdict(), "us": best})
        del x, sets
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                   "k": K, "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
