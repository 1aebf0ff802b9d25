"""Probe: one row split over a cluster of 8 CTAs, at M = 1-16 and N = 4096-16384 (issue 30 item 7).

At 1x16384 bf16 our forward takes 2.21 µs (one program holds the row, 32 warps) against
cuDNN's 1.61 and FlashInfer's 2.13 (run 28, `2026-12-03-ed3115ab0ac8-models-bf16.jsonl`). The
gap grows with N (1x4096 1.39 against FlashInfer's 1.33). One SM pulls the row's 32 KB of x and
32 KB of w. That takes about 1000 cycles at ~64 B/clock from L2, which is most of the gap.
Splitting the row over 8 SMs divides that by 8. It adds a cluster launch and one exchange of
partial sums through distributed shared memory.

The kernel is cluster_forward_ab.py's (`rmsnorm_cluster_fwd`, MODE 0 or 1: DSMEM, one row a
cluster, x and w in registers). It was measured at 64-1024 rows of 131072-262144 columns, where
it ran 1.064x the product at 64x131072 (`2026-11-30-aca54a9df4b3-cluster-forward-ab-*`). Here it
is timed at the decode and models widths with few rows, beside:
- the product's default call (launch.rmsnorm_forward: its table, launched with PDL);
- the registry's leading peers (forward_mid_m_gap.py's: FlashInfer with and without PDL, cuDNN,
  QuACK, Liger and its CuTe DSL backend, torch.compile).

All of them use the tuner's timer, in one process (best of two interleaved passes).

The cluster kernel is launched without PDL. Against the product's PDL launch that costs it
~0.4 µs at these sizes (perf log, twenty-fifth session), so a cluster time under the product's
is a lower bound on the gain.

Checked first, at each shape (cluster_forward_ab.py's check): y against the fp64 reference
(elements more than 1 ulp off) and rstd (largest relative difference).

Prediction: the cluster kernel at 1.5-1.8 µs at 1x16384 (cuDNN's pace), 1.2-1.4x the product
there; no gain at 4096 columns, where one program already moves the row in about the launch
latency.

Run from the repository root on an sm_90 GPU, the peers' environment sourced, one mode a
process (a mode that hangs is killed by the caller's timeout):
    PYTHONPATH=.:experiments:$PYTHONPATH python experiments/cluster_forward_one_row_ab.py MODE out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_ab import _check, _cluster_forward
from forward_mid_m_gap import _peer_runs

from impls.triton_rmsnorm import launch, tuning

EPS = 1e-6
#: (M, N, warps a CTA): N / 8 columns a CTA (a power of two: gl.arange), a multiple of the
#: layout's 256 x warps columns.
SHAPES = [(1, 2048, 1), (1, 4096, 2), (1, 8192, 4), (1, 16384, 4), (1, 16384, 8), (4, 16384, 4),
          (16, 16384, 4)]  # fmt: skip


def main(mode: int, out_path: str) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "mode": mode, "rows": []}
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m, n, warps in SHAPES:
        check = _check(mode, m, n, warps)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        launched = launch.take_launch_configs()
        runs = {
            "product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "cluster": lambda a, warps=warps: _cluster_forward(a[0], a[1], mode, warps),
            **_peer_runs(x, w),
        }
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"MODE {mode} {m}x{n} bf16 {warps} warps: "
              + ", ".join(f"{k} {v:.2f}" for k, v in us.items())
              + f" µs; product / cluster {us['product'] / us['cluster']:.3f}; check {check}",
              flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "warps": warps, "us": us, "check": check,
                               "launched": launched})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
