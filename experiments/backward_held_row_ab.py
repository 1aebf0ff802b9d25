"""Probe: the backward of rows wider than the single tile (16384 < N <= 32768), read once.

The product's wide backward runs in two steps (a per-row dot product, then column blocks x row
groups) and so reads x and dy twice: 5·M·N elements moved against the model's 3·M·N, at most 60%
of the copy by the model's count. At 2048x32768 bf16 it ran at 55.5% of the copy, 1.13 of
torch.compile: the lowest backward ratio of the 40 cases (run 4, c448e93b4c87).

Variants, whole backward (main kernels and the dw partials' reduction), device-only, the tuner's
timer (CUDA graph over rotating inputs, best of two interleaved passes):
- "wide": the product's path for these N (launch._backward_wide, tuned as it tunes itself);
- "held": gluon_kernels.rmsnorm_bwd_held_row_kernel, each row staged whole in shared memory (a
  ring of RING 8192-column slots of x and dy, cp.async, the next rows' chunks staged while
  this row computes), the program's dw accumulator (N fp32) in registers, one program per SM;
  over warps {16, 32} x RING {4, 5, 6} (7 where the row has 3 chunks).
Each variant's dx and dw are compared with an fp64 reference from the same x, dy, w and rstd
(largest error in ulps of the output at the reference's magnitude).

Prediction (bytes): "held" moves 3·M·N (+ w from L2 twice a row); if it keeps 80-87% of the copy,
as the single-tile backward at 16384 columns (84.5-87.2%), it runs 1.45-1.55x "wide" at
2048x32768. Register pressure (ptxas, Triton 3.6, sm_90: 128 registers and 16 bytes of spill at
16 warps, 64 and 52 at 32) may cost a few percent.

Run from the repository root on a GPU:
    PYTHONPATH=.:experiments python experiments/backward_held_row_ab.py out.json
"""

import itertools
import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, kernels, launch, tuning

SHAPES = [  # (M, N, dtype, with dh_out)
    (2048, 32768, torch.bfloat16, False),
    (8192, 32768, torch.bfloat16, False),
    (2048, 32768, torch.float16, False),
    (4096, 32768, torch.bfloat16, False),
    (1024, 32768, torch.bfloat16, False),
    (512, 32768, torch.bfloat16, False),
    (96, 32768, torch.bfloat16, False),  # fewer rows than SMs (the product splits rows)
    (4096, 16400, torch.bfloat16, False),  # three chunks, the last of 16 columns
    (4096, 24576, torch.bfloat16, False),
    (4096, 20480, torch.bfloat16, False),
    (2048, 32752, torch.bfloat16, False),  # the last chunk partly outside the row
    (2048, 32768, torch.bfloat16, True),  # a residual's gradient added
]
CHUNK = 8192
WARPS = (16, 32)
SHARED_BYTES = 227 * 1024


def _reduce(partial, dw):
    rows, n = partial.shape
    launch._launch_fixed(
        kernels.rmsnorm_dw_reduce_kernel, (launch.cdiv(n, launch.DW_REDUCE_BLOCK_N),), partial,
        dw, rows, n, BLOCK_ROWS=min(triton.next_power_of_2(rows), launch.DW_REDUCE_MAX_ROWS),
        BLOCK_N=launch.DW_REDUCE_BLOCK_N, num_warps=launch.DW_REDUCE_WARPS,
    )  # fmt: skip


def _wide_run(has_dh):
    def run(a):  # (since v19 the path reduces its own partials)
        dy, x, w, rstd, dh, dx, dw, _ = a
        launch._backward_wide(dy, x, w, rstd, 0.0, dx, dh if has_dh else dy, has_dh, dw)

    return run


def _held_run(meta, programs, rows_per_program, has_dh, reduce=True):
    kernel = gluon_kernels.rmsnorm_bwd_held_row_kernel

    def run(a):
        dy, x, w, rstd, dh, dx, dw, partial = a
        dh_arg = dh if has_dh else dy
        kernel[(programs,)](
            x, w, dy, rstd, dx, partial, dh_arg, x.stride(0), dy.stride(0), dx.stride(0),
            dh_arg.stride(0), x.shape[0], rows_per_program, 0.0, HAS_DH_OUT=has_dh, **meta,
        )  # fmt: skip
        if reduce:
            _reduce(partial[:programs], dw)

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
    print("whole backward, µs (GB/s of 3MN), each variant at its best candidate", flush=True)
    for m, n, dtype, has_dh in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        dh = torch.randn(m, n, device="cuda", dtype=dtype) if has_dh else None
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        chunks = launch.cdiv(n, CHUNK)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(programs, n, device="cuda")
        args0 = (dy, x, w, rstd, dy if dh is None else dh, dx, dw, partial)
        runs = {("wide", ()): _wide_run(has_dh)}
        w_bytes = chunks * CHUNK * 2
        rings = [r for r in range(chunks, 8) if r * CHUNK * 4 + w_bytes + 4096 <= SHARED_BYTES]
        for warps, ring in itertools.product(WARPS, rings):
            meta = {"N": n, "CHUNK": CHUNK, "CHUNKS": chunks, "RING": ring, "WARPS": warps,
                    "num_warps": warps}  # fmt: skip
            key = ("held", (("RING", ring), ("warps", warps)))
            runs[key] = _held_run(meta, programs, rows_per_program, has_dh)
            if ring == chunks and warps == 16:  # its main kernel alone: the reduction's share
                main_key = ("held, no reduction", key[1])
                runs[main_key] = _held_run(meta, programs, rows_per_program, has_dh, False)
        failed = {}
        for key, run in list(runs.items()):
            try:
                run(args0)
                torch.cuda.synchronize()
            except Exception as error:  # an unrunnable candidate does not end the probe
                failed[str(key)] = f"{type(error).__name__}: {str(error)[:160]}"
                print("   failed", key, failed[str(key)], flush=True)
                del runs[key]
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        best = {}
        for (name, config), us in times.items():
            if name not in best or us < best[name][0]:
                best[name] = (us, config)
        ref_dx, ref_dw = _reference(x, dy, w, rstd, dh)
        checks = {}
        for name, (_, config) in best.items():
            dx.fill_(float("nan"))
            dw.fill_(float("nan"))
            runs[(name, config)](args0)
            torch.cuda.synchronize()
            checks[name] = {"dx_ulps": _ulps(dx, ref_dx, dtype), "dw_ulps": _ulps(dw, ref_dw, dtype),
                            "dx_nan": int(dx.isnan().sum())}  # fmt: skip
        gb = 3 * m * n * x.element_size() / 1e3
        cells = "  ".join(f"{name}: {us:7.2f} ({gb / us:4.0f})" for name, (us, _) in best.items())
        ratio = ""
        if "held" in best:
            ratio = f"  held/wide {best['wide'][0] / best['held'][0]:.3f}x"
        tag = " +dh" if has_dh else ""
        print(f"{m:6d}x{n:5d} {str(dtype)[6:]:8s}{tag} {cells}{ratio}", flush=True)
        for name, (_, config) in best.items():
            print(f"    {name}: {dict(config)} {checks[name]}", flush=True)
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "dh_out": has_dh,
                         "times": {f"{k[0]} {dict(k[1])}": us for k, us in times.items()},
                         "best": {k: [us, dict(c)] for k, (us, c) in best.items()},
                         "checks": checks, "failed": failed})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
