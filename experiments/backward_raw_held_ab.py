"""Probe: does the single-tile backward spill at N = 16384, and does holding x and dy in their
16-bit storage form between its two passes cure it?

The single-tile backward makes two passes over a row held in registers: a reduction
(mean(g * x_hat)), then dx and the dw contribution. Between them it keeps x and dy upcast to
fp32, plus w (fp32) and the fp32 dw accumulator: at BLOCK_N = 16384 and 16 warps that is
4 x 32 fp32 values a thread. ptxas (Triton 3.6, sm_90) reports 168 bytes of spill stores and
loads at 16 warps and 104 at 32 warps, and 4096x16384 ran at 61% of the copy
(83f69ecd04db, wide preset) against 83-95% at N = 8192.

Variant "raw held": x and dy stay in their 16-bit form between the passes (half the registers);
the second pass upcasts them again through inline PTX, which the compiler cannot merge with the
first pass's conversion (it would otherwise keep the fp32 values live, as it does now). Offline,
ptxas reports no spills at 16384 (16 or 32 warps), and at N = 8192 and 8 warps 128 registers
instead of 208: two programs an SM instead of one. The arithmetic is the product's, on the same
values, so dx and the dw partials should match the product's bit for bit (counted, both at the
product's best configuration: the reduction order depends on the configuration). Measured: the
dw partials do; dx differs in its last bit at 3-697 elements a shape (the compiler contracts
g - x_hat * mean into a different fma once g is recomputed).

Both variants over the product's tuner candidates (launch._candidates), device-only (the
tuner's timer), bf16 and fp16, rows contiguous, no residual gradient. Prediction: +20-40% at
N = 16384 (61% of the copy towards the 83-95% of N = 8192); at N <= 8192 within +-3% unless the
extra occupancy pays.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=. python experiments/backward_raw_held_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import best_of, count_differences, time_variants

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit
def _upcast_opaque(v, IS_BF16: tl.constexpr):
    """16-bit pairs to fp32 in inline PTX: opaque, so not merged with an earlier conversion."""
    if IS_BF16:
        return tl.inline_asm_elementwise(
            "shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [v],
            dtype=tl.float32, is_pure=False, pack=2,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
            "=r,=r,r", [v], dtype=tl.float32, is_pure=False, pack=2,
        )  # fmt: skip


@triton.jit
def raw_held_bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row,
    M, N, rows_per_program, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr, IS_BF16: tl.constexpr,
):  # fmt: skip
    """rmsnorm_bwd_kernel (83f69ecd04db) with x and dy held in storage form between the passes;
    without the dh_out branch (not run here)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for block_start in tl.range(row_start, row_end, BLOCK_M, num_stages=LOOP_STAGES):
        rows = block_start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x_raw = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy_raw = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        # pass 1, exactly the product's arithmetic
        mean_gx = tl.sum((w[None, :] * dy_raw.to(tl.float32)) * (x_raw.to(tl.float32) * rstd[:, None]),
                         axis=1) / N  # fmt: skip
        # pass 2, from the 16-bit values again
        x_hat = _upcast_opaque(x_raw, IS_BF16) * rstd[:, None]
        dy = _upcast_opaque(dy_raw, IS_BF16)
        g = w[None, :] * dy
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)  # fmt: skip
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


SHAPES = [(4096, 16384), (2048, 16384), (8192, 16384), (4096, 8192), (512, 8192), (2048, 8192),
          (16384, 8192), (8192, 7168), (8192, 5120), (4096, 4096), (512, 2048), (4096, 2048),
          (32768, 1024), (262144, 128)]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (3MN) of each variant's best configuration (key: the configuration); ratio to the"
          " product", flush=True)  # fmt: skip
    for dtype_name in ("bf16", "fp16"):
        for m, n in SHAPES if dtype_name == "bf16" else SHAPES[:4]:
            dtype = DTYPES[dtype_name]
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            rstd = torch.rand(m, device="cuda") + 0.5
            dx = torch.empty_like(x)
            programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
            partial = torch.empty(programs, n, device="cuda")
            args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                     rows_per_program)  # fmt: skip
            arg_sets = tuning.rotating_arguments(args, l2)
            constexprs = {"BLOCK_N": triton.next_power_of_2(n), "HAS_DH_OUT": False}
            candidates = launch._candidates("rmsnorm_bwd_kernel", args, constexprs)
            # "product": the plain kernel, the product's at 83f69ecd04db, when this probe ran (the
            # product now holds the storage form itself at 16384-wide tiles: pass it explicitly)
            product = [(tuple(c.values()), (programs,),
                        {**constexprs, **c, "HOLD_STORAGE_FORM": False}) for c in candidates]  # fmt: skip
            raw_held = [(key, grid, {**constexprs, **c, "IS_BF16": dtype_name == "bf16"})
                        for (key, grid, _), c in zip(product, candidates, strict=True)]  # fmt: skip
            variants = {"product": (kernels.rmsnorm_bwd_kernel, product),
                        "raw held": (raw_held_bwd_kernel, raw_held)}  # fmt: skip
            times = time_variants(variants, arg_sets, stream)
            best = best_of(times)
            # Bit-for-bit check at one configuration (the reduction order depends on it): both
            # variants at the product's best.
            same = {name: (best["product"][0], best["product"][1]) for name in variants}
            differing = count_differences(variants, same, args, {"dx": dx, "dw partials": partial})
            base = best["product"][0]
            cells = "  ".join(f"{k}: {3 * m * n * 2 / 1e3 / us:5.0f} {c} {base / us:.3f}"
                              for k, (us, c) in best.items())  # fmt: skip
            print(f"{dtype_name} {m:6d}x{n:5d}  {cells}  elements differing: {differing}",
                  flush=True)  # fmt: skip
            result["rows"].append({
                "dtype": dtype_name, "m": m, "n": n,
                "best": {k: {"us": us, "config": c} for k, (us, c) in best.items()},
                "elements_differing": differing,
                "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()},
            })  # fmt: skip
            with open(out_path, "w") as f:  # rewritten after each shape
                json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
