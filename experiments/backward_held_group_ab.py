"""Probe: the backward of rows wider than one SM can hold, read once by a group of programs.

Past 32768 columns (16-bit) a row's x and dy and a program's dw accumulator no longer fit one
SM, and the product's backward reads x and dy twice (two steps: 5·M·N of the model's 3·M·N;
50-56% of the copy at 1024x65536 to 64x1048576, run 4 of e58d4129a949). Here GROUP programs
share each row, each owning a slice of SLICE = CHUNKS x 8192 columns: v19's held row
(gluon_kernels.rmsnorm_bwd_held_row_kernel) on its slice, x and dy staged in a shared-memory
ring, w's slice staged once, the slice's dw accumulator in registers. The row's mean(g * x_hat)
needs every slice: each program publishes its slice's sum (DOT[row, member], then a release
add on COUNT[row]) and polls COUNT[row] (acquire) until the group has published, then sums the
GROUP partials in a fixed order (every member gets the same bits). v6's cooperative kernels
lost to exactly this wait (perf log, v6: one program per SM stalls on it); here the first pass
runs one row ahead (the ring holds two rows' slices): a program publishes row j + 1 before it
waits on row j, so the partners' sums have a pass's time to arrive. A program whose partners do
not arrive within SPIN_LIMIT polls sums the whole row itself from global memory (correct, slow,
never stuck; its mean may differ from its partners' in the last bits). The launch is
cooperative (every program resident at once), one program per SM.

Timed against the product's backward for these widths (launch._backward_wide, tuned), whole
backward (COUNT's zeroing, the kernels and the dw reduction), device-only, the tuner's timer,
best of two interleaved passes; dx and dw against an fp64 reference (ulps at the reference's
magnitude). "fallbacks" counts rows whose wait gave up (COUNT left at a value other than GROUP).

Prediction: the slice's steady state as v19's (94% of the copy a byte) if the wait hides behind
the next row's first pass; fixed costs as v19's at ~32 rows a program (4096x32768: 82%). So
65-80% of the copy, 1.2-1.45x the two-step path; below 1.1x if the exchange stalls as in v6.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_held_group_ab.py out.json
"""

import itertools
import json
import sys

import torch
import triton
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _async_load

SHAPES = [
    (1024, 65536, torch.bfloat16),
    (2048, 65536, torch.bfloat16),
    (1024, 65536, torch.float16),
    (512, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
]
CHUNK = 8192
SPIN_LIMIT = 1 << 20


@gluon.jit
def _stage(X_RING, DY_RING, slot, X, DY, stride_x_row, stride_dy_row, row, row_end, cols,
           N: gl.constexpr):  # fmt: skip
    mask = (cols < N) & (row < row_end)
    _async_load(X_RING.index(slot), X + row * stride_x_row + cols, mask=mask)
    _async_load(DY_RING.index(slot), DY + row * stride_dy_row + cols, mask=mask)
    async_copy.commit_group()


@gluon.jit
def _slice_dot(X_RING, DY_RING, W_HELD, first_slot, slice_start, chunk_cols, offset,
               layout: gl.constexpr, N: gl.constexpr, CHUNK: gl.constexpr,
               CHUNKS: gl.constexpr, RING: gl.constexpr, WAIT_BASE: gl.constexpr):  # fmt: skip
    """The slice's sum of w * dy * x from the ring, chunk by chunk (its chunk k waited for with
    WAIT_BASE - k later groups allowed pending)."""
    dot = 0.0
    for k in gl.static_range(CHUNKS):
        async_copy.wait_group(WAIT_BASE - k)
        slot = (first_slot + k) % RING
        cols = slice_start + k * CHUNK + chunk_cols
        w = W_HELD.index(k).load(layout).to(gl.float32) + offset
        x = X_RING.index(slot).load(layout).to(gl.float32)
        dy = DY_RING.index(slot).load(layout).to(gl.float32)
        dot += gl.sum(gl.where(cols < N, w * dy * x, 0.0), axis=0)
    return dot


@gluon.jit
def _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, chunk_cols, offset,
                         layout: gl.constexpr, N: gl.constexpr, CHUNK: gl.constexpr):  # fmt: skip
    """The whole row's sum of w * dy * x, read from global memory (the fallback)."""
    dot = 0.0
    for start in range(0, N, CHUNK):
        cols = start + chunk_cols
        mask = cols < N
        w = gl.load(W + cols, mask=mask, other=0.0).to(gl.float32) + offset
        x = gl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(gl.float32)
        dy = gl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(gl.float32)
        dot += gl.sum(gl.where(mask, w * dy * x, 0.0), axis=0)
    return dot


@gluon.jit
def _publish(DOT, COUNT, row, member, dot, GROUP: gl.constexpr):
    gl.store(DOT + row * GROUP + member, dot)
    gl.thread_barrier()
    gl.atomic_add(COUNT + row, 1, sem="release", scope="gpu")


@gluon.jit
def _second_pass(X_RING, DY_RING, W_HELD, k, slot, DX, row, stride_dx_row, cols, rstd, mean_gx,
                 offset, dw_acc, layout: gl.constexpr, N: gl.constexpr):  # fmt: skip
    in_row = cols < N
    x_hat = X_RING.index(slot).load(layout).to(gl.float32) * rstd
    dy = DY_RING.index(slot).load(layout).to(gl.float32)
    w = W_HELD.index(k).load(layout).to(gl.float32) + offset
    dx = (w * dy - x_hat * mean_gx) * rstd
    gl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=in_row)
    return dw_acc + dy * x_hat


@gluon.jit
def held_group_bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DOT, COUNT,
    stride_x_row, stride_dy_row, stride_dx_row, M, rows_per_group, offset,
    N: gl.constexpr, GROUP: gl.constexpr, CHUNK: gl.constexpr, CHUNKS: gl.constexpr,
    RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(CHUNKS == 2)
    gl.static_assert(RING >= 2 * CHUNKS)
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
    # the first row's first pass
    dot = _slice_dot(x_ring, dy_ring, w_held, 0, slice_start, chunk_cols, offset, layout, N,
                     CHUNK, CHUNKS, RING, RING - 1)  # fmt: skip
    if row_start < row_end:
        _publish(DOT, COUNT, row_start, member, dot, GROUP)
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    part_ids = gl.arange(0, GROUP, layout=parts_layout)
    for row in range(row_start, row_end):
        j = row - row_start
        first_slot = (j * CHUNKS % RING).to(gl.int32)
        next_slot = ((j + 1) * CHUNKS % RING).to(gl.int32)
        # the next row's first pass, published before this row's wait
        dot = _slice_dot(x_ring, dy_ring, w_held, next_slot, slice_start, chunk_cols, offset,
                         layout, N, CHUNK, CHUNKS, RING, RING - 1 - CHUNKS)  # fmt: skip
        if row + 1 < row_end:
            _publish(DOT, COUNT, row + 1, member, dot, GROUP)
        count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
        spins = 0
        while (count < GROUP) & (spins < SPIN_LIMIT):
            count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
            spins += 1
        rstd = gl.load(RSTD + row)
        if count < GROUP:  # partners absent: the whole row from global memory
            total = _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, chunk_cols,
                                         offset, layout, N, CHUNK)  # fmt: skip
        else:
            parts = gl.load(DOT + row * GROUP + part_ids, volatile=True)
            total = gl.sum(parts, axis=0)
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


def _reduce(partial, dw):
    launch._reduce_partials(partial, dw)


def _wide_run():
    def run(a):
        dy, x, w, rstd, dx, dw, *_ = a
        launch._backward_wide(dy, x, w, rstd, 0.0, dx, dy, False, dw)

    return run


def _group_run(m, n, group, groups, rows_per_group, ring, warps):
    def run(a):
        dy, x, w, rstd, dx, dw, partial, dot, count = a
        count.zero_()
        held_group_bwd_kernel[(groups * group,)](
            x, w, dy, rstd, dx, partial, dot, count, x.stride(0), dy.stride(0), dx.stride(0), m,
            rows_per_group, 0.0, N=n, GROUP=group, CHUNK=CHUNK, CHUNKS=2, RING=ring,
            WARPS=warps, SPIN_LIMIT=SPIN_LIMIT, num_warps=warps, launch_cooperative_grid=True,
        )  # fmt: skip
        _reduce(partial[:groups], dw)

    return run


def _reference(x, dy, w, rstd):
    x64, dy64, r = x.double(), dy.double(), rstd.double()[:, None]
    x_hat = x64 * r
    g = w.double() * dy64
    return r * (g - x_hat * (g * x_hat).mean(1, keepdim=True)), (dy64 * x_hat).sum(0)


def _ulps(a, ref, dtype):
    spacing = torch.finfo(dtype).eps * ref.abs().clamp_min(torch.finfo(dtype).tiny)
    return float(((a.double() - ref).abs() / spacing).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    print("whole backward, µs (GB/s of 3MN)", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        group = launch.cdiv(n, 2 * CHUNK)
        groups = max(1, min(m, sms // group))
        rows_per_group = launch.cdiv(m, groups)
        groups = launch.cdiv(m, rows_per_group)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(groups, n, device="cuda")
        dot = torch.empty(m * group, device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        args0 = (dy, x, w, rstd, dx, dw, partial, dot, count)
        runs = {("wide", ()): _wide_run()}
        for ring, warps in itertools.product((5, 6), (8,)):
            key = ("group", (("RING", ring), ("warps", warps)))
            runs[key] = _group_run(m, n, group, groups, rows_per_group, ring, warps)
        failed = {}
        for key, run in list(runs.items()):
            try:
                run(args0)
                torch.cuda.synchronize()
            except Exception as error:
                failed[str(key)] = f"{type(error).__name__}: {str(error)[:200]}"
                print("   failed", key, failed[str(key)], flush=True)
                del runs[key]
        ref_dx, ref_dw = _reference(x, dy, w, rstd)
        checks = {}
        for key, run in runs.items():
            dx.fill_(float("nan"))
            dw.fill_(float("nan"))
            run(args0)
            torch.cuda.synchronize()
            checks[str(key)] = {"dx_ulps": _ulps(dx, ref_dx, dtype), "dw_ulps": _ulps(dw, ref_dw, dtype),
                                "dx_nan": int(dx.isnan().sum()),
                                "fallbacks": int((count != group).sum()) if key[0] == "group" else 0}  # fmt: skip
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gb = 3 * m * n * x.element_size() / 1e3
        wide = times[("wide", ())]
        best_key = min((k for k in times if k[0] == "group"), key=times.get, default=None)
        line = f"{m:5d}x{n:7d} {str(dtype)[6:]:8s} group {group:2d} x {groups:3d}  wide {wide:8.2f} ({gb / wide:4.0f})"
        if best_key is not None:
            best = times[best_key]
            line += f"  group {best:8.2f} ({gb / best:4.0f}) {dict(best_key[1])}  group/wide {wide / best:.3f}x"
        print(line, flush=True)
        for key in times:
            print(f"    {key}: {times[key]:.2f} µs {checks[str(key)]}", flush=True)
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "group": group, "groups": groups,
                         "times": {str(k): us for k, us in times.items()},
                         "checks": checks, "failed": failed})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
