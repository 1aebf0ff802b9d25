"""Probe: what the first call's path measurement (launch._fastest -> tuning.fastest) timed, in a
fresh process, after the wide run at 6e0569859fab chose the split backward at 64x1048576 bf16
(168.8 µs) where fp16 in the same run chose the grouped one (135.8 µs).

tuning.fastest is wrapped so that every choice prints its candidates' device times, every pass
in the order timed (before 2026-11-30's last runs it printed the first pass only) and, with
RMSNORM_PROBE_RETIMES=k, every path timed k more times right after the choice, on the same
tensors, then once on fresh copies of them (new memory: is a slow path the tensors'
placement?); each choice's line starts with the wall-clock time (to match a clock log). The product
is called as a model would (rmsnorm with autograd, the forward then the backward), once per
shape, in the order given. Run it in several processes to see the choice's spread.

Prediction: the grouped backward measures ~136 µs and the split ~169 µs at every try (the wide
run's choice then came from the loaded harness process, not the measurement's spread).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/measured_path_choice.py out.json 64x1048576:bf16 ...
"""

import json
import os
import sys
import time

import torch

from impls.triton_rmsnorm import dispatch, rmsnorm, tuning

CHOICES = []


def _measured_order(count: int, passes: int) -> list[int]:
    """The candidates' indices in the order tuning.fastest times them (every other pass
    reversed), so that each printed time carries its candidate's name."""
    order = []
    for rep in range(passes):
        order += list(range(count)) if rep % 2 == 0 else list(reversed(range(count)))
    return order


#: After each choice of paths, time every candidate this many more times (RMSNORM_PROBE_RETIMES,
#: default 0): whether a slow first measurement stays slow in the process or passes.
RETIMES = int(os.environ.get("RMSNORM_PROBE_RETIMES", "0"))


def _retime(candidates, run, args, names) -> dict:
    device_index = next(a for a in args if isinstance(a, torch.Tensor)).get_device()
    arg_sets = tuning.rotating_arguments(args, tuning.l2_bytes(device_index))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    retimed = {name: [] for name in names}
    for _ in range(RETIMES):
        for name, candidate in zip(names, candidates, strict=True):
            ms = tuning._median_ms(lambda a, c=candidate: run(c, a), arg_sets, stream)
            retimed[name].append(ms * 1e3)
    torch.cuda.current_stream().wait_stream(stream)
    fresh_args = tuple(tuning._copy(a) if isinstance(a, torch.Tensor) else a for a in args)
    stream.wait_stream(torch.cuda.current_stream())
    for name, candidate in zip(names, candidates, strict=True):
        ms = tuning._median_ms(lambda a, c=candidate: run(c, a), [fresh_args], stream)
        retimed[name].append(ms * 1e3)
    torch.cuda.current_stream().wait_stream(stream)
    print("    again (the last on fresh copies):", "  ".join(
        f"{n} " + "/".join(f"{t:.1f}" for t in ts) for n, ts in retimed.items()), flush=True)  # fmt: skip
    return retimed


def _recording(fastest):
    def wrapped(candidates, run, args, **options):
        times = []
        kept = tuning._median_ms

        def median_ms(call, arg_sets, stream):
            ms = kept(call, arg_sets, stream)
            times.append(ms * 1e3)
            return ms

        tuning._median_ms = median_ms
        try:
            chosen = fastest(candidates, run, args, **options)
        finally:
            tuning._median_ms = kept
        names = [dispatch.path_name(c) if callable(c) else str(c) for c in candidates]
        if len(candidates) > 1:
            CHOICES.append(
                {"candidates": names, "us": times, "chosen": names[candidates.index(chosen)]}
            )
            order = _measured_order(len(names), options.get("passes", 1))
            print("   ", time.strftime("%H:%M:%S"), "  ".join(f"{names[i]} {t:.1f}" for i, t in zip(order, times, strict=False)),
                  "->", CHOICES[-1]["chosen"], flush=True)  # fmt: skip
            if RETIMES and options.get("passes", 1) > 1:  # paths (not kernel configurations)
                CHOICES[-1]["retimed_us"] = _retime(candidates, run, args, names)
        return chosen

    return wrapped


def main(out_path: str, cases: list[str]) -> None:
    tuning.fastest = _recording(tuning.fastest)
    result = {"gpu": torch.cuda.get_device_name(), "cases": []}
    for case in cases:
        shape, dtype_name = case.split(":")
        m, n = map(int, shape.split("x"))
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        print(case, flush=True)
        start = len(CHOICES)
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        y = rmsnorm(x, w, 1e-6)
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        result["cases"].append({"case": case, "choices": CHOICES[start:]})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
