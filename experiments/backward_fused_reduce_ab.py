"""Probe: the small backward with its dw reduction inside the main kernel, behind a grid barrier.

The breakdown (`2026-11-30-daf182be02dc-backward-small-breakdown.txt`) found the backward's two
kernels add up, and the second, the fixed-order sum of the [programs, N] fp32 partials, is
2.0-3.5 µs of every small backward (23-30% of it below 2M elements). PDL, which overlaps the
second kernel's launch with the first's tail, did not shorten it (perf log), so what costs is the
reduction's own latency chain after the main kernel drains, not only the launch.

Variant "fused": rmsnorm_bwd_kernel (no residual gradient, plain storage form: N <= 8192 here)
whose programs, once their partial row is stored, meet at a grid barrier (an acq_rel atomic on a
counter, then acquire polls) and then sum the partials themselves, each program a share of the
32-column chunks (the same chunk width as the product's reduction kernel), rows in a fixed order:
one launch instead of two. The barrier needs every program resident at once: the grid is at most
the SM count at one program per SM, launched with launch_cooperative_grid (the driver refuses
a grid that cannot be co-resident). Variant "fused, plain launch" is the same kernel launched
without the cooperative attribute, to price the attribute. The counter resets itself: the last
program out of the reduction zeroes it, so the next launch on the stream finds it at zero. The
polls are bounded; a program that gives up raises a flag the probe checks (never seen is right).

Each variant at the product's tuned main-kernel configuration, bf16, device-only (the tuner's
timer: CUDA graphs over rotating inputs, best of three interleaved passes). Also "empty": a
kernel that does nothing, one program per SM, for the fixed cost of one graph node.
Checked: dx bit for bit against the product's, dw against the product's (the sum's tree over the
rows may differ: elements differing and the largest difference in ulps of bf16 are printed).

Prediction (bytes unchanged, 3MN + the partials through L2): the barrier and the in-kernel sum
cost ~1-1.5 µs where the reduction kernel costs 2.0-3.5: backward -10 to -20% at 512x2048 and
1024x2048, -2 to -5% at 4096x8192.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/backward_fused_reduce_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (512, 4096), (1024, 4096), (512, 8192),
          (1024, 8192), (2048, 8192), (4096, 8192)]  # fmt: skip
REDUCE_N = 32
SPIN_LIMIT = 1 << 20  # polls, ~0.3 s: far past any real wait


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def fused_bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DW, COUNT,
    stride_x_row, stride_dy_row, stride_dx_row, M, N, rows_per_program, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    REDUCE_ROWS: tl.constexpr, REDUCE_N: tl.constexpr, SPIN_LIMIT: tl.constexpr,
):  # fmt: skip
    """rmsnorm_bwd_kernel at daf182be02dc (HAS_DH_OUT and HOLD_STORAGE_FORM off), then the dw
    reduction after a grid barrier. COUNT: int32 [3] = arrivals, departures, gave-up flag."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
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
        dy = dy.to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        x_hat = x.to(tl.float32) * rstd[:, None]
        g = w[None, :] * dy
        mean_gx = tl.sum(g * x_hat, axis=1) / N
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(
            DX + rows[:, None] * stride_dx_row + cols[None, :],
            dx.to(DX.dtype.element_ty),
            mask=mask,
        )
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)

    # grid barrier: every thread's partial stores precede the release of the arrival
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNT, 1, sem="acq_rel") + 1
    tries = 0
    while (arrived < programs) & (tries < SPIN_LIMIT):
        arrived = tl.atomic_add(COUNT, 0, sem="acquire")
        tries += 1
    if arrived < programs:
        tl.atomic_xchg(COUNT + 2, 1)
    tl.debug_barrier()  # every thread reads the partials after the acquire

    r = tl.arange(0, REDUCE_ROWS)
    for chunk in range(pid, tl.cdiv(N, REDUCE_N), programs):
        c = chunk * REDUCE_N + tl.arange(0, REDUCE_N)
        tile = tl.load(
            DW_PARTIAL + r[:, None].to(tl.int64) * N + c[None, :],
            mask=(r < programs)[:, None] & (c < N)[None, :], other=0.0, volatile=True,
        )  # fmt: skip
        tl.store(DW + c, tl.sum(tile, axis=0).to(DW.dtype.element_ty), mask=c < N)

    # the last program out resets the counter for the next launch on the stream
    left = tl.atomic_add(COUNT + 1, 1, sem="acq_rel") + 1
    if left == programs:
        tl.atomic_xchg(COUNT, 0)
        tl.atomic_xchg(COUNT + 1, 0)


@triton.jit
def empty_kernel(P):
    pass


def _fused_run(m, n, programs, rows_per_program, meta):
    def run(a, cooperative=True):
        dy, x, w, rstd, dx, dw, partial, count = a
        fused_bwd_kernel[(programs,)](
            x, w, dy, rstd, dx, partial, dw, count, x.stride(0), dy.stride(0), dx.stride(0),
            m, n, rows_per_program, 0.0, m.bit_length(), launch_cooperative_grid=cooperative,
            **meta,
        )  # fmt: skip

    return run


def _ulps_bf16(a, b):
    diff = (a.float() - b.float()).abs()
    scale = b.float().abs().clamp_min(1e-30)
    return float((diff / (scale * 2.0**-7)).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    print("device-only µs; dx/dw against the product's", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        dx_ref, dw_ref = launch.rmsnorm_backward(dy, x, w, rstd)  # the tuner picks the config
        config = launch.take_launch_configs()["rmsnorm_bwd_kernel"]
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        block_n = triton.next_power_of_2(n)
        meta = {
            "BLOCK_M": config["BLOCK_M"], "LOOP_STAGES": config["LOOP_STAGES"],
            "num_warps": config["num_warps"], "num_stages": config["num_stages"],
            "BLOCK_N": block_n, "REDUCE_ROWS": triton.next_power_of_2(programs),
            "REDUCE_N": REDUCE_N, "SPIN_LIMIT": SPIN_LIMIT,
        }  # fmt: skip
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(programs, n, device="cuda")
        count = torch.zeros(3, device="cuda", dtype=torch.int32)

        fused = _fused_run(m, n, programs, rows_per_program, meta)
        check = {}
        try:
            for _ in range(20):  # repeated launches: the counter must reset itself
                fused((dy, x, w, rstd, dx, dw, partial, count))
            torch.cuda.synchronize()
            check = {
                "dx_differing": int((dx != dx_ref).sum()),
                "dw_differing": int((dw != dw_ref).sum()),
                "dw_max_ulps": _ulps_bf16(dw, dw_ref),
                "count_after": count.tolist(),
            }
        except Exception as error:
            check = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw, partial, count), l2)
        stream.wait_stream(torch.cuda.current_stream())
        runs = {
            "product": lambda a: launch._backward_launches(
                a[0], a[1], a[2], a[3], 0.0, a[4], a[0], False, a[5]
            ),
            "fused": fused,
            "fused, plain launch": lambda a, fused=fused: fused(a, cooperative=False),
            "empty": lambda a: empty_kernel[(sms,)](a[7]),
        }  # fmt: skip
        times = time_runs(runs, arg_sets, stream, passes=3)
        gave_up = [int(a[7][2]) for a in arg_sets]
        cells = "  ".join(f"{name}: {us:6.2f}" for name, us in times.items())
        ratio = times["product"] / times["fused"]
        print(f"{m:5d}x{n:5d}  {cells}  product/fused {ratio:.3f}  gave up {sum(gave_up)}"
              f"  {check}  programs {programs} [{config}]", flush=True)  # fmt: skip
        rows_out.append({"m": m, "n": n, "config": config, "programs": programs, "us": times,
                         "check": check, "gave_up": gave_up})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
