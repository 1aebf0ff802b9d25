"""Probe: the two cluster forwards of the eighteenth session at N = 65536, beside the product.

At N = 65536 the product's forward is the single tile (one program a row, the row in registers,
one program an SM at 32 warps): 0.92 (bf16) and 0.95 (fp16) of QuACK at 512x65536, 0.955-0.978
at 1024x65536, 0.99 at 2048x65536 (runs 9-10 of the results page). QuACK holds such a row
across a cluster of CTAs. The cluster forwards probed at 131072 columns
(`cluster_forward_warp_exchange_ab.py`: each warp's partial sum sent to every peer CTA;
`cluster_forward_staged_ab.py`: x staged in shared memory by cp.async) ran 0.93-0.99 of QuACK
there (`2026-11-30-aca54a9df4b3-cluster-forward-vs-quack.txt`). Their kernels take any N that 8
CTAs x the warps divide; here each CTA holds 8192 columns.

Prediction: 1.00-1.04x the product at 512-1024 rows (0.93-0.95 of QuACK, which runs 1.02-1.09x
the product there), no gain at 2048 rows.

Checked against fp64 (y within an ulp, rstd) before timing; timed as the other probes
(ab_timing: device-only, best of two interleaved passes, outputs allocated per call), bf16.

Run from the repository root on an sm_90 GPU (Triton 3.6):
    PYTHONPATH=.:experiments python \
        experiments/cluster_forward_65536_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_registers_ab import EPS
from cluster_forward_staged_ab import _check, _staged_forward
from cluster_forward_warp_exchange_ab import _warp_forward

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(256, 65536), (512, 65536), (1024, 65536), (2048, 65536)]


def main(out_path: str) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m, n in SHAPES:
        check = _check(m, n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        launched = launch.take_launch_configs()
        runs = {
            "product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "warp partials": lambda a: _warp_forward(a[0], a[1]),
            "staged": lambda a: _staged_forward(a[0], a[1]),
        }
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product); product {launched}; check {check}",
              flush=True)  # fmt: skip
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  {name}", flush=True)
        result["rows"].append({"m": m, "n": n, "us": us, "check": check, "launched": launched})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
