"""Probe: what the grouped kernels' wait on partners costs, v20's backward and v21's forward.

launch.HELD_GROUP_ARRIVALS_START set far above any group's size makes every row's arrival
count look complete from the start: no program ever polls, each sums whatever the DOT buffer
holds (a diagnostic, not a norm: the results are wrong), while every copy, publish and store
still happens. The difference from the product's times is the wait (and the row's slowest
member's pace). v21's forward probe found none at 4 programs an SM
(`2026-11-30-bb689b9d08e7-forward-held-group-sweep.txt`, its EXCHANGE switch); v20's backward,
at 54-65% of the copy against v19's 73-87% with a row a program, has not been asked. Whole
calls of each path (launch._backward_held_group, launch._forward_held_group), device-only, the
tuner's timer, best of two interleaved passes.

Prediction: the backward gains 10-20% without the wait if the exchange is what holds it back;
within 3% if not.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_no_wait.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(1024, 65536), (2048, 65536), (512, 131072), (256, 262144), (64, 1048576)]
NO_WAIT = 1 << 30


def _with_start(path, start):
    def run(a):
        launch.HELD_GROUP_ARRIVALS_START = start
        try:
            path(a)
        finally:
            launch.HELD_GROUP_ARRIVALS_START = 0

    return run


def _backward(a):
    dy, x, w, rstd, dx, dw, y = a
    config = launch.HELD_GROUP_BACKWARDS[1]  # the one it measured (the only one, before v28)
    launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dy, False, dw, config=config)


def _forward(a):
    dy, x, w, rstd, dx, dw, y = a
    launch._forward_held_group(x, w, y, rstd, x, x, (x.stride(0), y.stride(0), 0, 0), 1e-6, 0.0,
                               False)  # fmt: skip


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("GB/s (bwd 3MN, fwd 2MN), % of 4250; no wait / product", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        args = (dy, x, w, rstd, torch.empty_like(x), torch.empty_like(w), torch.empty_like(x))
        runs = {}
        for name, path in (("bwd", _backward), ("fwd", _forward)):
            if name == "fwd" and n <= launch.HELD_ROW_MAX_N:
                continue  # v21 serves past 131072 columns only
            runs[(name, "product")] = _with_start(path, 0)
            runs[(name, "no wait")] = _with_start(path, NO_WAIT)
        for run in runs.values():
            run(args)
        torch.cuda.synchronize()
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        row = {"m": m, "n": n, "us": {f"{a} {b}": t for (a, b), t in times.items()}}
        for name, moved in (("bwd", 3), ("fwd", 2)):
            if (name, "product") not in times:
                continue
            gb = moved * m * n * 2 / 1e3
            p, q = times[(name, "product")], times[(name, "no wait")]
            print(f"{m:5d}x{n:7d} {name}: product {gb / p:5.0f} ({gb / p / 42.5:4.1f}%)  no wait "
                  f"{gb / q:5.0f} ({gb / q / 42.5:4.1f}%)  {p / q:.3f}x", flush=True)  # fmt: skip
        rows.append(row)
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
