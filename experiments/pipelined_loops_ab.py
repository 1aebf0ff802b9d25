"""Probe (perf log, v8): the product with its loops software-pipelined (the tuner's LOOP_STAGES
1, 3 or 4) against the same product with LOOP_STAGES held at 1 (v7's code), A/B in one process,
device-only, bf16. Each variant is tuned from scratch by the product's tuner.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/pipelined_loops_ab.py out.json
"""

import json
import sys

import torch

from harness import timing
from impls.triton_rmsnorm import launch

SHAPES = [(256, 262144), (512, 131072), (1024, 65536), (2048, 32768), (4096, 16384),
          (262144, 128), (65536, 512), (32768, 1024), (4096, 8192), (512, 2048)]  # fmt: skip
PIPELINED = launch._loop_stages


def unpipelined(kernel_name: str, stages: int) -> dict:
    return PIPELINED(kernel_name, 1)


def forget() -> None:
    """Tuned configs, measured paths and replays, so the next variant starts untuned."""
    launch._TUNED.clear()
    launch._MEASURED_PATH.clear()
    launch._REPLAYS.clear()


def device_us(make_call, m, n, elements_per_row, stream) -> float:
    inputs = []
    for _ in range(timing.rotating_sets(elements_per_row * m * n * 2)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        inputs.append((x, w, torch.randn_like(x), rstd))
    calls = [make_call(*args) for args in inputs]
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def forward(x, w, dy, rstd):
    return lambda: launch.rmsnorm_forward(x, w, 1e-6)[0]


def backward(x, w, dy, rstd):
    return lambda: launch.rmsnorm_backward(dy, x, w, rstd)[0]


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    rows = []
    for m, n in SHAPES:
        for mode, make, elements in (("fwd", forward, 2), ("bwd", backward, 3)):
            if mode == "fwd" and n <= launch.FORWARD_LOOPED_FROM_N:
                continue  # the single-tile forward has no loop
            result = {"m": m, "n": n, "mode": mode}
            for variant, stages in (("loop_stages_1", unpipelined), ("tuned", PIPELINED)):
                launch._loop_stages = stages
                forget()
                us = device_us(make, m, n, elements, stream)
                result[variant] = {"us": us, "gbps": elements * m * n * 2 / 1e3 / us,
                                   "launch": launch.take_launch_configs()}  # fmt: skip
            launch._loop_stages = PIPELINED
            rows.append(result)
            a, b = result["loop_stages_1"]["gbps"], result["tuned"]["gbps"]
            print(f"{mode} {m:6d}x{n:6d} stages 1: {a:5.0f} GB/s  tuned: {b:5.0f} ({b / a:.2f}x) "
                  f"{result['tuned']['launch']}", flush=True)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
