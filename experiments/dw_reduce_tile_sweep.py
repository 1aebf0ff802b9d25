"""Probe: the dw reduction's tile (kernels.rmsnorm_dw_reduce_kernel) against the number of
partial rows, after `...-d1891c3c1f47-grouped-backward-breakdown.txt`.

That probe found the reduction alone at 7.9 µs over the grouped backward's [16, 131072] and
[8, 262144] partials (8 MB) and 22.3 µs over [2, 1048576] (8 MB): 1-4% of the copy's speed.
Its tile is every partial row (padded to a power of two) x DW_REDUCE_BLOCK_N = 32 columns, 8
warps: sized for the narrow backward's ~132 partial rows (a 256 x 32 tile), it leaves a
program 64 elements at 2 rows, 32768 programs for 1M columns. Here the kernel at BLOCK_N 32 to
2048 and 4 or 8 warps over partial rows of 2 to 132 and widths of 4096 to 1048576, device-only
(the tuner's timer, best of two interleaved passes), GB/s of the rows x N x 4 bytes read and
the N x 2 written.

Prediction: a tile of ~4096-8192 elements (BLOCK_N = 8192 / rows padded, at least 32) within
10% of the best at every case, 3-8x the current at 2-16 rows; unchanged at 132 rows.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/dw_reduce_tile_sweep.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import kernels, launch, tuning

ROWS = [2, 8, 16, 64, 132]
WIDTHS = [4096, 32768, 131072, 1048576]
BLOCKS = [32, 128, 512, 1024, 2048]
WARPS = [4, 8]


def _run(rows, n, block_n, warps):
    block_rows = min(launch.next_power_of_2(rows), launch.DW_REDUCE_MAX_ROWS)
    grid = (launch.cdiv(n, block_n),)

    def run(a):
        kernels.rmsnorm_dw_reduce_kernel[grid](
            a[0], a[1], rows, n, BLOCK_ROWS=block_rows, BLOCK_N=block_n, num_warps=warps
        )

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    for n in WIDTHS:
        for rows in ROWS:
            partial = torch.randn(rows, n, device="cuda")
            dw = torch.empty(n, device="cuda", dtype=torch.bfloat16)
            reference = partial.sum(0).to(torch.bfloat16)
            runs, checks = {}, {}
            for block_n in BLOCKS:
                for warps in WARPS:
                    if block_n * launch.next_power_of_2(rows) > 65536:
                        continue
                    run = _run(rows, n, block_n, warps)
                    dw.fill_(float("nan"))
                    run((partial, dw))
                    checks[(block_n, warps)] = float((dw.float() - reference.float()).abs().max())
                    runs[(block_n, warps)] = run
            arg_sets = tuning.rotating_arguments((partial, dw), l2)
            stream.wait_stream(torch.cuda.current_stream())
            times = time_runs(runs, arg_sets, stream)
            moved = rows * n * 4 + n * 2
            current = times[(launch.DW_REDUCE_BLOCK_N, launch.DW_REDUCE_WARPS)]
            best = min(times, key=times.get)
            line = "  ".join(f"{b}/{w} {times[(b, w)]:5.1f}" for b, w in times)
            print(f"[{rows}, {n}]: current {current:5.1f} µs ({moved / (current * 1e3):5.0f} GB/s), "
                  f"best {best} {times[best]:5.1f} µs ({moved / (times[best] * 1e3):5.0f} GB/s, "
                  f"{current / times[best]:.2f}x)  |  {line}", flush=True)  # fmt: skip
            result["rows"].append({"rows": rows, "n": n,
                                   "us": {f"{b}/{w}": t for (b, w), t in times.items()},
                                   "max_abs_diff": {f"{b}/{w}": d for (b, w), d in checks.items()}})  # fmt: skip
            with open(out_path, "w") as f:
                json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
