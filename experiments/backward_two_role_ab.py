"""Probe: the small backward in one launch, dw from column programs that run beside the row
programs, instead of per-program fp32 partials and a second kernel that sums them.

At the seed shapes the backward is two kernels: rmsnorm_bwd_kernel (dx, and one fp32 dw partial
row a program) and rmsnorm_dw_reduce_kernel (their fixed-order sum), 2.0-3.5 µs of every call
(`2026-11-30-daf182be02dc-backward-small-breakdown.txt`: 512x2048, 6.77 µs = main 4.70 + reduce
1.99, against a 3.37 µs floor). Launching the reduction with programmatic dependent launch and
folding it into the main kernel behind a grid barrier were both measured, neither faster.

dw = sum over rows of dy * x * rstd needs nothing the row programs compute: rstd comes from the
forward. So here one kernel has two roles, split by program id:
- row programs (as rmsnorm_bwd_kernel: contiguous chunks of rows, BLOCK_M rows a step) write
  dx and accumulate nothing;
- column programs, one per COL_BLOCK columns, walk every row in steps of COL_ROWS rows and
  write their columns of dw, summed in fp32 in a fixed order and rounded once.
No partials, no second launch, no atomics. The price: x and dy are read twice, once by each
role. Below about half the L2 (x and dy of a seed shape: 4-32 MB of a 60 MB L2) the second read
should come from L2, not HBM; the probe's inputs rotate over sets larger than the L2, as the
harness's do, so the first read of each set is cold. COLUMNS_FIRST puts the column programs at
the low program ids, so that they are placed before the row programs fill the SMs.

Checked against an fp64 reference (dx and dw within the product's own error against it, plus
one 16-bit ulp), then timed as the other probes time (device-only, the tuner's timer, best of
two interleaved passes) beside the product's two kernels at its tuned configuration, bf16.

Prediction: 1.25-1.45x the product at 512-1024 rows (the reduction's ~2 µs and its partials'
writes gone, the column programs hidden behind the row programs), gains falling with size, and a
loss at 4096x8192 (x and dy, 128 MB, no longer fit the L2).

Run from the repository root on a GPU:
    PYTHONPATH=.:experiments python experiments/backward_two_role_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (4096, 2048), (512, 4096), (1024, 4096),
          (2048, 4096), (512, 8192), (1024, 8192), (2048, 8192), (4096, 8192)]  # fmt: skip
if len(sys.argv) > 2:  # a second run: the shapes where one launch can win
    SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (512, 4096), (1024, 4096), (512, 8192),
              (1024, 8192)]  # fmt: skip

#: (COL_BLOCK, COL_ROWS, COL_STAGES, COLUMNS_FIRST) tried beside the product's row config.
COLUMN_CONFIGS = [(16, 128, 1, True), (16, 128, 3, True), (64, 64, 3, True), (32, 128, 3, True),
                  (16, 128, 3, False), (64, 64, 3, False)]  # fmt: skip
#: The second run (`... out.json 2`): without partials the row programs need no cap, so also
#: 2x and 4x the product's row programs (fewer rows each), and narrower or deeper column steps.
ROW_FACTORS = (1,)
if len(sys.argv) > 2:
    COLUMN_CONFIGS = [(16, 128, 3, False), (32, 128, 3, True), (64, 64, 3, False),
                      (8, 256, 3, False), (16, 256, 4, False), (32, 128, 4, False)]  # fmt: skip
    ROW_FACTORS = (1, 2, 4)
#: The third run (`... out.json 3`, after v29 took the path up to 4M elements): where the
#: column programs are the critical path, a grid of column tiles and deeper pipelines, at the
#: product's row configuration and at 4 and 8 warps (the two roles share num_warps).
ROW_WARPS = (None,)
if len(sys.argv) > 2 and sys.argv[2] == "3":
    SHAPES = [(2048, 2048), (1024, 4096), (512, 8192), (1024, 8192)]
    COLUMN_CONFIGS = [
        (block, rows, stages, False)
        for block in (8, 16, 32, 64)
        for rows in (64, 128, 256, 512)
        for stages in (3, 5)
        if 1024 <= block * rows <= 8192
    ]
    ROW_FACTORS = (1,)
    ROW_WARPS = (4, 8)


@triton.jit
def _dx_rows(
    X, W, DY, RSTD, DX, stride_x_row, stride_dy_row, stride_dx_row, M, N, rows_per_program,
    row_program, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """dx for a contiguous chunk of rows (rmsnorm_bwd_kernel without the dw accumulator)."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    row_start = row_program.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for block_start in tl.range(row_start, row_end, BLOCK_M, num_stages=LOOP_STAGES):
        rows = block_start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        x_hat = x.to(tl.float32) * rstd[:, None]
        g = w[None, :] * dy.to(tl.float32)
        mean_gx = tl.sum(g * x_hat, axis=1) / N
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(
            DX + rows[:, None] * stride_dx_row + cols[None, :],
            dx.to(DX.dtype.element_ty),
            mask=mask,
        )


@triton.jit
def _dw_columns(
    X, DY, RSTD, DW, stride_x_row, stride_dy_row, M, N, column,
    COL_BLOCK: tl.constexpr, COL_ROWS: tl.constexpr, COL_STAGES: tl.constexpr,
):  # fmt: skip
    """dw for COL_BLOCK columns, over every row, in fp32 and a fixed order, rounded once."""
    cols = column * COL_BLOCK + tl.arange(0, COL_BLOCK)
    col_mask = cols < N
    acc = tl.zeros([COL_ROWS, COL_BLOCK], dtype=tl.float32)
    for start in tl.range(0, M, COL_ROWS, num_stages=COL_STAGES):
        rows = start + tl.arange(0, COL_ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        r64 = rows[:, None].to(tl.int64)
        x = tl.load(X + r64 * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + r64 * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        acc += dy.to(tl.float32) * (x.to(tl.float32) * rstd[:, None])
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_mask)


@triton.jit
def rmsnorm_bwd_two_role_kernel(
    X, W, DY, RSTD, DX, DW,
    stride_x_row, stride_dy_row, stride_dx_row, M, N, rows_per_program, row_programs,
    column_programs, offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    COL_BLOCK: tl.constexpr, COL_ROWS: tl.constexpr, COL_STAGES: tl.constexpr,
    COLUMNS_FIRST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if COLUMNS_FIRST:
        is_column = pid < column_programs
        column = pid
        row_program = pid - column_programs
    else:
        is_column = pid >= row_programs
        column = pid - row_programs
        row_program = pid
    if is_column:
        _dw_columns(X, DY, RSTD, DW, stride_x_row, stride_dy_row, M, N, column,
                    COL_BLOCK, COL_ROWS, COL_STAGES)  # fmt: skip
    else:
        _dx_rows(X, W, DY, RSTD, DX, stride_x_row, stride_dy_row, stride_dx_row, M, N,
                 rows_per_program, row_program, offset, BLOCK_M, BLOCK_N, LOOP_STAGES)  # fmt: skip


def _two_role_run(row_config: dict, programs: int, rows_per_program: int, column_config):
    col_block, col_rows, col_stages, columns_first = column_config

    def run(a):
        dy, x, w, rstd, dx, dw = a[:6]
        m, n = x.shape
        columns = launch.cdiv(n, col_block)
        rmsnorm_bwd_two_role_kernel[(programs + columns,)](
            x, w, dy, rstd, dx, dw, x.stride(0), dy.stride(0), dx.stride(0), m, n,
            rows_per_program, programs, columns, 0.0,
            BLOCK_M=row_config["BLOCK_M"], BLOCK_N=triton.next_power_of_2(n),
            LOOP_STAGES=row_config["LOOP_STAGES"], COL_BLOCK=col_block, COL_ROWS=col_rows,
            COL_STAGES=col_stages, COLUMNS_FIRST=columns_first,
            num_warps=row_config["num_warps"],
        )  # fmt: skip

    return run


def _errors(dx, dw, x, dy, w, rstd) -> tuple[float, float]:
    """Largest |error| against fp64, in units of the 16-bit ulp at the reference's magnitude."""
    xd, dyd, wd, rd = x.double(), dy.double(), w.double(), rstd.double()[:, None]
    x_hat = xd * rd
    g = wd * dyd
    ref_dx = (g - x_hat * (g * x_hat).mean(-1, keepdim=True)) * rd
    ref_dw = (dyd * x_hat).sum(0)

    def ulps(got, ref):
        ulp = (ref.abs().clamp_min(1e-30).log2().floor() - 7).exp2()
        return ((got.double() - ref).abs() / ulp).max().item()

    return ulps(dx, ref_dx), ulps(dw, ref_dw)


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    for m, n in SHAPES:
        torch.manual_seed(m + n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        dx_p, dw_p = launch.rmsnorm_backward(dy, x, w, rstd)  # the tuner picks its configuration
        config = launch.take_launch_configs()["rmsnorm_bwd_kernel"]
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        product_err = _errors(dx_p, dw_p, x, dy, w, rstd)
        runs = {
            "product": lambda a: launch._backward_launches(
                a[0], a[1], a[2], a[3], 0.0, a[4], a[0], False, a[5]
            )
        }  # fmt: skip
        checks = {}
        variants = [(f, cc, wp) for f in ROW_FACTORS for cc in COLUMN_CONFIGS for wp in ROW_WARPS]
        for factor, cc, warps in variants:
            per_program = launch.cdiv(m, min(m, programs * factor))
            row_config = config if warps is None else {**config, "num_warps": warps}
            run = _two_role_run(row_config, launch.cdiv(m, per_program), per_program, cc)
            dx, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
            run((dy, x, w, rstd, dx, dw))
            err = _errors(dx, dw, x, dy, w, rstd)
            ok = err[0] <= product_err[0] + 1 and err[1] <= product_err[1] + 1
            name = str(cc) if factor == 1 else f"{cc} rows x{factor}"
            if warps is not None:
                name += f" {warps} warps"
            checks[name] = {"dx_ulps": err[0], "dw_ulps": err[1], "ok": ok,
                               "dx_equal_product": bool(torch.equal(dx, dx_p))}  # fmt: skip
            if ok:
                runs[f"two-role {name}"] = run
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16 backward, device µs (x the product); product {config}, "
              f"{programs} row programs; product error (dx, dw ulps) "
              f"{product_err[0]:.2f}, {product_err[1]:.2f}", flush=True)  # fmt: skip
        for name, us in times.items():
            check = checks.get(name.removeprefix("two-role "), {})
            print(f"  {us:7.2f}  {times['product'] / us:.3f}x  {name}  {check}", flush=True)
        failed = [k for k, c in checks.items() if not c["ok"]]
        if failed:
            print(f"  FAILED the check: {failed} {[checks[k] for k in failed]}", flush=True)
        rows.append({"m": m, "n": n, "config": config, "programs": programs,
                     "product_errors": product_err, "checks": checks, "us": times})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
