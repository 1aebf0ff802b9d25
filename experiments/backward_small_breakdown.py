"""Probe: where the small single-tile backward's time goes.

At the seed shapes below 8M elements our backward takes 1.25-1.64x a copy of its 3·M·N bytes
(83f69ecd04db, run 1), over target 4's 1.25x. It is two kernels: rmsnorm_bwd_kernel (dx and
one fp32 dw partial row per program, one program per SM) and rmsnorm_dw_reduce_kernel (the
partials' fixed-order sum). Launching the second with programmatic dependent launch did not
help (perf log), so the gap between them is not the loss. This times, device-only (the tuner's
timer: CUDA graphs over rotating inputs, best of three interleaved passes), at the product's
tuned configuration, bf16:
- "backward": both kernels, as the product launches them;
- "main": rmsnorm_bwd_kernel alone;
- "reduce": rmsnorm_dw_reduce_kernel alone, on the partials;
- "floor": dx = x + dy in one elementwise torch kernel: the backward's 3·M·N bytes, no
  reduction (its ratio to "main" is what a perfect main kernel could win);
- "main, 2 per SM" and "main, half the SMs": the same kernel with twice and half the programs
  (more rows in flight against fewer partial rows to write and reduce).
Nothing here is a product change: it says which of the three to work on.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/backward_small_breakdown.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (512, 4096), (1024, 4096), (512, 8192),
          (1024, 8192), (4096, 8192)]  # fmt: skip


def _main_run(config, n, programs, rows_per_program):
    block_n = triton.next_power_of_2(n)
    held = launch.backward_holds_storage_form(block_n, torch.bfloat16, torch.bfloat16)
    meta = {"BLOCK_N": block_n, "HAS_DH_OUT": False, "HOLD_STORAGE_FORM": held, **config}

    def run(a):
        dy, x, w, rstd, dx, dw, partial = a
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        kernels.rmsnorm_bwd_kernel[(programs,)](*args, **meta)

    return run


def _reduce_run(n, programs):
    def run(a):
        dy, x, w, rstd, dx, dw, partial = a
        launch._launch_fixed(
            kernels.rmsnorm_dw_reduce_kernel, (launch.cdiv(n, launch.DW_REDUCE_BLOCK_N),),
            partial, dw, programs, n,
            BLOCK_ROWS=min(triton.next_power_of_2(programs), launch.DW_REDUCE_MAX_ROWS),
            BLOCK_N=launch.DW_REDUCE_BLOCK_N, num_warps=launch.DW_REDUCE_WARPS,
        )  # fmt: skip

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print("µs of each part (GB/s of 3MN for the whole-op parts); the product's configuration",
          flush=True)  # fmt: skip
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        launch.rmsnorm_backward(dy, x, w, rstd)  # the product's tuner picks its configuration
        config = launch.take_launch_configs()["rmsnorm_bwd_kernel"]
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(2 * sms, n, device="cuda")  # room for "2 per SM"
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw, partial), l2)
        stream.wait_stream(torch.cuda.current_stream())
        runs = {
            "backward": lambda a: launch._backward_launches(
                a[0], a[1], a[2], a[3], 0.0, a[4], a[0], False, a[5]
            ),
            "main": _main_run(config, n, programs, rows_per_program),
            "reduce": _reduce_run(n, programs),
            "floor": lambda a: torch.add(a[1], a[0], out=a[4]),
        }  # fmt: skip
        for name, factor in (("main, 2 per SM", 2), ("main, half the SMs", 0.5)):
            per_program = launch.cdiv(m, max(1, min(m, int(programs * factor))))
            runs[name] = _main_run(config, n, launch.cdiv(m, per_program), per_program)
        times = time_runs(runs, arg_sets, stream, passes=3)
        cells = "  ".join(f"{name}: {us:6.2f}" for name, us in times.items())
        gbps = 3 * m * n * 2 / 1e3
        print(f"{m:5d}x{n:5d}  {cells}  backward/floor {times['backward'] / times['floor']:.2f}"
              f"  ({gbps / times['backward']:.0f} against {gbps / times['floor']:.0f} GB/s)"
              f"  programs {programs} [{config}]", flush=True)  # fmt: skip
        rows.append({"m": m, "n": n, "config": config, "programs": programs, "us": times})
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
