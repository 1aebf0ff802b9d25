"""Probe: the grouped forward (gluon_kernels.rmsnorm_fwd_held_group_kernel) with its first row
written before the second row's slice is waited for. Written offline in the seventeenth session
(no device time left); not yet run. Offline (Triton 3.6, sm_90a) it compiles to 32-57 registers,
no spill, within both configurations' programs an SM (85 and 64 at most).

The product's loop, at row j: wait for row j + 1's slice, sum it and publish it, then read row
j's words, write row j's y and restage its slot. So a program's first store waits for its
second row's slice as well as its first: at 64-256 rows of 131072 columns (2-8 rows a group,
all of a group's first RING rows' loads issued at once) the writes start after about two thirds
of the first wave of loads has landed rather than one third. The grouped forward's fixed cost a
call is 5.7-7.5 µs against the copy's 2.5 (`2026-11-30-6e0569859fab-grouped-fill-drain.txt`),
and QuACK leads most at 64 rows (0.83 at 64x131072 bf16, run 11).

Variant ("first row early"): after the prologue's first sum and publish, the first row's words
are read, its y written and its slot restaged at once; then the second row's slice is waited
for, summed and published, and the product's loop runs from the second row. The second row's
exchange is then exposed once (its partners publish it just before they read it); the sums
and their order are the product's, so y and rstd must match it bit for bit.

Prediction: 1.03-1.08x at 64x131072, shrinking with rows a group (within 1% at 1024 rows and at
64x1048576, where the first wave is a small part of the call).

Each (shape, configuration of launch.HELD_GROUP_FORWARDS) timed as the product launches it
(its zeroed exchange included), device-only, the tuner's timer (ab_timing.time_runs, best of
two interleaved passes); y and rstd compared with the product's launch of the same
configuration (elements that differ).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_forward_first_row_early_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import gluon_kernels, launch, tuning
from impls.triton_rmsnorm.gluon_kernels import (
    _async_load,
    _load_sums,
    _publish_sum,
    _read_sums,
    _row_sumsq_from_global,
    _stage_slice,
    _staged_sumsq,
    _upcast_pairs,
)

SHAPES = [
    (64, 131072, torch.bfloat16),
    (128, 131072, torch.bfloat16),
    (256, 131072, torch.bfloat16),
    (512, 131072, torch.bfloat16),
    (1024, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
    (64, 131072, torch.float16),
]


@gluon.jit
def _write_row(X_RING, W_HELD, Y, RSTD, SUMS, X, words, row, slot, member, stride_x_row,
               stride_y_row, M, eps, offset, tag_offset, part_ids, polls, warp_cols, cols, in_row,
               groups, layout: gl.constexpr, N: gl.constexpr, GROUP: gl.constexpr,
               SLICE: gl.constexpr, RING: gl.constexpr, SPIN_LIMIT: gl.constexpr):  # fmt: skip
    """Row `row`'s exchange, rstd and y, then its slot restaged RING rows on: the product's loop
    body after its next-row sum (rmsnorm_fwd_held_group_kernel)."""
    complete, total, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls, GROUP,
                                        SPIN_LIMIT)  # fmt: skip
    if complete == 0:
        total = _row_sumsq_from_global(X, row, stride_x_row, warp_cols, N)
    rstd = 1.0 / gl.sqrt_rn(total / N + eps)
    if member == 0:
        gl.store(RSTD + row, rstd)
    x = _upcast_pairs(X_RING.index(slot).load(layout))
    w = _upcast_pairs(W_HELD.load(layout)) + offset
    gl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=in_row)
    _stage_slice(X_RING, slot, X, stride_x_row, row + RING * groups, M, cols, N)
    return polls


@gluon.jit
def first_row_early_kernel(
    X, W, Y, RSTD, SUMS, stride_x_row, stride_y_row, M, eps, offset, tag_offset,
    N: gl.constexpr, GROUP: gl.constexpr, GROUP_PADDED: gl.constexpr, SLICE: gl.constexpr,
    RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_held_group_kernel with the first row written before the second row's slice
    is waited for (module docstring); everything else the product's."""
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(RING >= 2)
    gl.static_assert(N <= GROUP * SLICE)
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, SLICE], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [SLICE], shared_layout)
    pid = gl.program_id(0)
    member = pid % GROUP
    group = pid // GROUP
    slice_cols = gl.arange(0, SLICE, layout=layout)
    cols = member * SLICE + slice_cols
    in_row = cols < N
    groups = gl.num_programs(0) // GROUP
    row_start = group.to(gl.int64)
    _async_load(w_held, W + cols, mask=in_row)
    async_copy.commit_group()
    for s in gl.static_range(RING):
        _stage_slice(x_ring, s, X, stride_x_row, row_start + s * groups, M, cols, N)
    sumsq = _staged_sumsq(x_ring, 0, cols, layout, N, RING - 1)
    _publish_sum(SUMS, row_start, member, sumsq, GROUP)
    gl.static_assert((GROUP_PADDED <= 32) | (GROUP_PADDED >= 32 * WARPS))
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    warp_cols = gl.arange(0, 256, layout=layout)
    polls = 0
    # the first row at once: its partners published it in their prologues
    words = _load_sums(SUMS, row_start, part_ids, GROUP)
    polls = _write_row(x_ring, w_held, Y, RSTD, SUMS, X, words, row_start, 0, member,
                       stride_x_row, stride_y_row, M, eps, offset, tag_offset, part_ids, polls,
                       warp_cols, cols, in_row, groups, layout, N, GROUP, SLICE, RING,
                       SPIN_LIMIT)  # fmt: skip
    # the second row's sum (RING groups pending now: rows 1 to RING; wait for row 1)
    sumsq = _staged_sumsq(x_ring, 1 % RING, cols, layout, N, RING - 1)
    if row_start + groups < M:
        _publish_sum(SUMS, row_start + groups, member, sumsq, GROUP)
    for row in range(row_start + groups, M, groups):  # the product's loop from the second row
        j = (row - row_start) // groups
        slot = (j % RING).to(gl.int32)
        words = _load_sums(SUMS, row, part_ids, GROUP)
        sumsq = _staged_sumsq(x_ring, ((j + 1) % RING).to(gl.int32), cols, layout, N, RING - 2)
        if row + groups < M:
            _publish_sum(SUMS, row + groups, member, sumsq, GROUP)
        polls = _write_row(x_ring, w_held, Y, RSTD, SUMS, X, words, row, slot, member,
                           stride_x_row, stride_y_row, M, eps, offset, tag_offset, part_ids,
                           polls, warp_cols, cols, in_row, groups, layout, N, GROUP, SLICE, RING,
                           SPIN_LIMIT)  # fmt: skip
    async_copy.wait_group(0)


def _launch(kernel, config):
    """launch._forward_held_group's launch of `kernel` in `config` (no residual)."""

    def run(a):
        x, w, y, rstd = a
        m, n = x.shape
        group = launch.cdiv(n, config.slice_n)
        per_sm = launch._held_group_forward_programs_per_sm(x.device.index or 0, config)
        groups = launch._group_count(m, group, x.device, per_sm)
        sums = torch.zeros((m * group,), dtype=torch.int64, device=x.device)
        kernel[(groups * group,)](
            x, w, y, rstd, sums, x.stride(0), y.stride(0), m, 1e-6, 0.0, 0, N=n, GROUP=group,
            GROUP_PADDED=launch.held_group_words(group, config.warps), SLICE=config.slice_n,
            RING=config.ring, WARPS=config.warps, SPIN_LIMIT=launch.HELD_GROUP_SPIN_LIMIT,
            num_warps=config.warps, launch_cooperative_grid=True,
        )  # fmt: skip

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("forward, device µs (GB/s of 2MN), first row early / product", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        args0 = (x, w, y, rstd)
        for config in launch.HELD_GROUP_FORWARDS:
            product = _launch(gluon_kernels.rmsnorm_fwd_held_group_kernel, config)
            early = _launch(first_row_early_kernel, config)
            try:
                product(args0)
                y_ref, rstd_ref = y.clone(), rstd.clone()
                y.fill_(float("nan"))
                rstd.fill_(float("nan"))
                early(args0)
                torch.cuda.synchronize()
            except Exception as error:  # a launch that fails does not end the probe
                print(f"{m}x{n} {config}: failed: {type(error).__name__}: {error}", flush=True)
                continue
            differ = {"y": int((y != y_ref).sum()), "rstd": int((rstd != rstd_ref).sum())}
            arg_sets = tuning.rotating_arguments(args0, l2)
            stream.wait_stream(torch.cuda.current_stream())
            times = time_runs({"product": product, "early": early}, arg_sets, stream)
            bytes_moved = 2 * m * n * x.element_size()
            print(f"{m}x{n} {str(dtype)[6:]} {config}: product {times['product']:.1f} "
                  f"({bytes_moved / times['product'] / 1e3:.0f}), early {times['early']:.1f} "
                  f"({bytes_moved / times['early'] / 1e3:.0f}), "
                  f"{times['product'] / times['early']:.3f}x; differ {differ}", flush=True)  # fmt: skip
            rows_out.append({"m": m, "n": n, "dtype": str(dtype), "config": config._asdict(),
                             "us": times, "differ": differ})  # fmt: skip
            del arg_sets
        del x, y, args0
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
