"""Probe (perf log, v9 lead): is the wide forward's gap the L2? The persistent looped forward
reads each row twice; the second read comes from L2 only while the rows in flight (one per
program) fit in it. At 256x262144 the tuned grid (2 programs per SM) holds 264 rows of 512 KB
in flight, twice the 60 MiB L2, and the kernel runs at 2630 GB/s of the 2·M·N model: 3945 GB/s
if every second read goes to HBM, i.e. at the copy ceiling of three passes.

Sweeps the looped kernel's grid below the SM count (fewer rows in flight) against chunk width,
warps and LOOP_STAGES, bf16, device-only (CUDA-graph replay over rotating inputs > 3x the L2),
beside the product's own pick. The prediction: a grid whose rows in flight fit in a third of
the L2 runs >= 3300 GB/s at N >= 131072, if that many programs keep enough bytes in flight.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/looped_forward_grid_sweep.py out.json
"""

import json
import sys
import time

import torch
from triton.runtime.errors import OutOfResources

from harness import timing
from impls.triton_rmsnorm import kernels, launch

SHAPES = [(256, 262144), (512, 131072), (1024, 65536), (2048, 32768)]
GRIDS = (16, 33, 44, 66, 99, 132, 264)
BLOCKS_AND_WARPS = ((4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16), (16384, 32))
STAGES = (3, 4)


def make_inputs(m: int, n: int) -> list:
    sets = timing.rotating_sets(2 * m * n * 2)
    out = []
    for _ in range(sets):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out.append((x, w, torch.empty_like(x), torch.empty(m, device="cuda")))
    return out


def device_us(calls, stream) -> float:
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def looped_call(x, w, y, rstd, grid, block_n, warps, stages):
    m, n = x.shape

    def call():
        kernels.rmsnorm_fwd_looped_kernel[(grid,)](
            x, w, y, rstd, x, x, x.stride(0), y.stride(0), x.stride(0), x.stride(0),
            m, n, 1e-6, 0.0, m.bit_length(), BLOCK_N=block_n, HAS_RESIDUAL=False,
            PROGRAMS_PER_SM=1, LOOP_STAGES=stages, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    return call


def main(out: str) -> None:
    stream = torch.cuda.Stream()
    rows, start = [], time.time()
    for m, n in SHAPES:
        kb = 2 * m * n * 2 / 1e3  # the model's bytes in kB: kB / µs = GB/s
        inputs = make_inputs(m, n)
        launch.take_launch_configs()
        us = device_us(
            [lambda a=a: launch.rmsnorm_forward(a[0], a[1], 1e-6) for a in inputs], stream
        )
        tuned = launch.take_launch_configs()
        rows.append({"m": m, "n": n, "config": "product", "tuned": tuned, "us": us})
        print(f"{m:5d}x{n:6d} product {kb / us:5.0f} GB/s {tuned}", flush=True)
        best = {}
        for grid in GRIDS:
            if grid > m:
                continue
            for block_n, warps in BLOCKS_AND_WARPS:
                for stages in STAGES:
                    config = {"grid": grid, "BLOCK_N": block_n, "num_warps": warps,
                              "LOOP_STAGES": stages}  # fmt: skip
                    calls = [looped_call(*a, grid, block_n, warps, stages) for a in inputs]
                    try:
                        t = device_us(calls, stream)
                    except OutOfResources as error:
                        rows.append({"m": m, "n": n, "config": config, "skipped": str(error)})
                        continue
                    rows.append({"m": m, "n": n, "config": config, "us": t})
                    if grid not in best or t < best[grid][0]:
                        best[grid] = (t, config)
        for grid, (t, config) in sorted(best.items()):
            in_flight_mib = grid * n * 2 / 2**20
            print(f"{m:5d}x{n:6d} grid {grid:3d} ({in_flight_mib:5.1f} MiB rows in flight) best "
                  f"{kb / t:5.0f} GB/s {config}", flush=True)  # fmt: skip
        print(f"({time.time() - start:.0f} s)", flush=True)
        del inputs
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
