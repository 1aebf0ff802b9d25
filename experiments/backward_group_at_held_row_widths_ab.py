"""Probe: the grouped backward (v20-v26: a row held by a group of programs, 16384-column slices)
at the widths the held-row backward serves (16385-32768 columns), where a group has 2 programs.

The held-row backward (v19, one program an SM, a contiguous chunk of rows each) runs its steady
state at ~94% of the copy but pays ~22 µs a call to fill and drain one program per SM (the first
row's load before any compute, the last row's compute with no load behind it, 132 partial rows of
dw), plus ~5.6 µs of reduction: at 2048x32768 it reaches 72-74% of the copy (run 4, and the
seventeenth session's wide run). The grouped backward's steady state is ~88% of the copy, its
fixed cost ~16.5 µs a call with the reduction (`2026-11-30-6e0569859fab-grouped-fill-drain.txt`,
at 131072-1048576 columns). Prediction, if its cost a row scales with the row: 2048x32768 in
~124 µs against ~129 (1.04x), 1024x32768 1.1x, 512x32768 1.15x over the wide path (the held row
loses there), a tie at 4096 rows and the held row ahead at 8192.

Variants, the product's own paths (each with its dw reduction), device-only, the tuner's timer
(ab_timing.time_runs: a CUDA graph over rotating inputs, best of two interleaved passes):
- "wide": launch._backward_wide (two steps, x and dy read twice);
- "held 16" / "held 32": launch._HELD_ROW_BACKWARDS (what the first call measures today);
- "group": launch._backward_held_group in 16384-column slices (GROUP = 2 here; the product's only
  configuration at 014678a37819, where this first ran); since v28 also "group 8192", its
  8192-column configuration (launch.HELD_GROUP_BACKWARDS), which db5abee84ea2's run timed as
  "group" (that tree's only configuration).
Each variant's dx and dw are compared with an fp64 reference from the same x, dy, w and rstd
(largest error in ulps of the output's dtype at the reference's magnitude).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_group_at_held_row_widths_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [  # (M, N, dtype, with dh_out)
    (2048, 32768, torch.bfloat16, False),
    (512, 32768, torch.bfloat16, False),
    (1024, 32768, torch.bfloat16, False),
    (4096, 32768, torch.bfloat16, False),
    (8192, 32768, torch.bfloat16, False),
    (2048, 32768, torch.float16, False),
    (4096, 24576, torch.bfloat16, False),
    (2048, 24576, torch.bfloat16, False),
    (4096, 20480, torch.bfloat16, False),  # the second slice 4096 columns of 16384
    (4096, 16400, torch.bfloat16, False),  # the second slice 16 columns
    (2048, 32768, torch.bfloat16, True),  # a residual's gradient added
]


def _paths() -> dict:
    return {
        "wide": launch._backward_wide,
        "held 16": launch._HELD_ROW_BACKWARDS[0],
        "held 32": launch._HELD_ROW_BACKWARDS[1],
        "group": launch._held_group_backward_path(launch.HELD_GROUP_BACKWARDS[1]),
        "group 8192": launch._held_group_backward_path(launch.HELD_GROUP_BACKWARDS[0]),
    }


def _run(path, has_dh):
    def run(a):
        dy, x, w, rstd, dh, dx, dw = a
        path(dy, x, w, rstd, 0.0, dx, dh if has_dh else dy, has_dh, dw)

    return run


def _reference(x, dy, w, rstd, dh):
    x64, dy64, r = x.double(), dy.double(), rstd.double()[:, None]
    x_hat = x64 * r
    g = w.double() * dy64
    dx = r * (g - x_hat * (g * x_hat).mean(1, keepdim=True))
    if dh is not None:
        dx += dh.double()
    return dx, (dy64 * x_hat).sum(0)


def _ulps(a: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    spacing = torch.finfo(dtype).eps * ref.abs().clamp_min(torch.finfo(dtype).tiny)
    return float(((a.double() - ref).abs() / spacing).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("whole backward (main kernels + dw reduction), device µs, GB/s of 3MN", flush=True)
    for m, n, dtype, has_dh in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        dh = torch.randn(m, n, device="cuda", dtype=dtype) if has_dh else None
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        args0 = (dy, x, w, rstd, dy if dh is None else dh, dx, dw)
        runs = {name: _run(path, has_dh) for name, path in _paths().items()}
        ref_dx, ref_dw = _reference(x, dy, w, rstd, dh)
        checks, failed = {}, {}
        for name, run in list(runs.items()):
            try:
                dx.fill_(float("nan"))
                dw.fill_(float("nan"))
                run(args0)
                torch.cuda.synchronize()
                checks[name] = {"dx_ulps": _ulps(dx, ref_dx, dtype),
                                "dw_ulps": _ulps(dw, ref_dw, dtype)}  # fmt: skip
            except Exception as error:  # an unrunnable variant does not end the probe
                failed[name] = f"{type(error).__name__}: {str(error)[:160]}"
                print("   failed", name, failed[name], flush=True)
                del runs[name]
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        bytes_moved = 3 * m * n * x.element_size()
        held = min(times.get("held 16", float("inf")), times.get("held 32", float("inf")))
        label = f"{m}x{n} {str(dtype).split('.')[-1]}{' +dh' if has_dh else ''}"
        cells = []
        for name, us in sorted(times.items(), key=lambda kv: kv[1]):
            cells.append(f"{name} {us:6.1f} ({bytes_moved / us / 1e3:5.0f})")
        print(f"{label:24s} group / best held {held / times.get('group', float('inf')):.3f}x"
              f"   " + "  ".join(cells), flush=True)  # fmt: skip
        print(f"{'':24s} ulps " + "  ".join(
            f"{k}: dx {v['dx_ulps']:.1f} dw {v['dw_ulps']:.1f}" for k, v in checks.items()
        ), flush=True)  # fmt: skip
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "has_dh": has_dh, "us": times,
                         "checks": checks, "failed": failed})  # fmt: skip
        del x, dy, dh, dx, dw, arg_sets, args0
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
