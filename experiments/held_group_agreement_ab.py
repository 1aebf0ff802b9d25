"""Probe: what the grouped kernels' cross-warp agreement (9276071, the v22 review's mend) costs.

Since 9276071 a grouped program's warps take the minimum of their views of "is this row's group
complete" through shared memory (one more barrier a row) before choosing between the exchange
and the fallback. In the wide preset's run at 217d85cc948a the grouped backward ran 69.4-71.4%
of the copy at 65536-262144 columns against 72.6-74.3% at ef67b6007d7c (run 4, before the mend),
while the held row's backward (no exchange) moved by under 1%: a cost of 3-5%, or machine to
machine spread. Here both kernels in one process: the current gluon_kernels against
ef67b6007d7c's (its file given as the second argument, e.g. from
`git show ef67b6007d7c:impls/triton_rmsnorm/gluon_kernels.py`), each launched through the
product's launcher (held_paths.gluon_kernels swapped for the call). Whole backward (zeroing, kernel,
dw reduction) and forward, device-only, the tuner's timer, best of two interleaved passes; the
outputs compared bit for bit (the same sums in the same order).

Prediction: the mend 0.95-0.97x at 65536-262144 columns backward, 0.98-1.0x forward (one
barrier a row against a row's 4 µs backward).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_agreement_ab.py out.json old_gluon_kernels.py
"""

import importlib.util
import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, held_paths, launch, tuning

BACKWARD = [(1024, 65536), (512, 131072), (256, 262144), (64, 1048576)]
FORWARD = [(512, 131072), (256, 262144), (64, 1048576)]


def _load(path: str):
    spec = importlib.util.spec_from_file_location(
        "impls.triton_rmsnorm.gluon_kernels_before_mend", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with(module, call):
    def run(a):
        kept = held_paths.gluon_kernels
        held_paths.gluon_kernels = module
        try:
            call(a)
        finally:
            held_paths.gluon_kernels = kept

    return run


def _backward(a):
    x, w, dy, rstd, dx, dw = a
    config = launch.HELD_GROUP_BACKWARDS[1]  # the one it measured (the only one, before v28)
    launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dx, False, dw, config=config)


def _forward(config):
    def run(a):
        x, w, y, rstd = a
        strides = (x.stride(0), y.stride(0), x.stride(0), x.stride(0))
        launch._forward_held_group(x, w, y, rstd, x, x, strides, 1e-6, 0.0, False, config=config)

    return run


def _time(name, runs, args, outputs, stream, l2, bytes_moved, result):
    got = {}
    for label, run in runs.items():
        for t in outputs:
            t.fill_(float("nan"))
        run(args)
        torch.cuda.synchronize()
        got[label] = [t.clone() for t in outputs]
    labels = list(runs)
    same = all(torch.equal(a, b) for a, b in zip(got[labels[0]], got[labels[1]], strict=True))
    arg_sets = tuning.rotating_arguments(args, l2)
    stream.wait_stream(torch.cuda.current_stream())
    times = time_runs(runs, arg_sets, stream)
    gbps = {k: bytes_moved / (us * 1e3) for k, us in times.items()}
    line = "  ".join(f"{k} {gbps[k]:5.0f} ({gbps[k] / 42.5:4.1f}%)" for k in labels)
    print(f"{name}: {line}  mend/before {times[labels[1]] / times[labels[0]]:.3f}x  "
          f"bit for bit {same}", flush=True)  # fmt: skip
    result["rows"].append({"case": name, "us": times, "gbps": gbps, "bit_for_bit": same})


def main(out_path: str, old_path: str) -> None:
    old = _load(old_path)
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "before": old_path, "rows": []}
    for m, n in BACKWARD:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
        dx, dw = torch.empty_like(x), torch.empty(n, device="cuda")
        runs = {"before": _with(old, _backward), "mend": _with(gluon_kernels, _backward)}
        _time(f"bwd {m}x{n}", runs, (x, w, dy, rstd, dx, dw), (dx, dw), stream, l2,
              3 * m * n * 2, result)  # fmt: skip
    for m, n in FORWARD:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        for config in launch.HELD_GROUP_FORWARDS:
            runs = {"before": _with(old, _forward(config)),
                    "mend": _with(gluon_kernels, _forward(config))}  # fmt: skip
            _time(f"fwd {m}x{n} {config.slice_n}", runs, (x, w, y, rstd), (y, rstd), stream, l2,
                  2 * m * n * 2, result)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
