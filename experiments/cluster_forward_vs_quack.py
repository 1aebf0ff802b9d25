"""Probe: the cluster forwards beside QuACK's forward, in one process, with one timer.

QuACK's forward was timed at the copy's floor at 1024x131072 bf16 in a fresh process by the
harness (134.1 µs against the product's 140.9, `2026-11-30-aca54a9df4b3-harness-vs-tuner-timing.txt`);
the staged cluster forward (`cluster_forward_staged_ab.py`) ran 0.97-0.99x the product at 256-1024
rows in another process. Here, in one process with the tuner's timer (device-only, best of two
interleaved passes, outputs allocated per call): the product, the warp-partials cluster forward,
the staged one, and QuACK's forward as the harness builds it (impls' quack backend, x and w not
requiring grad), at 64-1024 x 131072 bf16.

Prediction: QuACK 1.04-1.06x the product at 256-1024 rows, as in the harness; the staged
cluster forward 0.92-0.94x QuACK.

Run from the repository root on an sm_90 GPU with QuACK installed:
    PYTHONPATH=.:experiments python experiments/cluster_forward_vs_quack.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_registers_ab import EPS
from cluster_forward_staged_ab import _staged_forward
from cluster_forward_warp_exchange_ab import _warp_forward

from impls import get_backend
from impls.triton_rmsnorm import launch, tuning


def main(out_path: str) -> None:
    quack = get_backend("quack").build()
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m in (64, 256, 512, 1024):
        n = 131072
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        runs = {
            "product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "warp partials": lambda a: _warp_forward(a[0], a[1]),
            "staged": lambda a: _staged_forward(a[0], a[1]),
            "quack": lambda a: quack(a[0], a[1], EPS),
        }
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product, x QuACK)", flush=True)
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  "
                  f"{us['quack'] / t:.3f}x  {name}", flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "us": us})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
