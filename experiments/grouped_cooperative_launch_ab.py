"""Probe: what the cooperative launch costs the grouped kernels a call.

Both grouped kernels (gluon_kernels.rmsnorm_fwd_held_group_kernel and
rmsnorm_bwd_held_group_kernel) launch with launch_cooperative_grid, so that every program of
the grid is resident at once. Their exchange does not need it to finish: a program that finds a
partner's slice missing after SPIN_LIMIT polls sums the row alone (the fallback). Timed over M
(`2026-11-30-aca54a9df4b3-grouped-fill-drain.txt`), the grouped forward's fixed cost is 5.0-6.8 µs
a call and the backward's 14.7-15.9, against the copy kernel's 1.8-2.7. A cooperative kernel
node in a CUDA graph may cost launch time of its own.

Here the product's forward and backward (launch.rmsnorm_forward / rmsnorm_backward, their
measured paths) at fixed N over M, each with the grouped kernels launched as the product does
and with launch_cooperative_grid taken out of their launch options (direct.launch wrapped),
device-only (the tuner's timer, best of two passes; each of the four timed in passes of its own,
not interleaved with the others), and a least-squares line
t(M) = a + b M for each. Outputs compared between the two launches (elements that differ):
the sums and their order are the same, so they must match bit for bit.

Prediction: 0-2 µs less fixed cost without the cooperative attribute, the same cost a row.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/grouped_cooperative_launch_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from grouped_fill_drain import _fit

from impls.triton_rmsnorm import direct, launch, tuning

WIDTHS = {
    131072: [48, 96, 192, 384],
    1048576: [6, 12, 24, 48],
}
GROUPED = ("rmsnorm_fwd_held_group_kernel", "rmsnorm_bwd_held_group_kernel")

_product_launch = direct.launch
cooperative = {"on": True}


def _launch(kernel, grid, args, meta, device):
    if not cooperative["on"] and kernel.fn.__name__ in GROUPED:
        meta = {k: v for k, v in meta.items() if k != "launch_cooperative_grid"}
    return _product_launch(kernel, grid, args, meta, device)


direct.launch = _launch


def _with(on: bool, run):
    def timed(a):
        cooperative["on"] = on
        try:
            run(a)
        finally:
            cooperative["on"] = True

    return timed


def _forward(a):
    launch.rmsnorm_forward(a[0], a[1], 1e-6)


def _backward(a):
    x, w, dy, rstd = a
    launch.rmsnorm_backward(dy, x, w, rstd)


def _differ(a, b) -> int:
    return sum(int((p != q).sum()) for p, q in zip(a, b, strict=True) if torch.is_tensor(p))


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": [], "fits": []}
    for n, row_counts in WIDTHS.items():
        series = {}
        for m in row_counts:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
            launch.rmsnorm_backward(dy, x, w, rstd)
            launched = sorted(launch.take_launch_configs())
            outputs = {}
            for on in (True, False):
                cooperative["on"] = on
                fwd = launch.rmsnorm_forward(x, w, 1e-6)
                bwd = launch.rmsnorm_backward(dy, x, w, rstd)
                cooperative["on"] = True
                outputs[on] = (fwd, bwd)
            differ = {"fwd": _differ(outputs[True][0], outputs[False][0]),
                      "bwd": _differ(outputs[True][1], outputs[False][1])}  # fmt: skip
            runs = {}
            for on in (True, False):
                label = "cooperative" if on else "plain"
                runs[f"fwd {label}"] = (_with(on, _forward), (x, w))
                runs[f"bwd {label}"] = (_with(on, _backward), (x, w, dy, rstd))
            us = {}
            for name, (run, args) in runs.items():
                arg_sets = tuning.rotating_arguments(args, l2)
                stream.wait_stream(torch.cuda.current_stream())
                us[name] = time_runs({name: run}, arg_sets, stream)[name]
                series.setdefault(name, []).append(us[name])
            line = "  ".join(f"{k} {v:7.1f}" for k, v in us.items())
            print(f"{m}x{n} bf16, µs: {line}  differ {differ}  {launched}", flush=True)
            result["rows"].append({"m": m, "n": n, "us": us, "differ": differ,
                                   "launched": launched})  # fmt: skip
        for name, times in series.items():
            a, b = _fit(row_counts, times)
            print(f"N={n} {name:16s}: fixed {a:6.1f} µs, a row {b:6.3f} µs", flush=True)
            result["fits"].append({"n": n, "case": name, "fixed_us": a, "row_us": b})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
