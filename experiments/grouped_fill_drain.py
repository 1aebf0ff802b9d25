"""Probe (written offline in the fourteenth session, not yet run): where the grouped kernels'
time goes, a fixed cost a call against a cost a row, at a fixed width.

In run 4 (2026-11-30-54cf7de0323a-wide.jsonl) the grouped forward ran at 81-84% of the copy at
131072-1048576 columns and the grouped backward at 72-75% (59% at 1048576), against QuACK's
89-91% forward. Two explanations are left (perf log, v24): each group fills its pipeline on its
first row and drains it on its last, and the exchange makes a row wait for its slowest member.
The first is a fixed cost a call, the second a cost a row. Here the product's forward and
backward (launch.rmsnorm_forward, launch.rmsnorm_backward, their measured paths) at fixed N over
M from a few rows a group to 32x more, device-only (the tuner's timer over rotating inputs), and
harness.ceiling's copy kernel over the same bytes (forward: M x N elements in, as many out;
backward: 1.5 x M x N in and out, the model's 3MN). A least-squares line t(M) = a + b M gives a
fixed cost a and a cost a row b; b's bandwidth is the steady state.

Prediction: the forward's steady state at 88% of the copy's or more and a at 8-15 µs (two rows
a group plus the launch and the exchange buffer's zeroing); the backward's steady state at
80-85%, and a larger at 1048576 (two groups of 64 programs).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/grouped_fill_drain.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from harness.ceiling import triton_copy
from impls.triton_rmsnorm import launch, tuning

#: N -> the row counts: the smallest gives a few rows to each group of the forward's 4096-column
#: configuration (6 programs an SM: 24 groups at 131072, 12 at 262144, 3 at 1048576).
WIDTHS = {
    131072: [48, 96, 192, 384, 768, 1536],
    262144: [24, 48, 96, 192, 384, 768],
    1048576: [6, 12, 24, 48, 96, 192],
}


def _fit(ms: list[int], us: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares line us = a + b * m."""
    n = len(ms)
    mean_m, mean_t = sum(ms) / n, sum(us) / n
    b = sum((m - mean_m) * (t - mean_t) for m, t in zip(ms, us, strict=True))
    b /= sum((m - mean_m) ** 2 for m in ms)
    return mean_t - b * mean_m, b


def _forward(a):
    launch.rmsnorm_forward(a[0], a[1], 1e-6)


def _backward(a):
    x, w, dy, rstd = a
    launch.rmsnorm_backward(dy, x, w, rstd)


def _copy(a):
    triton_copy(a[0], a[1])


def _zero(a):
    a[0].zero_()


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": [], "fits": []}
    for n, row_counts in WIDTHS.items():
        times = {"fwd": [], "bwd": [], "copy fwd": [], "copy bwd": [], "zeroing": []}
        for m in row_counts:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
            launch.rmsnorm_backward(dy, x, w, rstd)
            launched = sorted(launch.take_launch_configs())
            src_fwd, dst_fwd = torch.empty_like(x), torch.empty_like(x)
            src_bwd = torch.empty(3 * m * n // 2, device="cuda", dtype=torch.bfloat16)
            dst_bwd = torch.empty_like(src_bwd)
            sums = torch.empty(m * launch.cdiv(n, 4096), device="cuda", dtype=torch.int64)
            cases = {"fwd": (_forward, (x, w)), "bwd": (_backward, (x, w, dy, rstd)),
                     "copy fwd": (_copy, (src_fwd, dst_fwd)),
                     "copy bwd": (_copy, (src_bwd, dst_bwd)),
                     "zeroing": (_zero, (sums,))}  # fmt: skip
            us = {}
            for name, (run, args) in cases.items():
                arg_sets = tuning.rotating_arguments(args, l2)
                stream.wait_stream(torch.cuda.current_stream())
                us[name] = time_runs({name: run}, arg_sets, stream)[name]
                times[name].append(us[name])
            line = "  ".join(f"{k} {v:7.1f} µs" for k, v in us.items())
            print(f"{m}x{n}: {line}  {launched}", flush=True)
            result["rows"].append({"m": m, "n": n, "us": us, "launched": launched})
        for name, series in times.items():
            a, b = _fit(row_counts, series)
            elements = n * (3 if name.endswith("bwd") else 2)
            steady = elements * 2 / (b * 1e3)  # GB/s of the cost a row
            print(f"N={n} {name:8s}: fixed {a:6.1f} µs, a row {b:6.2f} µs "
                  f"({steady:5.0f} GB/s, {steady / 42.5:4.1f}% of 4250)", flush=True)  # fmt: skip
            result["fits"].append({"n": n, "case": name, "fixed_us": a, "row_us": b,
                                   "steady_gbps": steady})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
