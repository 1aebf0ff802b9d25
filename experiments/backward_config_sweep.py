"""Probe: the narrow backward (0.84-0.85 of torch.compile at N = 128 and 512). For each narrow
shape: the product's autotuned backward, then the single-tile backward kernel over BLOCK_M (up to
8x the tuned space's rows), num_warps, num_stages and programs per SM (1, the product's cap that
keeps the dw partials within SMs x N fp32, against 2 and 4), each timed by
harness.timing.time_device (CUDA-graph replay over rotating inputs > 3x the L2). The dw
reduction is left out of the fixed configs (the same kernel for all; the product's row includes
it). Tells whether a config the tuner does not try, or more programs than SMs, closes the gap.
Since v8 num_stages also sets LOOP_STAGES, the row loop's software pipelining, over the
product's stage choices (1, 3, 4); configs over the shared memory are recorded as skipped. The
run at b75a6a9fd452 predates v8: its num_stages (1, 2) did not change the code.

Run from the repository root on a GPU (perf log, "Lead: the narrow backward"):
    PYTHONPATH=. python experiments/backward_config_sweep.py out.json
"""

import json
import sys
import time

import torch
from triton.runtime.errors import OutOfResources

from harness import timing
from impls.triton_rmsnorm import kernels, launch

SHAPES = [(262144, 128), (65536, 512), (32768, 1024)]


def device_us(make_call, m: int, n: int, dtype, stream) -> float:
    """Device-only microseconds per call of make_call(x, w, dy, rstd)."""
    sets = timing.rotating_sets(3 * m * n * torch.finfo(dtype).bits // 8)
    inputs = []
    for _ in range(sets):
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        inputs.append((x, w, torch.randn_like(x), rstd))
    calls = [make_call(*args) for args in inputs]
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def fixed_config(block_m: int, num_warps: int, num_stages: int, programs: int):
    def make(x, w, dy, rstd):
        m, n = x.shape
        rows_per_program = launch.cdiv(m, programs)
        grid = launch.cdiv(m, rows_per_program)

        def call():
            dx = torch.empty_like(x)
            partial = torch.empty((grid, n), device="cuda", dtype=torch.float32)
            kernels.rmsnorm_bwd_kernel[(grid,)](
                x, w, dy, rstd, dx, partial, dy, x.stride(0), dy.stride(0), dx.stride(0),
                dy.stride(0), m, n, rows_per_program, 0.0, m.bit_length(), BLOCK_M=block_m,
                BLOCK_N=launch.block_size(n), HAS_DH_OUT=False, LOOP_STAGES=num_stages,
                num_warps=num_warps, num_stages=num_stages,
            )  # fmt: skip
            return dx

        return call

    return make


def product(x, w, dy, rstd):
    return lambda: launch.rmsnorm_backward(dy, x, w, rstd)[0]


def main(out: str) -> None:
    stream = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, start = [], time.time()
    dtype = torch.bfloat16
    for m, n in SHAPES:
        kb = 3 * m * n * 2 / 1e3  # the model's bytes, in kB: kB / µs = GB/s
        us = device_us(product, m, n, dtype, stream)
        tuned = launch.take_launch_configs().get("rmsnorm_bwd_kernel")
        rows.append({"m": m, "n": n, "config": "tuned", "tuned": tuned, "us": us})
        print(f"{m:6d}x{n:5d} tuned {tuned} {kb / us:5.0f} GB/s", flush=True)
        h = launch.rows_per_tile("rmsnorm_bwd_kernel", launch.block_size(n))
        for per_sm in (1, 2, 4):
            best = None
            for block_m in (h, 2 * h, 4 * h, 8 * h):
                for warps in (4, 8, 16, 32):
                    if not 8 <= block_m * launch.block_size(n) / (32 * warps) <= 64:
                        continue
                    for stages in launch.NUM_STAGES_CHOICES:
                        cfg = fixed_config(block_m, warps, stages, per_sm * sms)
                        config = {"BLOCK_M": block_m, "num_warps": warps, "num_stages": stages,
                                  "programs_per_sm": per_sm}  # fmt: skip
                        try:
                            t = device_us(cfg, m, n, dtype, stream)
                        except OutOfResources as error:  # stages x tile over the shared memory
                            rows.append({"m": m, "n": n, "config": config, "skipped": str(error)})
                            continue
                        rows.append({"m": m, "n": n, "us": t, "config": config})
                        best = min(best or (t, block_m, warps, stages), (t, block_m, warps, stages))
            print(f"{m:6d}x{n:5d} {per_sm} program(s)/SM best BLOCK_M={best[1]} warps={best[2]} "
                  f"stages={best[3]} {kb / best[0]:5.0f} GB/s ({time.time() - start:.0f} s)",
                  flush=True)  # fmt: skip
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
