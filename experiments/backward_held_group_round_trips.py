"""Probe: the grouped backward (v20) without its exchange's round trips to L2.

`held_group_no_wait.py` (8113d897265d) found that v20's backward gains nothing when no program
ever waits for a partner (arrival counts that start complete): 0.985-1.014x. But even then each
row still makes two dependent round trips to L2 before its second pass: the acquire load of the
row's arrival count and the volatile load of the slices' sums; with one program an SM nothing
hides them (v21's forward, at 4 programs an SM, gained nothing from dropping its exchange).
Here a copy of v20's probe kernel (`backward_held_group_ab.py`'s helpers) with MODE:
- 0 "exchange": as v20;
- 1 "publish only": each program publishes its sums but neither polls nor reads the group's;
  it scales its own slice's sum by GROUP (a diagnostic, not a gradient);
- 2 "no exchange": neither publishes nor reads (the slices' streaming alone).
Whole backward (the kernel and the dw reduction), device-only, the tuner's timer, best of two
interleaved passes; the product's measured path beside them.

Prediction: if the round trips are the loss (~2 µs a row of ~4.6), MODE 1 runs 1.2-1.4x MODE 0;
if MODE 1 and 2 are within 3% of MODE 0, the slice kernel's own streaming is the limit.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_held_group_round_trips.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from backward_held_group_ab import (
    _publish,
    _row_dot_from_global,
    _second_pass,
    _slice_dot,
    _stage,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _async_load

SHAPES = [(1024, 65536), (512, 131072), (256, 262144)]
CHUNK = 8192
MODES = {0: "exchange", 1: "publish only", 2: "no exchange"}


@gluon.jit
def group_bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DOT, COUNT,
    stride_x_row, stride_dy_row, stride_dx_row, M, rows_per_group, offset,
    N: gl.constexpr, GROUP: gl.constexpr, CHUNK: gl.constexpr, CHUNKS: gl.constexpr,
    RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr, MODE: gl.constexpr,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, CHUNK], shared_layout)
    dy_ring = gl.allocate_shared_memory(DY.dtype.element_ty, [RING, CHUNK], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [CHUNKS, CHUNK], shared_layout)
    chunk_cols = gl.arange(0, CHUNK, layout=layout)
    pid = gl.program_id(0)
    member = pid % GROUP
    group = pid // GROUP
    slice_start = member * (CHUNKS * CHUNK)
    row_start = group.to(gl.int64) * rows_per_group
    row_end = gl.minimum(row_start + rows_per_group, M)
    for k in gl.static_range(CHUNKS):
        cols = slice_start + k * CHUNK + chunk_cols
        _async_load(w_held.index(k), W + cols, mask=cols < N)
    async_copy.commit_group()
    for s in gl.static_range(RING):
        _stage(x_ring, dy_ring, s, X, DY, stride_x_row, stride_dy_row, row_start + s // CHUNKS,
               row_end, slice_start + (s % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    dot = _slice_dot(x_ring, dy_ring, w_held, 0, slice_start, chunk_cols, offset, layout, N,
                     CHUNK, CHUNKS, RING, RING - 1)  # fmt: skip
    if MODE < 2:
        _publish(DOT, COUNT, row_start, member, dot, GROUP)
    own = dot
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    part_ids = gl.arange(0, GROUP, layout=parts_layout)
    for row in range(row_start, row_end):
        j = row - row_start
        first_slot = (j * CHUNKS % RING).to(gl.int32)
        next_slot = ((j + 1) * CHUNKS % RING).to(gl.int32)
        dot = _slice_dot(x_ring, dy_ring, w_held, next_slot, slice_start, chunk_cols, offset,
                         layout, N, CHUNK, CHUNKS, RING, RING - 1 - CHUNKS)  # fmt: skip
        if MODE < 2:  # noqa: SIM102 (a constexpr test, then a runtime one)
            if row + 1 < row_end:
                _publish(DOT, COUNT, row + 1, member, dot, GROUP)
        if MODE == 0:
            count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
            spins = 0
            while (count < GROUP) & (spins < SPIN_LIMIT):
                count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
                spins += 1
            if count < GROUP:
                total = _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row,
                                             chunk_cols, offset, layout, N, CHUNK)  # fmt: skip
            else:
                total = gl.sum(gl.load(DOT + row * GROUP + part_ids, volatile=True), axis=0)
        else:
            total = own * GROUP
        own = dot
        rstd = gl.load(RSTD + row)
        mean_gx = total * rstd / N
        for k in gl.static_range(CHUNKS):
            slot = (first_slot + k) % RING
            cols = slice_start + k * CHUNK + chunk_cols
            if k == 0:
                dw_0 = _second_pass(x_ring, dy_ring, w_held, k, slot, DX, row, stride_dx_row,
                                    cols, rstd, mean_gx, offset, dw_0, layout, N)  # fmt: skip
            else:
                dw_1 = _second_pass(x_ring, dy_ring, w_held, k, slot, DX, row, stride_dx_row,
                                    cols, rstd, mean_gx, offset, dw_1, layout, N)  # fmt: skip
            _stage(x_ring, dy_ring, slot, X, DY, stride_x_row, stride_dy_row,
                   row + (k + RING) // CHUNKS, row_end,
                   slice_start + ((k + RING) % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    async_copy.wait_group(0)
    partial = DW_PARTIAL + group.to(gl.int64) * N + slice_start + chunk_cols
    gl.store(partial, dw_0, mask=slice_start + chunk_cols < N)
    gl.store(partial + CHUNK, dw_1, mask=slice_start + CHUNK + chunk_cols < N)


def _group_run(m, n, mode, sms):
    group = launch.cdiv(n, 2 * CHUNK)
    groups = max(1, min(m, sms // group))
    rows_per_group = launch.cdiv(m, groups)
    groups = launch.cdiv(m, rows_per_group)

    def run(a):
        dy, x, w, rstd, dx, dw, partial, dot, count = a
        count.zero_()
        group_bwd_kernel[(groups * group,)](
            x, w, dy, rstd, dx, partial, dot, count, x.stride(0), dy.stride(0), dx.stride(0), m,
            rows_per_group, 0.0, N=n, GROUP=group, CHUNK=CHUNK, CHUNKS=2, RING=5, WARPS=8,
            SPIN_LIMIT=1 << 20, MODE=mode, num_warps=8, launch_cooperative_grid=True,
        )  # fmt: skip
        launch._reduce_partials(partial[:groups], dw)

    return run


def _product(a):
    dy, x, w, rstd, dx, dw, *_ = a
    launch.rmsnorm_backward(dy, x, w, rstd)


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print("whole backward: GB/s of 3MN, % of 4250, x MODE 0", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        args = (dy, x, w, rstd, torch.empty_like(x), torch.empty_like(w),
                torch.empty(sms, n, device="cuda"), torch.empty(m * 64, device="cuda"),
                torch.zeros(m, dtype=torch.int32, device="cuda"))  # fmt: skip
        runs = {"product": _product}
        runs.update({MODES[mode]: _group_run(m, n, mode, sms) for mode in MODES})
        ref_dx, ref_dw = launch.rmsnorm_backward(dy, x, w, rstd)
        runs["exchange"](args)
        torch.cuda.synchronize()
        same = bool(torch.equal(args[4], ref_dx))  # MODE 0 against the product's kernel
        for run in runs.values():
            run(args)
        torch.cuda.synchronize()
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gb = 3 * m * n * 2 / 1e3
        line = f"{m:5d}x{n:7d} (MODE 0's dx equals the product's: {same})"
        for name, us in times.items():
            line += (
                f"  {name} {gb / us:5.0f} ({gb / us / 42.5:4.1f}%, {times['exchange'] / us:.3f}x)"
            )
        print(line, flush=True)
        rows.append({"m": m, "n": n, "us": times, "dx_equal": same})
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
