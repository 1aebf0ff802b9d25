"""Probe: the dw reduction over more than DW_REDUCE_FEW_ROWS partial rows at 4 warps against 8,
measured in the whole single-tile backward, after the tile sweep
(`2026-11-30-5bf2d0db5974-dw-reduce-tile-sweep.txt`) timed the reduction alone at 32 columns a
program 2-27% faster at 4 warps over 64-132 partial rows (e.g. [132, 32768] 8.1 against 8.7 µs,
[64, 32768] 4.5 against 5.6), where the narrow backwards leave 64-132 partial rows.

The product's backward (launch._backward_launches: the tuned main kernel, then the reduction)
at every single-tile shape of the seed, narrow, large and odd presets and N = 16384, bf16, with
backward_launch.DW_REDUCE_WARPS at 8 (the product) and at 4, device-only (the tuner's timer: CUDA graphs
over rotating inputs), best of three interleaved passes; whether dw is equal bit for bit
is printed (it was not at 12 of the 24 shapes, `...-0eb2df0e87cf-dw-reduce-warps-backward-ab.txt`:
the tile's sum over its rows is a tree whose order follows the warps' layout, so its last bits
may differ; both are within the oracle's bound, which the GPU tests check for the product's).
Replays are off (RMSNORM_TRITON_REPLAY=0), so every call reads the constant.

Prediction: 4 warps 0.3-1 µs faster a call where the partial rows number 64-132, so 1-5% of
the backward at the seed shapes (15-60 µs) and under 1% at the large ones.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/dw_reduce_warps_backward_ab.py out.json
"""

import json
import os
import sys

os.environ["RMSNORM_TRITON_REPLAY"] = "0"  # before the product is imported

import torch  # noqa: E402
import triton  # noqa: E402
from ab_timing import time_runs  # noqa: E402

from impls.triton_rmsnorm import backward_launch, launch, tuning  # noqa: E402

SHAPES = [(m, n) for n in (2048, 4096, 8192) for m in (512, 1024, 2048, 4096)]
SHAPES += [(262144, 128), (65536, 512), (32768, 1024), (32768, 4096), (16384, 8192),
           (65536, 8192), (8192, 3584), (8192, 4095), (8192, 5120), (8192, 7168),
           (2048, 16384), (4096, 16384)]  # fmt: skip
WARPS = (8, 4)


def _backward(warps):
    def run(a):
        dy, x, w, rstd, dx, dw = a
        backward_launch.DW_REDUCE_WARPS = warps
        try:
            launch._backward_launches(dy, x, w, rstd, 0.0, dx, dy, False, dw)
        finally:
            backward_launch.DW_REDUCE_WARPS = WARPS[0]

    return run


def main(out_path: str) -> None:
    if WARPS[0] != backward_launch.DW_REDUCE_WARPS:
        raise RuntimeError(
            f"the product's DW_REDUCE_WARPS is {backward_launch.DW_REDUCE_WARPS}, not 8"
        )
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("device µs a backward call; the reduction at 8 warps (product) and at 4", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        period = launch.backward_row_period(x, dy, None)
        programs, _ = launch._single_tile_backward_grid(m, x.device, period)
        dws = {}
        for warps in WARPS:  # compiles and tunes; dw of each
            _backward(warps)((dy, x, w, rstd, dx, dw))
            dws[warps] = dw.clone()
        same = bool(torch.equal(dws[8], dws[4]))
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs({w_: _backward(w_) for w_ in WARPS}, arg_sets, stream, passes=3)
        ratio = times[8] / times[4]
        print(f"{m:6d}x{n:5d}  partial rows {programs:3d}  8 warps {times[8]:7.2f}  4 warps "
              f"{times[4]:7.2f}  8/4 {ratio:.3f}  dw equal {same}", flush=True)  # fmt: skip
        rows.append({"m": m, "n": n, "partial_rows": programs, "us": times, "dw_equal": same})
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
