"""Probe: the Gluon kernels' bf16 upcasts in pairs (gluon_common._upcast_pairs, v26) against
Triton's own conversion, every Gluon path, bf16 and fp16, in one process.

The sixteenth session's diagnosis timed the grouped backward's kernel at 136.0 µs in bf16 and
129.0 in fp16 at 64x1048576 (`...-954323dd897c-grouped-backward-slow-diagnosis.txt`). Its SASS
(Triton 3.6, sm_90a) differs by 608 lines: Triton converts each bf16 value of a 32-bit
register alone (PRMT or SHF, then a shift: 979 instructions for 600 conversions) where fp16's
HADD2.F32 takes one each. v26 converts bf16 from shared memory (and w) two values a register,
a shift and a mask (inline PTX, pure); the SASS is then 4983 lines against fp16's 4951. fp16 is
unchanged (the same SASS), so its rows are the control.

The current gluon_kernels against the file given as the second argument (the kernels before
v26: `git show 1ee943a:impls/triton_rmsnorm/gluon_kernels.py`), each through the product's
launcher (launch.gluon_kernels swapped for the call): the grouped backward and the held-row
backward (16 and 32 warps), whole (zeroing, kernel, dw reduction); the grouped forward in each
configuration and the held-row forward. Device-only, the tuner's timer, best of two
interleaved passes; outputs compared bit for bit (the conversion is exact either way).

Run at b27e0609074b (pairs in every Gluon kernel: `2026-11-30-b27e0609074b-upcast-pairs-ab*.txt`,
two rechecks in fresh processes) and at 76541bfb6a7d, v26 as kept (pairs left out of the
held-row forward and of the grouped backward past 32 words a row, where they lost:
`...-76541bfb6a7d-upcast-pairs-ab-kept.txt`, run with a shorter list of cases).

Prediction: bf16 1.02-1.05x in the grouped and held backwards (the most at 1048576 columns,
where the kernel is furthest from fp16), 1.00-1.02x in the forwards; fp16 1.00x (within 1%).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/upcast_pairs_ab.py out.json old_gluon_kernels.py
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from held_group_agreement_ab import _load, _with

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

GROUPED_BACKWARD = [(1024, 65536), (512, 131072), (256, 262144), (64, 1048576)]
HELD_BACKWARD = [(2048, 32768)]
GROUPED_FORWARD = [(64, 131072), (512, 131072), (256, 262144), (64, 1048576)]
HELD_FORWARD = [(512, 131072), (1024, 98304)]
DTYPES = (torch.bfloat16, torch.float16)


def _grouped_backward(a):
    x, w, dy, rstd, dx, dw = a
    config = launch.HELD_GROUP_BACKWARDS[1]  # the one it measured (the only one, before v28)
    launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dx, False, dw, config=config)


def _held_backward(warps):
    def run(a):
        x, w, dy, rstd, dx, dw = a
        launch._backward_held_row(dy, x, w, rstd, 0.0, dx, dx, False, dw, warps=warps)

    return run


def _grouped_forward(config):
    def run(a):
        x, w, y, rstd = a
        strides = (x.stride(0), y.stride(0), x.stride(0), x.stride(0))
        launch._forward_held_group(x, w, y, rstd, x, x, strides, 1e-6, 0.0, False, config=config)

    return run


def _held_forward(a):
    x, w, y, rstd = a
    strides = (x.stride(0), y.stride(0), x.stride(0), x.stride(0))
    launch._forward_held_row(x, w, y, rstd, x, x, strides, 1e-6, 0.0, False)


def _ab(name, call, old, args, outputs, bytes_moved, stream, l2, result):
    runs = {"before": _with(old, call), "pairs": _with(gluon_kernels, call)}
    got = {}
    for label, run in runs.items():
        for t in outputs:
            t.fill_(float("nan"))
        run(args)
        torch.cuda.synchronize()
        got[label] = [t.clone() for t in outputs]
    same = all(torch.equal(a, b) for a, b in zip(got["before"], got["pairs"], strict=True))
    stream.wait_stream(torch.cuda.current_stream())
    times = time_runs(runs, tuning.rotating_arguments(args, l2), stream)
    pct = {k: bytes_moved / (us * 1e3) / 42.5 for k, us in times.items()}
    print(f"{name}: before {times['before']:7.1f} µs ({pct['before']:4.1f}%)  pairs "
          f"{times['pairs']:7.1f} µs ({pct['pairs']:4.1f}%)  "
          f"{times['before'] / times['pairs']:.3f}x  bit for bit {same}", flush=True)  # fmt: skip
    result["rows"].append({"case": name, "us": times, "bit_for_bit": same})


def main(out_path: str, old_path: str) -> None:
    old = _load(old_path)
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "before": old_path, "rows": []}  # fmt: skip
    for dtype in DTYPES:
        label = str(dtype).removeprefix("torch.")
        for (m, n), calls in [*((s, [("grouped", _grouped_backward)]) for s in GROUPED_BACKWARD),
                              *((s, [(f"held {w}w", _held_backward(w)) for w in (16, 32)])
                                for s in HELD_BACKWARD)]:  # fmt: skip
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
            dx, dw = torch.empty_like(x), torch.empty_like(w)
            for kind, call in calls:
                _ab(f"bwd {kind} {m}x{n} {label}", call, old, (x, w, dy, rstd, dx, dw), (dx, dw),
                    3 * m * n * 2, stream, l2, result)  # fmt: skip
        forwards = [*((s, [(f"grouped {c.slice_n}", _grouped_forward(c))
                           for c in launch.HELD_GROUP_FORWARDS]) for s in GROUPED_FORWARD),
                    *((s, [("held row", _held_forward)]) for s in HELD_FORWARD)]  # fmt: skip
        for (m, n), calls in forwards:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
            for kind, call in calls:
                _ab(f"fwd {kind} {m}x{n} {label}", call, old, (x, w, y, rstd), (y, rstd),
                    2 * m * n * 2, stream, l2, result)  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
