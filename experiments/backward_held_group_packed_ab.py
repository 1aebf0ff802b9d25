"""Probe: v20's backward with its exchange packed into one 64-bit word a slice, read early.

`backward_held_group_round_trips.py` (598e4741dc4c) found v20's backward 1.14-1.16x faster when
its programs publish their slices' sums but never read the group's (a diagnostic), 1.20-1.22x
with no exchange at all: each row waits on two dependent round trips to L2 (the acquire load of
the arrival count, then the volatile load of the sums) that one program an SM cannot hide.
Here the sum travels with its own arrival flag: member m of a row's group stores one 64-bit word
(the row's tag, row + 1, above the sum's fp32 bits) with a relaxed exchange, and a reader needs
no acquire, as it reads nothing the word does not carry; the buffer is zeroed at each call (no
tag is 0). The reader's first load of row j's words is issued before the first pass of row
j + 1, so its latency overlaps that pass; it polls again only if a tag is missing (then, past
the poll budget, the row from global memory as v20). MODE 0 = v20 (the round-trip probe's
kernel), MODE 3 = packed. The sums are added in the same order, so dx and dw must come out
bit for bit as MODE 0's. Whole backward (zeroing, kernel, dw reduction), device-only, the
tuner's timer, best of two interleaved passes.

Prediction: 1.10-1.15x MODE 0 (most of the publish-only diagnostic's 1.14-1.16x), 72-75% of
the copy at 65536-262144 columns.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_held_group_packed_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from backward_held_group_ab import _row_dot_from_global, _second_pass, _slice_dot, _stage
from backward_held_group_round_trips import _group_run as _v20_run
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _async_load

SHAPES = [(1024, 65536), (2048, 65536), (512, 131072), (256, 262144), (64, 1048576)]
CHUNK = 8192


@gluon.jit
def _publish_packed(SUMS, row, member, dot, GROUP: gl.constexpr):
    """The slice's sum and the row's tag in one word (one relaxed exchange: single-copy atomic)."""
    bits = dot.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF
    gl.atomic_xchg(SUMS + row * GROUP + member, bits | ((row + 1) << 32), sem="relaxed",
                   scope="gpu")  # fmt: skip


@gluon.jit
def _complete(words, row, part_ids, GROUP: gl.constexpr):
    tagged = ((words >> 32) == row + 1) | (part_ids >= GROUP)
    return gl.min(tagged.to(gl.int32), axis=0)


@gluon.jit
def group_bwd_packed_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, SUMS,
    stride_x_row, stride_dy_row, stride_dx_row, M, rows_per_group, offset,
    N: gl.constexpr, GROUP: gl.constexpr, GROUP_PADDED: gl.constexpr, CHUNK: gl.constexpr,
    CHUNKS: gl.constexpr, RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr,
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
    _publish_packed(SUMS, row_start, member, dot, GROUP)
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    in_group = part_ids < GROUP
    polls = 0
    for row in range(row_start, row_end):
        j = row - row_start
        first_slot = (j * CHUNKS % RING).to(gl.int32)
        next_slot = ((j + 1) * CHUNKS % RING).to(gl.int32)
        sums = SUMS + row * GROUP + part_ids
        words = gl.load(sums, mask=in_group, other=0, volatile=True)  # in flight over the pass
        dot = _slice_dot(x_ring, dy_ring, w_held, next_slot, slice_start, chunk_cols, offset,
                         layout, N, CHUNK, CHUNKS, RING, RING - 1 - CHUNKS)  # fmt: skip
        if row + 1 < row_end:
            _publish_packed(SUMS, row + 1, member, dot, GROUP)
        complete = _complete(words, row, part_ids, GROUP)
        while (complete == 0) & (polls < SPIN_LIMIT):
            words = gl.load(sums, mask=in_group, other=0, volatile=True)
            complete = _complete(words, row, part_ids, GROUP)
            polls += 1
        if complete == 0:
            total = _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, chunk_cols,
                                         offset, layout, N, CHUNK)  # fmt: skip
        else:
            parts = (words & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
            total = gl.sum(gl.where(in_group, parts, 0.0), axis=0)
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


def _packed_run(m, n, sms):
    group = launch.cdiv(n, 2 * CHUNK)
    groups = max(1, min(m, sms // group))
    rows_per_group = launch.cdiv(m, groups)
    groups = launch.cdiv(m, rows_per_group)

    def run(a):
        dy, x, w, rstd, dx, dw, partial, dot, count = a
        sums = dot.view(torch.int64)[: m * group]
        sums.zero_()
        group_bwd_packed_kernel[(groups * group,)](
            x, w, dy, rstd, dx, partial, sums, x.stride(0), dy.stride(0), dx.stride(0), m,
            rows_per_group, 0.0, N=n, GROUP=group, GROUP_PADDED=triton.next_power_of_2(group),
            CHUNK=CHUNK, CHUNKS=2, RING=5, WARPS=8, SPIN_LIMIT=1 << 20, num_warps=8,
            launch_cooperative_grid=True,
        )  # fmt: skip
        launch._reduce_partials(partial[:groups], dw)

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print("whole backward: GB/s of 3MN, % of 4250", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        args = (dy, x, w, rstd, torch.empty_like(x), torch.empty_like(w),
                torch.empty(sms, n, device="cuda"), torch.empty(m * 128, device="cuda"),
                torch.zeros(m, dtype=torch.int32, device="cuda"))  # fmt: skip
        runs = {"v20": _v20_run(m, n, 0, sms), "packed": _packed_run(m, n, sms)}
        outs = {}
        for name, run in runs.items():
            args[4].fill_(float("nan"))
            run(args)
            torch.cuda.synchronize()
            outs[name] = (args[4].clone(), args[5].clone())
        same = bool(torch.equal(outs["v20"][0], outs["packed"][0])
                    and torch.equal(outs["v20"][1], outs["packed"][1]))  # fmt: skip
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gb = 3 * m * n * 2 / 1e3
        v20, packed = times["v20"], times["packed"]
        print(f"{m:5d}x{n:7d}  v20 {gb / v20:5.0f} ({gb / v20 / 42.5:4.1f}%)  packed "
              f"{gb / packed:5.0f} ({gb / packed / 42.5:4.1f}%)  {v20 / packed:.3f}x  "
              f"dx, dw bit for bit: {same}", flush=True)  # fmt: skip
        rows.append({"m": m, "n": n, "us": times, "bit_for_bit": same})
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
