"""Probe: where the narrow backward's last 15-20% of the copy goes (128-1024 columns).

At 262144x128, 65536x512 and 32768x1024 bf16 (201 MB moved each) the product's backward ran at
80.4-80.7% of the copy (run 3), against 92-95% at 32768x4096 and 65536x8192. Split its time
into a per-row cost and a fixed one: the product's whole backward (main kernel and the dw
reduction) and its main kernel alone, each at M/2, M and 2M rows of the same N, device-only
(the tuner's timer, each shape tuned as the product tunes it). The slope over M gives the
steady-state bandwidth; the intercept the fixed cost (launches, the pipeline's fill and drain,
the reduction).

Prediction: a fixed cost of 5-8 µs a call (the reduction 2-3 µs, the fill of a 3-4 stage
pipeline at one program per SM), a slope near 90% of the copy.

Ran at 9f8e745f6e43, whose launch._backward_launch launched the main kernel alone; since v19
every backward path ends with its own reduction (launch._reduce_partials), so rerunning it
needs that split back.

Run from the repository root on a GPU:
    PYTHONPATH=.:results/nvidia-h200/probes python results/nvidia-h200/probes/backward_narrow_fixed_cost.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(262144, 128), (65536, 512), (32768, 1024), (32768, 4096)]
SCALES = (0.5, 1, 2)
COPY_GBPS = 4250.0  # the 2 GiB copy on the H200 (harness ceiling, run 3: within 1%)


def _runs(has_reduce: bool):
    def run(a):
        dy, x, w, rstd, dx, dw = a
        if has_reduce:
            launch._backward_launches(dy, x, w, rstd, 0.0, dx, dy, False, dw)
        else:
            launch._backward_launch(dy, x, w, rstd, 0.0, dx, dy, False)

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    out = []
    print("µs per call (GB/s of 3MN); slope = steady-state GB/s, fixed = intercept µs", flush=True)
    for m0, n in SHAPES:
        points = {"whole": [], "main": []}
        for scale in SCALES:
            m = int(m0 * scale)
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
            args = (dy, x, w, rstd, torch.empty_like(x), torch.empty_like(w))
            launch._backward_launches(dy, x, w, rstd, 0.0, args[4], dy, False, args[5])  # tunes
            torch.cuda.synchronize()
            stream.wait_stream(torch.cuda.current_stream())
            arg_sets = tuning.rotating_arguments(args, l2)
            times = time_runs({"whole": _runs(True), "main": _runs(False)}, arg_sets, stream)
            nbytes = 3 * m * n * 2
            for name, us in times.items():
                points[name].append((nbytes, us))
            print(f"{m:7d}x{n:5d}  whole {times['whole']:7.2f} ({nbytes / times['whole'] / 1e3:4.0f})"
                  f"  main {times['main']:7.2f} ({nbytes / times['main'] / 1e3:4.0f})  "
                  f"{launch.take_launch_configs()}", flush=True)  # fmt: skip
        fits = {}
        for name, pts in points.items():
            (b0, t0), (b2, t2) = pts[0], pts[-1]
            slope = (t2 - t0) / (b2 - b0)  # µs per byte
            fits[name] = {"slope_gbps": 1e-3 / slope, "fixed_us": t0 - slope * b0,
                          "slope_pct_copy": 100 * 1e-3 / slope / COPY_GBPS}  # fmt: skip
            print(f"   {name}: slope {fits[name]['slope_gbps']:5.0f} GB/s "
                  f"({fits[name]['slope_pct_copy']:.1f}% of the copy), fixed "
                  f"{fits[name]['fixed_us']:5.2f} µs", flush=True)  # fmt: skip
        out.append({"m": m0, "n": n, "points": points, "fits": fits})
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
