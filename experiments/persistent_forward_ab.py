"""Probe (perf log, v9): the single-tile forward with its persistent, software-pipelined grids
in the tuning space (FORWARD_GRID_CHOICES) against the same product held at one program per
tile (v8's forward), A/B in one process, device-only, bf16. Each variant is tuned from scratch
by the product's tuner; the forward path choice (single tile or looped, N > 16384) is measured
afresh too.

With `looped` as a second argument it runs v10's A/B instead: the looped forward held at
4096-wide chunks and at most 8 programs per SM (v9's choices) against its full tuning space, at
the wide shapes where the looped path serves or competes.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/persistent_forward_ab.py out.json [looped]
"""

import json
import sys

import torch

from harness import timing
from impls.triton_rmsnorm import launch

SHAPES = [(512, 2048), (4096, 2048), (512, 8192), (1024, 8192), (4096, 8192), (65536, 8192),
          (8192, 5120), (262144, 128), (32768, 1024), (2048, 32768)]  # fmt: skip
ALL_CANDIDATES = launch._candidates


LOOPED_SHAPES = [(2048, 32768), (1024, 65536), (512, 131072), (256, 262144)]


def one_program_per_tile(kernel_name, args, constexprs):
    candidates = ALL_CANDIDATES(kernel_name, args, constexprs)
    if kernel_name != "rmsnorm_fwd_kernel":
        return candidates
    return [c for c in candidates if c["PROGRAMS_PER_SM"] == 0]


def v9_looped_choices(kernel_name, args, constexprs):
    candidates = ALL_CANDIDATES(kernel_name, args, constexprs)
    if kernel_name != "rmsnorm_fwd_looped_kernel":
        return candidates
    return [c for c in candidates if c["BLOCK_N"] == launch.WIDE_BLOCK_N
            and c["PROGRAMS_PER_SM"] <= 8]  # fmt: skip


#: variant name -> (the held-back candidates, shapes)
VARIANTS = {
    "persistent": (one_program_per_tile, SHAPES),
    "looped": (v9_looped_choices, LOOPED_SHAPES),
}


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


def main(out_path: str, variant_name: str = "persistent") -> None:
    held_back, shapes = VARIANTS[variant_name]
    stream = torch.cuda.Stream()
    rows = []
    for m, n in shapes:
        result = {"m": m, "n": n}
        # "per_tile": the held-back variant (the key's name is from v9's run)
        for variant, candidates in (("per_tile", held_back), ("tuned", ALL_CANDIDATES)):
            launch._candidates = candidates
            forget()
            launch.take_launch_configs()
            us = device_us(m, n, stream)
            result[variant] = {"us": us, "gbps": 2 * m * n * 2 / 1e3 / us,
                               "launch": launch.take_launch_configs()}  # fmt: skip
        launch._candidates = ALL_CANDIDATES
        rows.append(result)
        a, b = result["per_tile"]["gbps"], result["tuned"]["gbps"]
        print(f"{m:6d}x{n:5d} held back: {a:5.0f} GB/s  tuned: {b:5.0f} ({b / a:.3f}x) "
              f"{result['tuned']['launch']}", flush=True)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "variant": variant_name, "rows": rows}, f,
                  indent=0)  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:3])
