"""Probe: does programmatic dependent launch (PDL) hide the dw reduction's launch in the
single-tile backward?

The single-tile backward is two kernels: rmsnorm_bwd_kernel (dx, and one fp32 dw partial row per
program), then rmsnorm_dw_reduce_kernel (the partials' fixed-order sum into dw). At the seed
shapes the backward takes 1.6-2.4x the same-shape copy's time (d11439644f21: 6.6 us at
512x2048), and the second kernel's launch and ramp are part of that: it cannot start until the
first has finished and its writes are visible. On Hopper a kernel launched with PDL (Triton:
`launch_pdl=True`) may be scheduled before the kernel ahead of it in the stream completes, and
waits inside (`tl.extra.cuda.gdc_wait()`, griddepcontrol.wait) until that kernel's memory is
visible; the kernel ahead may signal early (`gdc_launch_dependents()`). Only our own second
kernel is launched this way: the first kernel of the next call is not, so no call overlaps the
op before it (a benchmark-only gain).

Variants, bf16, device-only (the tuner's timer: a CUDA graph over rotating inputs, which keeps
PDL's programmatic edges), the main kernel at the product's tuned configuration:
- "product": launch._backward_launches, as the product runs it;
- "pdl": the reduction (a copy with gdc_wait first) launched with launch_pdl=True, the main
  kernel unchanged (it signals at exit);
- "pdl, signal after rows": the main kernel (a copy) signals after its row loop, before its
  partial row's store;
- "pdl, signal at start": the main kernel signals first thing (the reduction's programs may then
  take SM slots while they wait).
Each variant timed three times, interleaved; the best kept. dw is compared bit for bit with the
product's (the same partials summed in the same order).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=. python experiments/pdl_backward_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def bwd_signal_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row,
    M, N, rows_per_program, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr, SIGNAL: tl.constexpr,  # 1: first thing; 2: after the row loop
):  # fmt: skip
    """rmsnorm_bwd_kernel (d11439644f21) without the dh_out branch, plus the PDL signal."""
    if SIGNAL == 1:
        tl.extra.cuda.gdc_launch_dependents()
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
    if SIGNAL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


@triton.jit
def dw_reduce_wait_kernel(DW_PARTIAL, DW, rows, N, BLOCK_ROWS: tl.constexpr,
                          BLOCK_N: tl.constexpr):  # fmt: skip
    """rmsnorm_dw_reduce_kernel (d11439644f21) after a griddepcontrol.wait: it may be scheduled
    before the backward kernel ahead of it finishes, and reads the partials only once they
    are all written and visible."""
    tl.extra.cuda.gdc_wait()
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_ROWS, BLOCK_N], dtype=tl.float32)
    for start in range(0, rows, BLOCK_ROWS):
        r = start + tl.arange(0, BLOCK_ROWS)
        mask = (r < rows)[:, None] & col_mask[None, :]
        acc += tl.load(
            DW_PARTIAL + r[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0
        )
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_mask)


SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (4096, 2048), (512, 4096), (4096, 4096),
          (512, 8192), (4096, 8192), (8192, 5120), (32768, 1024), (262144, 128)]  # fmt: skip
VARIANTS = {"product": None, "pdl": 0, "pdl, signal after rows": 2, "pdl, signal at start": 1}


def _variant_run(signal, config, m, n, programs, rows_per_program):
    """The launch function of one variant over an argument set (dy, x, w, rstd, dx, dw, partial)."""
    block_rows = min(triton.next_power_of_2(programs), launch.DW_REDUCE_MAX_ROWS)
    reduce_grid = (launch.cdiv(n, launch.DW_REDUCE_BLOCK_N),)
    main_meta = {"BLOCK_N": triton.next_power_of_2(n), "HAS_DH_OUT": False, **config}

    def run(a):
        dy, x, w, rstd, dx, dw, partial = a
        if signal is None:
            launch._backward_launches(dy, x, w, rstd, 0.0, dx, dy, False, dw)
            return
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        bwd_signal_kernel[(programs,)](*args, SIGNAL=signal, **main_meta)
        dw_reduce_wait_kernel[reduce_grid](
            partial, dw, programs, n, BLOCK_ROWS=block_rows, BLOCK_N=launch.DW_REDUCE_BLOCK_N,
            num_warps=launch.DW_REDUCE_WARPS, num_stages=launch.TRITON_DEFAULT_STAGES,
            launch_pdl=True,
        )  # fmt: skip

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("GB/s (3MN) of each variant, ratio to the product; dw equal to the product's", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        launch.rmsnorm_backward(dy, x, w, rstd)  # the product's tuner picks its configuration
        config = launch.take_launch_configs()["rmsnorm_bwd_kernel"]
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(programs, n, device="cuda")
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw, partial), l2)
        stream.wait_stream(torch.cuda.current_stream())
        runs = {name: _variant_run(signal, config, m, n, programs, rows_per_program)
                for name, signal in VARIANTS.items()}  # fmt: skip
        times, dws = time_runs(runs, arg_sets, stream, passes=3), {}
        for name, run in runs.items():
            dw.fill_(float("nan"))
            try:
                run(arg_sets[0])
                torch.cuda.synchronize()
                dws[name] = dw.clone()
            except Exception as error:
                print(name, "untimed run:", type(error).__name__, str(error)[:160], flush=True)
        base = times["product"]
        same = {name: bool(torch.equal(dws[name], dws["product"])) for name in dws}
        cells = "  ".join(f"{name}: {3 * m * n * 2 / 1e3 / us:5.0f} {base / us:.3f}"
                          for name, us in times.items())  # fmt: skip
        print(f"{m:6d}x{n:5d}  {cells}  dw equal: {same}  [{config}]", flush=True)
        rows.append({"m": m, "n": n, "config": config, "us": times, "dw_equal": same})
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
