"""Probe (perf log, v9): the single-tile forward with its persistent, software-pipelined grids
in the tuning space (FORWARD_GRID_CHOICES) against the same product held at one program per
tile (v8's forward), A/B in one process, device-only, bf16. Each variant is tuned from scratch
by the product's tuner; the forward path choice (single tile or looped, N > 16384) is measured
afresh too.

Run from the repository root on a GPU:
    PYTHONPATH=. python results/nvidia-h200/probes/persistent_forward_ab.py out.json
"""

import json
import sys

import torch

from harness import timing
from impls.triton_rmsnorm import launch

SHAPES = [(512, 2048), (4096, 2048), (512, 8192), (1024, 8192), (4096, 8192), (65536, 8192),
          (8192, 5120), (262144, 128), (32768, 1024), (2048, 32768)]  # fmt: skip
ALL_CANDIDATES = launch._candidates


def one_program_per_tile(kernel_name, args, constexprs):
    candidates = ALL_CANDIDATES(kernel_name, args, constexprs)
    if kernel_name != "rmsnorm_fwd_kernel":
        return candidates
    return [c for c in candidates if c["PROGRAMS_PER_SM"] == 0]


def forget() -> None:
    """Tuned configs, measured paths and replays, so the next variant starts untuned."""
    launch._TUNED.clear()
    launch._MEASURED_PATH.clear()
    launch._REPLAYS.clear()


def device_us(m: int, n: int, stream) -> float:
    inputs = []
    for _ in range(timing.rotating_sets(2 * m * n * 2)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        inputs.append((x, torch.randn(n, device="cuda", dtype=torch.bfloat16)))
    calls = [lambda x=x, w=w: launch.rmsnorm_forward(x, w, 1e-6)[0] for x, w in inputs]
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    rows = []
    for m, n in SHAPES:
        result = {"m": m, "n": n}
        for variant, candidates in (("per_tile", one_program_per_tile), ("tuned", ALL_CANDIDATES)):
            launch._candidates = candidates
            forget()
            launch.take_launch_configs()
            us = device_us(m, n, stream)
            result[variant] = {"us": us, "gbps": 2 * m * n * 2 / 1e3 / us,
                               "launch": launch.take_launch_configs()}  # fmt: skip
        launch._candidates = ALL_CANDIDATES
        rows.append(result)
        a, b = result["per_tile"]["gbps"], result["tuned"]["gbps"]
        print(f"{m:6d}x{n:5d} per tile: {a:5.0f} GB/s  tuned: {b:5.0f} ({b / a:.3f}x) "
              f"{result['tuned']['launch']}", flush=True)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
