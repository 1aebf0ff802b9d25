"""Probe: does the tuner rank forward configurations as the harness does?

The presets at a17978d2992e (v9, v10) ran several seed-shape forwards slower than v8's run with
the tuner's new picks (512x8192: 2584 -> 2381 GB/s with a persistent grid in place of one
program per tile; 2048x32768: 3526 -> 3293 with the looped path in place of the single tile),
while the A/B probes, in other processes, had measured those picks faster. This times, in one
process, each shape's v8 pick (A) and v9/v10 pick (B), each forced, twice in A B A B order:
by the harness's device-only method (launch.rmsnorm_forward over rotating inputs, as
persistent_forward_ab.py) and by the tuner's own timer (tuning._median_ms over the tuner's
rotating copies of the same launch's arguments). Then the product as it tunes itself. bf16.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/tuner_vs_harness.py out.json
"""

import json
import sys

import torch

from harness import timing
from impls.triton_rmsnorm import kernels, launch, tuning

FWD = "rmsnorm_fwd_kernel"
LOOPED = "rmsnorm_fwd_looped_kernel"


def tile(block_m, per_sm, stages, warps):
    return {FWD: {"BLOCK_M": block_m, "PROGRAMS_PER_SM": per_sm, "LOOP_STAGES": stages,
                  "num_warps": warps, "num_stages": stages}}  # fmt: skip


#: shape -> (A: v8's pick in its preset, B: v9/v10's pick in theirs); from the jsonl launch fields
CASES = {
    (512, 8192): (tile(1, 0, 1, 16), tile(1, 1, 4, 8)),
    (1024, 2048): (tile(1, 0, 1, 8), tile(1, 4, 4, 4)),
    (512, 4096): (tile(1, 0, 1, 16), tile(1, 2, 4, 4)),
    (1024, 4096): (tile(2, 0, 1, 8), tile(1, 4, 3, 8)),
    (1024, 8192): (tile(2, 0, 1, 8), tile(1, 2, 4, 4)),
    (2048, 32768): (
        tile(1, 0, 1, 16),
        {
            LOOPED: {
                "PROGRAMS_PER_SM": 16,
                "BLOCK_N": 4096,
                "LOOP_STAGES": 1,
                "num_warps": 16,
                "num_stages": 1,
            }
        },  # fmt: skip
    ),
}

ORIGINAL_TUNED_CONFIG = launch._tuned_config
ORIGINAL_PATHS = launch._forward_paths


def forget() -> None:
    launch._TUNED.clear()
    launch._MEASURED_PATH.clear()
    launch._REPLAYS.clear()


def harness_us(m: int, n: int, stream) -> float:
    inputs = []
    for _ in range(timing.rotating_sets(2 * m * n * 2)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        inputs.append((x, torch.randn(n, device="cuda", dtype=torch.bfloat16)))
    calls = [lambda x=x, w=w: launch.rmsnorm_forward(x, w, 1e-6)[0] for x, w in inputs]
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def tuner_us(kernel_name: str, recorded: tuple, config: dict, stream) -> float:
    grid, args, constexprs = recorded
    kernel = getattr(kernels, kernel_name)

    def run(launch_args):
        g, meta = launch._kernel_grid_and_meta(kernel_name, grid, {**constexprs, **config})
        kernel[g](*launch_args, **meta)

    arg_sets = tuning.rotating_arguments(args, tuning.l2_bytes(0))
    try:
        return tuning._median_ms(run, arg_sets, stream) * 1e3
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def forced(m: int, n: int, variant: dict, stream) -> dict:
    recorded = {}

    def record(kernel_name, grid, args, constexprs):
        recorded[kernel_name] = (grid, args, constexprs)
        return variant[kernel_name]

    path = launch._forward_looped if LOOPED in variant else launch._forward_single_tile
    launch._tuned_config = record
    launch._forward_paths = lambda *_: [path]
    try:
        forget()
        us = harness_us(m, n, stream)
    finally:
        launch._tuned_config = ORIGINAL_TUNED_CONFIG
        launch._forward_paths = ORIGINAL_PATHS
    ((kernel_name, config),) = variant.items()
    tuner = tuner_us(kernel_name, recorded[kernel_name], config, stream)
    gb = 2 * m * n * 2 / 1e3
    return {"harness_gbps": gb / us, "tuner_gbps": gb / tuner}


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    rows = []
    for (m, n), (a, b) in CASES.items():
        row = {"m": m, "n": n, "A": a, "B": b, "runs": []}
        for rep in range(2):
            for name, variant in (("A", a), ("B", b)):
                result = {"variant": name, "rep": rep, **forced(m, n, variant, stream)}
                row["runs"].append(result)
                print(f"{m:5d}x{n:5d} {name}{rep} harness {result['harness_gbps']:5.0f} GB/s"
                      f"  tuner {result['tuner_gbps']:5.0f}", flush=True)  # fmt: skip
        forget()
        launch.take_launch_configs()
        us = harness_us(m, n, stream)
        row["product"] = {"gbps": 2 * m * n * 2 / 1e3 / us, "launch": launch.take_launch_configs()}
        print(f"{m:5d}x{n:5d} product harness {row['product']['gbps']:5.0f} GB/s "
              f"{row['product']['launch']}", flush=True)  # fmt: skip
        rows.append(row)
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
