"""Probe: v13 (the single-tile forward with N, and contiguous rows' strides, compile-time
constants) against v12, over the product's own candidate configurations; and the same change
tried on the single-tile backward.

static_shape_forward_ab.py (d11439644f21) timed copies of v12's per-tile body: N as a constant
ran 0-4.2% faster with runtime strides and 0.9-4.4% with the strides constant too (N), at seven
seed and odd shapes. v13 makes that change in rmsnorm_fwd_kernel (N constexpr,
ROWS_CONTIGUOUS). This checks it in the product's kernel, persistent grids included, each
variant at its best configuration among the tuner's candidates (launch._candidates), bf16, no
residual, device-only (the tuner's timer), in one process:
- forward "v12": rmsnorm_fwd_kernel as it was at d11439644f21 (copied below, runtime N);
- forward "v13": the product's rmsnorm_fwd_kernel (N constexpr, ROWS_CONTIGUOUS);
- backward "runtime N": the product's rmsnorm_bwd_kernel;
- backward "N constexpr": a copy of it with N and, rows being contiguous, the strides constant.
Each configuration timed twice, the variants in one order then the other, the better kept. The
GB/s is of the best configuration of each variant (the tuner would pick about that one).

Each shape also reports how many output elements of the best configurations differ between the
variants (a constant N divides by the correctly rounded 1/N, a runtime one by the hardware's
approximate reciprocal: the last bit of mean(x^2) may differ for N not a power of two).

Run from the repository root on a GPU (fwd, bwd or both; the forward alone compiles ~2200
configurations and times each twice, several minutes):
    PYTHONPATH=. python experiments/static_n_product_ab.py out.json fwd
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import best_of, count_differences, forward_candidate_launches, time_variants

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def v12_fwd_kernel(
    X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row,
    M, N, eps, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PERSISTENT: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_kernel at d11439644f21 (v12), without the residual's branch (not run here)."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if PERSISTENT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        tiles = (M - 1) // BLOCK_M + 1
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
            rows, x, rstd = _v12_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M)
            _v12_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N)
    else:
        tile = tl.program_id(0).to(tl.int64)
        rows, x, rstd = _v12_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        _v12_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N)


@triton.jit
def _v12_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M: tl.constexpr):
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    return rows, x, rstd


@triton.jit
def _v12_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N):
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def static_n_bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row,
    M, N: tl.constexpr, rows_per_program, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr, ROWS_CONTIGUOUS: tl.constexpr = False,
):  # fmt: skip
    """rmsnorm_bwd_kernel (d11439644f21) with N a constant, and with ROWS_CONTIGUOUS the row
    strides too; without the dh_out branch (not run here)."""
    if ROWS_CONTIGUOUS:
        stride_x_row = N
        stride_dy_row = N
        stride_dx_row = N
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
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        x_hat = x * rstd[:, None]
        g = w[None, :] * dy
        mean_gx = tl.sum(g * x_hat, axis=1) / N
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)  # fmt: skip
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


FORWARD_SHAPES = [  # the shapes furthest behind a peer first: a timed-out run keeps them
    *((m, 8192) for m in (512, 2048, 4096, 1024)), (8192, 5120), (1024, 4096), (4096, 4096),
    (8192, 7168), (8192, 4095), (8192, 3584), (2048, 4096), (512, 4096),
    *((m, 2048) for m in (512, 1024, 2048, 4096)), (32768, 1024), (262144, 128), (4096, 16384),
]  # fmt: skip
BACKWARD_SHAPES = [(512, 2048), (4096, 4096), (4096, 8192), (8192, 4095), (8192, 5120),
                   (16384, 8192), (32768, 1024), (262144, 128)]  # fmt: skip


def _report(kind, m, n, times, differing, bytes_moved, rows, out_path, result):
    best = best_of(times)
    base = best[next(iter(best))][0]
    cells = "  ".join(f"{k}: {bytes_moved / 1e3 / us:5.0f} {c} {base / us:.3f}"
                      for k, (us, c) in best.items())  # fmt: skip
    print(f"{kind} {m:6d}x{n:5d}  {cells}  elements differing: {differing}", flush=True)
    rows.append({"m": m, "n": n, "best": {k: {"us": us, "config": c} for k, (us, c) in best.items()},
                 "elements_differing": differing,
                 "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()}})  # fmt: skip
    with open(out_path, "w") as f:  # rewritten after each shape
        json.dump(result, f, indent=0)


def main(out_path: str, parts: str = "fwd,bwd") -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "forward": [], "backward": []}  # fmt: skip
    print("GB/s of each variant's best configuration (key: the configuration); ratio to the"
          " first", flush=True)  # fmt: skip
    for m, n in FORWARD_SHAPES if "fwd" in parts else []:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        arg_sets = tuning.rotating_arguments(args, l2)
        v13 = forward_candidate_launches(args, n)
        v12 = [(key, launch_grid, {k: v for k, v in meta.items() if k != "ROWS_CONTIGUOUS"})
               for key, launch_grid, meta in v13]  # fmt: skip
        variants = {"v12": (v12_fwd_kernel, v12), "v13": (kernels.rmsnorm_fwd_kernel, v13)}
        times = time_variants(variants, arg_sets, stream)
        differing = count_differences(variants, best_of(times), args, {"y": y, "rstd": rstd})
        _report("fwd", m, n, times, differing, 2 * m * n * 2, result["forward"], out_path, result)
    for m, n in BACKWARD_SHAPES if "bwd" in parts else []:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        dx = torch.empty_like(x)
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        partial = torch.empty(programs, n, device="cuda")
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        arg_sets = tuning.rotating_arguments(args, l2)
        constexprs = {"BLOCK_N": triton.next_power_of_2(n), "HAS_DH_OUT": False}
        runtime, static = [], []
        for config in launch._candidates("rmsnorm_bwd_kernel", args, constexprs):
            key = tuple(config.values())
            runtime.append((key, (programs,), {**constexprs, **config}))
            static.append((key, (programs,), {**constexprs, **config, "ROWS_CONTIGUOUS": True}))
        variants = {"runtime N": (kernels.rmsnorm_bwd_kernel, runtime),
                    "N constexpr": (static_n_bwd_kernel, static)}  # fmt: skip
        times = time_variants(variants, arg_sets, stream)
        differing = count_differences(
            variants, best_of(times), args, {"dx": dx, "dw partials": partial}
        )
        _report("bwd", m, n, times, differing, 3 * m * n * 2, result["backward"], out_path, result)


if __name__ == "__main__":
    main(*sys.argv[1:3])
