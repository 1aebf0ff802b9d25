"""Probe: v14's trick on the forward. Does the single-tile forward, holding x as loaded (16-bit)
between its reduction and its scaling, beat the product's forward at wide rows?

At 16384 < N <= 65536 the product measures two forward paths at a shape class's first call and
keeps the faster: the single tile (x read once, but at N = 65536 and 32 warps 64 fp32 values a
thread: 64 registers and 80 bytes of spills, perf log "registers of the single tile at wide
rows") and the looped kernel (x read twice, the second time mostly from L2). The looped one
wins at N = 65536 and runs at 68.5% of the copy there (1024x65536 bf16, 5049a8d21d94; QuACK
91.7%); at 2048x32768 the single tile wins at 85.0% (0.92 of torch.compile).

Variant "held": rmsnorm_fwd_kernel (v13) with x kept in its 16-bit form between the two halves
of a tile and upcast again for the scaling through inline PTX (the compiler cannot merge that
with the reduction's conversion), as v14 does in the backward. The arithmetic is the same on
the same values: y and rstd are compared bit for bit at one configuration.

Timed, bf16 and fp16, device-only (the tuner's timer), each a variant at its best configuration
among the product's candidates for the single tile (launch._candidates); "product" is the
product's own forward call, whichever path it measured fastest, timed the same way.
Prediction: at N = 65536, one 128 KB row per SM at a time with no spills, ~75-85% of the copy
(the looped path: 68.5%); at N = 32768, +0-5% over the single tile (it does not spill there, but
frees registers for a second program per SM at 16 warps); at N = 16384, within noise.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=. python experiments/forward_storage_form_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import best_of, count_differences, forward_candidate_launches, time_variants

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def held_fwd_kernel(
    X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row,
    M, N: tl.constexpr, eps, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PERSISTENT: tl.constexpr, LOOP_STAGES: tl.constexpr, ROWS_CONTIGUOUS: tl.constexpr = False,
):  # fmt: skip
    """rmsnorm_fwd_kernel at 83f69ecd04db holding x as loaded between the reduction and the
    scaling; without the residual's branch (not run here)."""
    if ROWS_CONTIGUOUS:
        stride_x_row = N
        stride_y_row = N
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if PERSISTENT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        tiles = (M - 1) // BLOCK_M + 1
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
            rows, x_loaded, rstd = _held_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M)
            _held_store(Y, RSTD, rows, cols, x_loaded, rstd, w, stride_y_row, M, N)
    else:
        tile = tl.program_id(0).to(tl.int64)
        rows, x_loaded, rstd = _held_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        _held_store(Y, RSTD, rows, cols, x_loaded, rstd, w, stride_y_row, M, N)


@triton.jit
def _held_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M: tl.constexpr):
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x_loaded = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = x_loaded.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    return rows, x_loaded, rstd


@triton.jit
def _held_store(Y, RSTD, rows, cols, x_loaded, rstd, w, stride_y_row, M, N):
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    y = kernels._upcast_opaque(x_loaded) * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


SHAPES = [(1024, 65536), (512, 65536), (2048, 65536), (2048, 32768), (1024, 32768),
          (4096, 32768), (4096, 16384), (8192, 16384)]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (2MN) of each variant's best (key: the configuration); ratio to the product's"
          " forward", flush=True)  # fmt: skip
    for dtype_name in ("bf16", "fp16"):
        for m, n in SHAPES if dtype_name == "bf16" else SHAPES[:4]:
            x = torch.randn(m, n, device="cuda", dtype=DTYPES[dtype_name])
            w = torch.randn(n, device="cuda", dtype=DTYPES[dtype_name])
            y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
            args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
            arg_sets = tuning.rotating_arguments(args, l2)
            # the product's forward, its path measured and tuned at this first call
            launch.rmsnorm_forward(x, w, 1e-6)
            launched = launch.take_launch_configs()
            try:  # a failed capture must not end the probe (inputs are all made already)
                product_us = tuning._median_ms(
                    lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6), arg_sets, stream
                ) * 1e3  # fmt: skip
            except Exception as error:
                print("product", type(error).__name__, str(error)[:120], flush=True)
                product_us = float("inf")
            torch.cuda.current_stream().wait_stream(stream)
            configs = forward_candidate_launches(args, n)
            variants = {"single tile": (kernels.rmsnorm_fwd_kernel, configs),
                        "held": (held_fwd_kernel, configs)}  # fmt: skip
            times = time_variants(variants, arg_sets, stream)
            best = best_of(times)
            same = {name: best["single tile"] for name in variants}
            differing = count_differences(variants, same, args, {"y": y, "rstd": rstd})
            gbps = 2 * m * n * 2 / 1e3
            cells = "  ".join(f"{k}: {gbps / us:5.0f} {c} {product_us / us:.3f}"
                              for k, (us, c) in best.items())  # fmt: skip
            print(f"{dtype_name} {m:5d}x{n:5d}  product: {gbps / product_us:5.0f} "
                  f"{sorted(launched)}  {cells}  elements differing: {differing}",
                  flush=True)  # fmt: skip
            result["rows"].append({
                "dtype": dtype_name, "m": m, "n": n,
                "product": {"us": product_us, "launched": launched},
                "best": {k: {"us": us, "config": c} for k, (us, c) in best.items()},
                "elements_differing": differing,
                "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()},
            })  # fmt: skip
            with open(out_path, "w") as f:  # rewritten after each shape
                json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
