"""Probe: the grouped forward (v21) with w read from L2 instead of staged, to fit more programs
an SM.

v21 (gluon_kernels.rmsnorm_fwd_held_group_kernel) stages each program's 8192-column slice of w
in shared memory (16 KB of its 48 KB), which caps it at 4 programs an SM; its sweep found 4 an
SM 1.05-1.1x faster than 3 and 1.3x faster than 2 (`...-bb689b9d08e7-forward-held-group-sweep.txt`).
Here a copy of the kernel loads w's slice from global memory each row (L2: a row of w is 512 KB
at 262144 columns, read by every group), leaving 32 KB a program: 5 or 6 programs an SM. Timed
against the product's forward (its measured path: v21 at these widths, v16's held row at
131072), device-only, the tuner's timer, best of two interleaved passes; y against the
product's.

Prediction: 6 programs an SM 1.05-1.1x v21 (78-82% of the copy at 256x262144) if copies in
flight are what it lacks; below 1.0 if w's reads from L2 cost more than the extra programs give.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:results/nvidia-h200/probes python results/nvidia-h200/probes/forward_held_group_w_from_l2_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_kernels import (
    _async_load,
    _await_partners,
    _publish_dot,
    _published_total,
    _row_sumsq_from_global,
    _stage_slice,
    _staged_sumsq,
)

SHAPES = [
    (256, 262144, torch.bfloat16),
    (1024, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
    (512, 131072, torch.bfloat16),
]
SLICE = 8192
SHARED_PER_SM = 233472
# (ring, programs an SM, warps, w staged)
CONFIGS = [
    (2, 4, 8, True),  # v21's
    (2, 4, 8, False),
    (2, 5, 8, False),
    (2, 6, 8, False),
    (2, 6, 4, False),
    (3, 4, 8, False),
    (2, 7, 4, False),
]


@gluon.jit
def group_fwd_kernel(
    X, W, Y, RSTD, DOT, COUNT, stride_x_row, stride_y_row, M, rows_per_group, eps, offset,
    N: gl.constexpr, GROUP: gl.constexpr, GROUP_PADDED: gl.constexpr, SLICE: gl.constexpr,
    RING: gl.constexpr, WARPS: gl.constexpr, SPIN_LIMIT: gl.constexpr, W_STAGED: gl.constexpr,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, SLICE], shared_layout)
    if W_STAGED:
        w_held = gl.allocate_shared_memory(W.dtype.element_ty, [SLICE], shared_layout)
    pid = gl.program_id(0)
    member = pid % GROUP
    group = pid // GROUP
    slice_cols = gl.arange(0, SLICE, layout=layout)
    cols = member * SLICE + slice_cols
    in_row = cols < N
    row_start = group.to(gl.int64) * rows_per_group
    row_end = gl.minimum(row_start + rows_per_group, M)
    if W_STAGED:
        _async_load(w_held, W + cols, mask=in_row)
    async_copy.commit_group()  # (empty without w: the group count stays the same)
    for s in gl.static_range(RING):
        _stage_slice(x_ring, s, X, stride_x_row, row_start + s, row_end, cols, N)
    sumsq = _staged_sumsq(x_ring, 0, cols, layout, N, RING - 1)
    _publish_dot(DOT, COUNT, row_start, member, sumsq, GROUP)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    polls = 0
    for row in range(row_start, row_end):
        j = row - row_start
        slot = (j % RING).to(gl.int32)
        sumsq = _staged_sumsq(x_ring, ((j + 1) % RING).to(gl.int32), cols, layout, N, RING - 2)
        if row + 1 < row_end:
            _publish_dot(DOT, COUNT, row + 1, member, sumsq, GROUP)
        count, polls = _await_partners(COUNT, row, polls, GROUP, SPIN_LIMIT)
        if count < GROUP:
            total = _row_sumsq_from_global(X, row, stride_x_row, slice_cols, layout, N, SLICE)
        else:
            total = _published_total(DOT, row, part_ids, GROUP)
        rstd = 1.0 / gl.sqrt_rn(total / N + eps)
        if member == 0:
            gl.store(RSTD + row, rstd)
        x = x_ring.index(slot).load(layout).to(gl.float32)
        if W_STAGED:
            w = w_held.load(layout).to(gl.float32) + offset
        else:
            w = gl.load(W + cols, mask=in_row, other=0.0).to(gl.float32) + offset
        gl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=in_row)
        _stage_slice(x_ring, slot, X, stride_x_row, row + RING, row_end, cols, N)
    async_copy.wait_group(0)


def _group_run(m, n, ring, per_sm, warps, staged, sms):
    group = launch.cdiv(n, SLICE)
    groups = max(1, min(m, per_sm * sms // group))
    rows_per_group = launch.cdiv(m, groups)
    groups = launch.cdiv(m, rows_per_group)

    def run(a):
        x, w, y, rstd, dot, count = a
        count.zero_()
        group_fwd_kernel[(groups * group,)](
            x, w, y, rstd, dot, count, x.stride(0), y.stride(0), m, rows_per_group, 1e-6, 0.0,
            N=n, GROUP=group, GROUP_PADDED=triton.next_power_of_2(group), SLICE=SLICE, RING=ring,
            WARPS=warps, SPIN_LIMIT=launch.HELD_GROUP_SPIN_LIMIT, W_STAGED=staged,
            num_warps=warps, launch_cooperative_grid=True,
        )  # fmt: skip

    return run, group, groups


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (2MN), % of 4250, x the product", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, _, _ = launch.rmsnorm_forward(x, w, 1e-6)
        launched = sorted(launch.take_launch_configs())
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        dot = torch.empty(m * launch.cdiv(n, SLICE), device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        for ring, per_sm, warps, staged in CONFIGS:
            shared = (ring + staged) * SLICE * 2 + 2048 + 1024
            if per_sm * shared > SHARED_PER_SM:
                continue
            run, group, groups = _group_run(m, n, ring, per_sm, warps, staged, sms)
            if group * groups > per_sm * sms:
                continue
            name = f"RING {ring}, {per_sm}/SM, {warps} warps, w {'staged' if staged else 'L2'}"
            try:
                y.fill_(float("nan"))
                run((x, w, y, rstd, dot, count))
                torch.cuda.synchronize()
                checks[name] = {
                    "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "fallback_rows": int((count != group).sum()),
                }
                runs[name] = run
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
                print("   failed", name, checks[name], flush=True)
        arg_sets = tuning.rotating_arguments((x, w, y, rstd, dot, count), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {k: 2 * m * n * x.element_size() / (us * 1e3) for k, us in times.items()}
        print(f"{m}x{n} {str(dtype)[6:]} product {gbps['product']:.0f} {launched}", flush=True)
        for k in sorted(times, key=times.get):
            print(f"    {gbps[k]:5.0f} {gbps[k] / 42.5:5.1f}%  {times['product'] / times[k]:.3f}x"
                  f"  {k} {checks.get(k, '')}", flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                               "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
