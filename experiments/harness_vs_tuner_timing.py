"""Probe: the same forward timed by the harness and by the tuner's timer, in one process.

At 1024x131072 the harness has timed our grouped forward at 153-155 µs (9927c90256ad's run and
runs 9 and 10 of the page, 0e25331f7a64 and aca54a9df4b3: 0.95 of QuACK), where the probes' timer (tuning._median_ms, the
launcher called directly) puts the same kernel configuration at 142-143 µs
(`2026-11-30-aca54a9df4b3-held-group-forward-first-row-early-ab.txt`, `-grouped-fill-drain.txt`).
At 512x131072, 256x262144 and 64x1048576 the two agree within 1%. Both capture one call a set in
a CUDA graph and replay it; the harness calls the autograd door with x a leaf that requires grad,
the probes the launcher.

Here, per shape (bf16), in one process and in this order: the harness's device timing
(harness.run._time_mode, its input sets) of triton, of QuACK, and of triton again; the harness's
timer over the launcher (no autograd) on the harness's sets; the tuner's timer over the autograd
door and over the launcher. Each time is the harness's median (the tuner's for the last two),
device µs per call. If only the harness's triton time is high, the difference is in what the
autograd door does at that shape; if the harness's timer over the launcher is high too, it is in
the timer; if QuACK moves with it, in the process or the GPU.

Run from the repository root on an sm_90 GPU with QuACK installed:
    PYTHONPATH=.:experiments python experiments/harness_vs_tuner_timing.py out.json
"""

import json
import subprocess
import sys

import torch
from ab_timing import time_runs

from harness import run as harness_run
from harness import timing as timers
from impls import get_backend
from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.function import rmsnorm

SHAPES = [(1024, 131072), (512, 131072), (2048, 65536), (256, 131072)]
EPS = 1e-6


def _clocks() -> str:
    query = (
        "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    )
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
        return out.stdout.strip()
    except Exception as error:  # a record only
        return f"nvidia-smi: {type(error).__name__}"


def _harness_us(name: str, sets) -> float:
    backend = get_backend(name)
    fn = backend.build()
    return harness_run._time_mode(backend, fn, "fwd", "device", sets).ms * 1e3


def _harness_timer_on_launcher_us(sets) -> float:
    stream = torch.cuda.Stream()
    calls = [lambda s=s: launch.rmsnorm_forward(s.x, s.weight, EPS) for s in sets]
    timers.warm_up(calls, stream)
    return timers.time_device(calls, stream).ms * 1e3


def _tuner_us(x, w) -> dict:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    leaf = x.detach().requires_grad_(True)
    wleaf = w.detach().requires_grad_(True)
    runs = {
        "tuner, autograd door": (lambda a: rmsnorm(a[0], a[1], EPS), (leaf, wleaf)),
        "tuner, launcher": (lambda a: launch.rmsnorm_forward(a[0], a[1], EPS), (x, w)),
    }
    out = {}
    for name, (run, args) in runs.items():
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        out[name] = time_runs({name: run}, arg_sets, stream)[name]
    return out


def main(out_path: str) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    for m, n in SHAPES:
        sets = harness_run._sets((m, n), torch.bfloat16, EPS, False)
        us = {"harness, triton": _harness_us("triton", sets)}
        try:
            us["harness, quack"] = _harness_us("quack", sets)
        except Exception as error:  # QuACK absent or refused: the rest still answers
            print("quack", type(error).__name__, str(error)[:120], flush=True)
        us["harness, triton again"] = _harness_us("triton", sets)
        us["harness timer, launcher"] = _harness_timer_on_launcher_us(sets)
        us.update(_tuner_us(sets[0].x, sets[0].weight))
        launched = sorted(launch.take_launch_configs())
        clocks = _clocks()
        line = "  ".join(f"{k} {v:6.1f}" for k, v in us.items())
        print(f"{m}x{n} bf16 ({len(sets)} set(s)), µs: {line}  [{clocks}] {launched}", flush=True)
        result["rows"].append({"m": m, "n": n, "sets": len(sets), "us": us, "clocks": clocks,
                               "launched": launched})  # fmt: skip
        del sets
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
