"""Probe (written offline, compiled for sm_90 on Triton 3.6 and 3.9; not yet run): the forward
of rows past what one SM holds, each row held by a group of programs, as v20's backward.

At 256x262144 bf16 our forward reads each row twice (the looped kernel, 61.7% of the copy, 0.68
of QuACK, which holds a row across a CTA cluster); at 512x131072 v16's held row keeps it on one
SM (77.4%, 0.84 of QuACK); at 64x1048576 the split kernels run at 62.0%. v6's cooperating
programs lost to the wait for a row's slowest partner; v20's backward made the same exchange pay
(1.12-1.20x its two-step path) by running the first pass one row ahead of the wait. Here the
forward does the same: GROUP programs share each row, each owning a slice of CHUNKS x 8192
columns staged in a shared-memory ring (cp.async, one group a chunk) with w's slice staged once;
a program sums its slice's squares for row j + 1 and publishes them (DOT[row, member], then a
release add on COUNT[row]) before it waits on row j (acquire polls until the group has
published), then takes rstd from the GROUP sums in a fixed order (the same bits for every
member; member 0 stores it) and writes its slice of y. Cooperative launch; a program's polls
are one budget over its rows, after which it sums a row's squares alone from global memory.

Variants over CHUNKS {2, 4} (16384- or 32768-column slices), RING (2 x CHUNKS and more where
the shared memory takes it) and PROGRAMS_PER_SM {1, 2} (two rings an SM where they fit), 8 or
16 warps; timed against the product's forward (its measured path), device-only, the tuner's
timer, best of two interleaved passes, the arrival counts zeroed in each call. y and rstd are
compared with the product's (the sums run in another order: rstd may differ in its last bits,
y by an ulp).

Prediction (bytes: x once, y once, the model's 2·M·N): the backward's group reached 64-65% of
the copy moving 3·M·N with two passes of compute a row; the forward has less compute per byte
and, at 2 programs an SM, twice the rows in flight: 70-80% of the copy at 131072-1048576
columns, 1.15-1.3x the looped and split kernels, about a tie with v16's held row at 131072.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:results/nvidia-h200/probes python results/nvidia-h200/probes/forward_held_group_ab.py out.json
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
from impls.triton_rmsnorm.gluon_kernels import _async_load, _publish_dot

SHAPES = [
    (256, 262144, torch.bfloat16),
    (512, 131072, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
    (1024, 65536, torch.bfloat16),
    (256, 262144, torch.float16),
]
CHUNK = 8192
SPIN_LIMIT = 1 << 20
SHARED_BYTES = 227 * 1024


@gluon.jit
def _stage_x(X_RING, slot, X, stride_x_row, row, row_end, cols, N: gl.constexpr):
    _async_load(
        X_RING.index(slot), X + row * stride_x_row + cols, mask=(cols < N) & (row < row_end)
    )
    async_copy.commit_group()


@gluon.jit
def _staged_sumsq(X_RING, first_slot, col_start, chunk_cols, layout: gl.constexpr,
                  N: gl.constexpr, CHUNK: gl.constexpr, CHUNKS: gl.constexpr,
                  RING: gl.constexpr, WAIT_BASE: gl.constexpr):  # fmt: skip
    total = 0.0
    for k in gl.static_range(CHUNKS):
        async_copy.wait_group(WAIT_BASE - k)
        cols = col_start + k * CHUNK + chunk_cols
        x = X_RING.index((first_slot + k) % RING).load(layout).to(gl.float32)
        total += gl.sum(gl.where(cols < N, x * x, 0.0), axis=0)
    return total


@gluon.jit
def _row_sumsq_from_global(X, row, stride_x_row, chunk_cols, layout: gl.constexpr,
                           N: gl.constexpr, CHUNK: gl.constexpr):  # fmt: skip
    total = 0.0
    for start in range(0, N, CHUNK):
        cols = start + chunk_cols
        x = gl.load(X + row * stride_x_row + cols, mask=cols < N, other=0.0).to(gl.float32)
        total += gl.sum(x * x, axis=0)
    return total


@gluon.jit
def held_group_fwd_kernel(
    X, W, Y, RSTD, DOT, COUNT, stride_x_row, stride_y_row, M, rows_per_group, eps, offset,
    N: gl.constexpr, GROUP: gl.constexpr, GROUP_PADDED: gl.constexpr, CHUNK: gl.constexpr,
    CHUNKS: gl.constexpr, RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr,
    EXCHANGE: gl.constexpr = True,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(RING >= 2 * CHUNKS)
    gl.static_assert(N <= GROUP * CHUNKS * CHUNK)
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, CHUNK], shared_layout)
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
        _stage_x(x_ring, s, X, stride_x_row, row_start + s // CHUNKS, row_end,
                 slice_start + (s % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    sumsq = _staged_sumsq(x_ring, 0, slice_start, chunk_cols, layout, N, CHUNK, CHUNKS, RING,
                          RING - 1)  # fmt: skip
    _publish_dot(DOT, COUNT, row_start, member, sumsq, GROUP)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    polls = 0
    for row in range(row_start, row_end):
        j = row - row_start
        first_slot = (j * CHUNKS % RING).to(gl.int32)
        next_slot = ((j + 1) * CHUNKS % RING).to(gl.int32)
        sumsq = _staged_sumsq(x_ring, next_slot, slice_start, chunk_cols, layout, N, CHUNK,
                              CHUNKS, RING, RING - 1 - CHUNKS)  # fmt: skip
        if row + 1 < row_end:
            _publish_dot(DOT, COUNT, row + 1, member, sumsq, GROUP)
        if EXCHANGE:
            count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
            while (count < GROUP) & (polls < SPIN_LIMIT):
                count = gl.atomic_add(COUNT + row, 0, sem="acquire", scope="gpu")
                polls += 1
            if count < GROUP:
                total = _row_sumsq_from_global(X, row, stride_x_row, chunk_cols, layout, N, CHUNK)
            else:
                parts = gl.load(DOT + row * GROUP + part_ids, mask=part_ids < GROUP, other=0.0,
                                volatile=True)  # fmt: skip
                total = gl.sum(parts, axis=0)
        else:  # a diagnostic, not a norm: the program's own slice scaled, no wait on partners
            total = gl.load(DOT + row * GROUP + member) * GROUP
        rstd = 1.0 / gl.sqrt_rn(total / N + eps)
        if member == 0:
            gl.store(RSTD + row, rstd)
        for k in gl.static_range(CHUNKS):
            slot = (first_slot + k) % RING
            cols = slice_start + k * CHUNK + chunk_cols
            in_row = cols < N
            x = x_ring.index(slot).load(layout).to(gl.float32)
            w = w_held.index(k).load(layout).to(gl.float32) + offset
            gl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty),
                     mask=in_row)  # fmt: skip
            _stage_x(x_ring, slot, X, stride_x_row, row + (k + RING) // CHUNKS, row_end,
                     slice_start + ((k + RING) % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    async_copy.wait_group(0)


def _group_run(m, n, chunks, ring, warps, per_sm, sms, chunk=CHUNK, exchange=True):
    group = launch.cdiv(n, chunks * chunk)
    groups = max(1, min(m, per_sm * sms // group))
    rows_per_group = launch.cdiv(m, groups)
    groups = launch.cdiv(m, rows_per_group)

    def run(a):
        x, w, y, rstd, dot, count = a
        count.zero_()
        held_group_fwd_kernel[(groups * group,)](
            x, w, y, rstd, dot, count, x.stride(0), y.stride(0), m, rows_per_group, 1e-6, 0.0,
            N=n, GROUP=group, GROUP_PADDED=triton.next_power_of_2(group), CHUNK=chunk,
            CHUNKS=chunks, RING=ring, WARPS=warps, SPIN_LIMIT=SPIN_LIMIT, EXCHANGE=exchange,
            num_warps=warps,
            launch_cooperative_grid=True,
        )  # fmt: skip

    return run, group, groups


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (2MN); y and rstd against the product's", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)  # path measured, tuned
        launched = launch.take_launch_configs()
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        dot = torch.empty(m * launch.cdiv(n, 2 * CHUNK), device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        for chunks, per_sm, warps in itertools.product((2, 4), (1, 2), (8, 16)):
            w_bytes = chunks * CHUNK * 2
            for ring in range(2 * chunks, 2 * chunks + 3):
                if per_sm * (ring * CHUNK * 2 + w_bytes + 4096) > SHARED_BYTES:
                    continue
                run, group, groups = _group_run(m, n, chunks, ring, warps, per_sm, sms)
                if groups * group > per_sm * sms:
                    continue
                name = f"group {chunks}x{CHUNK} x {group}, RING {ring}, {per_sm}/SM, {warps} warps"
                try:
                    y.fill_(float("nan"))
                    run((x, w, y, rstd, dot, count))
                    torch.cuda.synchronize()
                    checks[name] = {
                        "y_differing": int((y != y_ref).sum()),
                        "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                        "rstd_max_rel": float(((rstd - rstd_ref).abs() / rstd_ref).max()),
                        "fallback_rows": int((count != group).sum()),
                    }
                    runs[name] = run
                except Exception as error:  # a configuration that fails is reported, not timed
                    checks[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        arg_sets = tuning.rotating_arguments((x, w, y, rstd, dot, count), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {name: 2 * m * n * x.element_size() / (us * 1e3) for name, us in times.items()}
        best = min(((t, name) for name, t in times.items() if name != "product"), default=None)
        line = f"{m:5d}x{n:8d} {str(dtype)[6:]:8s} product {gbps['product']:5.0f}"
        if best is not None:
            line += (f"  best group {gbps[best[1]]:5.0f} ({best[1]})  group/product "
                     f"{times['product'] / best[0]:.3f}")  # fmt: skip
        print(f"{line}  {sorted(launched)}", flush=True)
        for name in times:
            print(f"    {name}: {gbps[name]:5.0f} {checks.get(name, '')}", flush=True)
        result["rows"].append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                               "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
