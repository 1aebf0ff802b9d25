"""Probe: does the grouped kernels' speed depend on where their exchange words (SUMS) sit?

In four full wide runs of five the grouped backward at 64x1048576 bf16 ran ~180 µs where it
otherwise runs 124-146 (`...-0eb2df0e87cf-wide-path-choice.txt`: slow in every retime, also
on fresh copies of x, dy and dx; `...-954323dd897c-grouped-backward-slow-diagnosis.txt`: a run
where it was not slow, the kernel itself 136 µs of the path's 144). Fresh copies of the inputs
did not change it, but the exchange's words are allocated anew by each call, from the caching
allocator, so likely at the same address each time. At 1048576 columns a row's 64 words are
512 bytes: 128 programs publish (atomic exchange) into, and poll, 4 lines a row, 2 rows at a
time; where those lines fall among the L2's slices and partitions could decide the polls'
latency.

The grouped backward (and the grouped forward) as the product launches them, but with SUMS a
view at a chosen byte offset into one zeroed 64 MiB buffer (zeroed before each launch, as the
product's torch.zeros), device-only (the tuner's timer), best of two interleaved passes, over
offsets of 0 B to 32 MiB (powers of two and 12 random multiples of 128 B).

Prediction: if placement is the cause, some offsets run ~1.25x the best at 64x1048576, fewer
or none at narrower rows (groups of 8-16 programs, one or two lines a row).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/grouped_exchange_placement_sweep.py out.json
"""

import json
import random
import statistics
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import direct, gluon_kernels, launch, tuning

#: The configuration this probe measured (the only one before v28: 16384-column slices, 1 an SM).
MEASURED = launch.HELD_GROUP_BACKWARDS[1]

BACKWARD_SHAPES = [(64, 1048576, torch.bfloat16), (64, 1048576, torch.float16),
                   (256, 262144, torch.bfloat16), (512, 131072, torch.bfloat16)]  # fmt: skip
FORWARD_SHAPES = [(64, 1048576, torch.bfloat16), (512, 131072, torch.bfloat16)]
POOL_BYTES = 64 << 20


def _offsets() -> list[int]:
    fixed = [0, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
             262144, 524288, 1 << 20, 2 << 20, (4 << 20) + 4096, (16 << 20) + 12288]  # fmt: skip
    rng = random.Random(0)
    return fixed + sorted(128 * rng.randrange((32 << 20) // 128) for _ in range(12))


def _backward_run(m, n, sums_at):
    """launch._backward_held_group with SUMS at sums_at(count) (a zeroed view of the pool)."""
    group = launch.cdiv(n, MEASURED.slice_n)
    groups, rows_per_group = launch._row_groups(m, group, torch.device("cuda", 0))
    config = {"GROUP": group, "GROUP_PADDED": launch.held_group_words(group, MEASURED.warps),
              "CHUNK": MEASURED.chunk, "CHUNKS": MEASURED.chunks,
              "RING": MEASURED.ring, "WARPS": MEASURED.warps}  # fmt: skip
    meta = {"N": n, **config, "HAS_DH_OUT": False, "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT,
            "num_warps": MEASURED.warps, "launch_cooperative_grid": True}  # fmt: skip

    def run(a):
        dy, x, w, rstd, dx, dw, partial = a
        sums = sums_at(m * group)
        sums.zero_()
        args = (x, w, dy, rstd, dx, partial, dy, sums, x.stride(0), dy.stride(0), dx.stride(0),
                dy.stride(0), m, rows_per_group, 0.0, launch.HELD_GROUP_TAG_OFFSET)  # fmt: skip
        direct.launch(gluon_kernels.rmsnorm_bwd_held_group_kernel, (groups * group,), args,
                      meta, 0)  # fmt: skip
        launch._reduce_partials(partial, dw)

    return run, groups


def _forward_run(m, n, sums_at):
    """launch._forward_held_group (its first configuration) with SUMS at sums_at(count)."""
    config = launch.HELD_GROUP_FORWARDS[0]
    device = torch.device("cuda", 0)
    group = launch.cdiv(n, config.slice_n)
    per_sm = launch._held_group_forward_programs_per_sm(0, config)
    groups = launch._group_count(m, group, device, per_sm)
    constexprs = {"GROUP": group, "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "SLICE": config.slice_n, "RING": config.ring, "WARPS": config.warps}  # fmt: skip
    meta = {"N": n, **constexprs, "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT,
            "num_warps": config.warps, "launch_cooperative_grid": True}  # fmt: skip

    def run(a):
        x, w, y, rstd = a
        sums = sums_at(m * group)
        sums.zero_()
        args = (x, w, y, rstd, sums, x.stride(0), y.stride(0), m, 1e-6, 0.0,
                launch.HELD_GROUP_TAG_OFFSET)  # fmt: skip
        direct.launch(gluon_kernels.rmsnorm_fwd_held_group_kernel, (groups * group,), args,
                      meta, 0)  # fmt: skip

    return run, groups


def _sweep(label, make_run, m, n, arg_sets, pool, stream, offsets) -> dict:
    runs = {}
    for offset in offsets:

        def sums_at(count, offset=offset):
            return pool[offset // 8 : offset // 8 + count]

        runs[offset], groups = make_run(m, n, sums_at)
    for run in runs.values():  # compile outside the timing
        run(arg_sets[0])
    torch.cuda.synchronize()
    stream.wait_stream(torch.cuda.current_stream())
    times = time_runs(runs, arg_sets, stream, passes=2)
    best = min(times.values())
    slow = {o: t for o, t in times.items() if t > 1.1 * best}
    print(f"{label}: best {best:.1f} µs, median {statistics.median(times.values()):.1f}, worst "
          f"{max(times.values()):.1f}; over 1.1x the best at {len(slow)} of {len(times)} offsets"
          f" ({groups} groups)", flush=True)  # fmt: skip
    print("   ", "  ".join(f"{o}:{t:.1f}" for o, t in times.items()), flush=True)
    return {"label": label, "m": m, "n": n, "groups": groups,
            "us_by_offset": {str(o): t for o, t in times.items()}}  # fmt: skip


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    pool = torch.zeros(POOL_BYTES // 8, dtype=torch.int64, device="cuda")
    offsets = _offsets()
    rows = []
    for m, n, dtype in BACKWARD_SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rand(m, device="cuda") + 0.5
        groups, _ = launch._row_groups(m, launch.cdiv(n, MEASURED.slice_n), x.device)
        partial = torch.empty(groups, n, device="cuda")
        args = (dy, x, w, rstd, torch.empty_like(x), torch.empty_like(w), partial)
        arg_sets = tuning.rotating_arguments(args, l2)
        label = f"bwd {m}x{n} {str(dtype).removeprefix('torch.')}"
        rows.append(_sweep(label, _backward_run, m, n, arg_sets, pool, stream, offsets))
        del x, dy, args, arg_sets
    for m, n, dtype in FORWARD_SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        args = (x, w, torch.empty_like(x), torch.empty(m, device="cuda"))
        arg_sets = tuning.rotating_arguments(args, l2)
        label = f"fwd {m}x{n} {str(dtype).removeprefix('torch.')}"
        rows.append(_sweep(label, _forward_run, m, n, arg_sets, pool, stream, offsets))
        del x, args, arg_sets
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                   "pool_address": pool.data_ptr(), "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
