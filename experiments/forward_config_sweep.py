"""Probe: does the forward's autotuner pick the config that is fastest by the harness's own
device-only method at the seed shapes? For each shape: the product's autotuned call, then every
(BLOCK_M, num_warps) single-tile forward config with 8-64 elements a thread, each timed by
harness.timing.time_device (CUDA-graph replay over rotating inputs > 3x the L2).

Run from the repository root on a GPU (perf log, "Lead: the small-shape forward gap"):
    PYTHONPATH=. python experiments/forward_config_sweep.py out.json
"""

import json
import sys
import time

import torch

from harness import timing
from impls.triton_rmsnorm import kernels, launch

SHAPES = [(512, 2048), (1024, 2048), (512, 4096), (1024, 4096), (4096, 4096),
          (512, 8192), (1024, 8192), (2048, 8192), (4096, 8192)]  # fmt: skip


def device_us(make_call, m: int, n: int, dtype, stream) -> float:
    """Device-only microseconds per call of make_call(x, w), as the harness times a backend."""
    sets = timing.rotating_sets(2 * m * n * torch.finfo(dtype).bits // 8)
    inputs = [
        (torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype))
        for _ in range(sets)
    ]
    calls = [make_call(x, w) for x, w in inputs]
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def fixed_config(block_m: int, num_warps: int):
    """Calls of the single-tile forward kernel at one configuration (Triton's own launch)."""

    def make(x, w):
        m, n = x.shape

        def call():
            y = torch.empty_like(x)
            rstd = torch.empty(m, device="cuda", dtype=torch.float32)
            kernels.rmsnorm_fwd_kernel[(launch.cdiv(m, block_m),)](
                x, w, y, rstd, x, x, x.stride(0), y.stride(0), x.stride(0), x.stride(0), m, n,
                1e-6, 0.0, m.bit_length(), BLOCK_M=block_m, BLOCK_N=launch.block_size(n),
                HAS_RESIDUAL=False, PERSISTENT=False, LOOP_STAGES=1, num_warps=num_warps,
                num_stages=1,
            )  # fmt: skip
            return y

        return call

    return make


def product(x, w):
    return lambda: launch.rmsnorm_forward(x, w, 1e-6)[0]


def main(out: str) -> None:
    stream = torch.cuda.Stream()
    rows, start = [], time.time()
    dtype = torch.bfloat16
    for m, n in SHAPES:
        kb = 2 * m * n * 2 / 1e3  # the model's bytes, in kB: kB / µs = GB/s
        us = device_us(product, m, n, dtype, stream)
        tuned = launch.take_launch_configs().get("rmsnorm_fwd_kernel")
        rows.append({"m": m, "n": n, "config": "tuned", "tuned": tuned, "us": us})
        best = None
        for block_m in (1, 2, 4, 8):
            for warps in (1, 2, 4, 8, 16):
                if not 8 <= block_m * launch.block_size(n) / (32 * warps) <= 64:
                    continue
                t = device_us(fixed_config(block_m, warps), m, n, dtype, stream)
                rows.append({"m": m, "n": n, "config": {"BLOCK_M": block_m, "num_warps": warps},
                             "us": t})  # fmt: skip
                best = min(best or (t, block_m, warps), (t, block_m, warps))
        print(f"{m:5d}x{n:5d} tuned {tuned} {kb / us:5.0f} GB/s; best BLOCK_M={best[1]} "
              f"warps={best[2]} {kb / best[0]:5.0f} GB/s ({time.time() - start:.0f} s)",
              flush=True)  # fmt: skip
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
