"""Probe: the grouped forward's number of groups against its rows' rounds.

The grouped forward runs as many groups as fit its programs an SM (launch._group_count: at 6 an
SM, 24 groups of 32 programs at 131072 columns, 12 of 64 at 262144, 3 of 256 at 1048576) and
deals the rows out in turn, so at the wide preset's shapes (512, 256 and 64 rows) a group does
22 rows where 21.33 would be even: the last round runs a third of the groups. If a group's
pace is bounded by its own latency rather than by the memory's bandwidth, that round costs
nearly a full one: up to 3%. Fewer groups that divide the rows (16, 8 and 2: 32 rows each)
leave no short round but fewer rows in flight.

Each configuration of launch.HELD_GROUP_FORWARDS at every group count G = ceil(M / R) for the
rounds R from the product's up to twice that (the fewest groups for each number of rounds),
bf16, device-only (the tuner's timer), best of two interleaved passes, y checked equal bit for
bit to the product's count (the rows' sums do not depend on the groups).

Prediction: the divisor counts 1-3% faster at 64-512 rows if the last round's groups are
latency-bound; equal or slower if the bandwidth carries a short round at full speed.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_forward_group_count_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import direct, gluon_kernels, launch, tuning

SHAPES = [(512, 131072), (256, 262144), (64, 1048576), (1024, 131072), (256, 131072),
          (64, 131072), (128, 262144)]  # fmt: skip


def _run(m, n, config, groups):
    group = launch.cdiv(n, config.slice_n)
    constexprs = {"GROUP": group, "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "SLICE": config.slice_n, "RING": config.ring, "WARPS": config.warps}  # fmt: skip
    meta = {"N": n, **constexprs, "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT,
            "num_warps": config.warps, "launch_cooperative_grid": True}  # fmt: skip

    def run(a):
        x, w, y, rstd = a
        sums = torch.zeros((m * group,), dtype=torch.int64, device=x.device)
        args = (x, w, y, rstd, sums, x.stride(0), y.stride(0), m, 1e-6, 0.0,
                launch.HELD_GROUP_TAG_OFFSET)  # fmt: skip
        direct.launch(gluon_kernels.rmsnorm_fwd_held_group_kernel, (groups * group,), args,
                      meta, 0)  # fmt: skip

    return run


def _counts(m, product_groups) -> list[int]:
    rounds = launch.cdiv(m, product_groups)
    counts = [product_groups]
    for r in range(rounds, 2 * rounds + 1):
        g = launch.cdiv(m, r)
        if g not in counts and g < product_groups:
            counts.append(g)
    return counts


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    device = torch.device("cuda", 0)
    rows = []
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        args = (x, w, torch.empty_like(x), torch.empty(m, device="cuda"))
        arg_sets = tuning.rotating_arguments(args, l2)
        for config in launch.HELD_GROUP_FORWARDS:
            group = launch.cdiv(n, config.slice_n)
            per_sm = launch._held_group_forward_programs_per_sm(0, config)
            product = launch._group_count(m, group, device, per_sm)
            runs = {g: _run(m, n, config, g) for g in _counts(m, product)}
            outputs = {}
            for g, run in runs.items():  # compile; y of each
                args[2].fill_(float("nan"))
                run(args)
                outputs[g] = args[2].clone()
            same = {g: bool(torch.equal(outputs[g], outputs[product])) for g in runs}
            stream.wait_stream(torch.cuda.current_stream())
            times = time_runs(runs, arg_sets, stream, passes=2)
            base = times[product]
            cells = "  ".join(f"G={g} ({launch.cdiv(m, g)} rounds) {t:.1f} ({base / t:.3f}x)"
                              f"{'' if same[g] else ' y differs'}" for g, t in times.items())  # fmt: skip
            print(f"{m}x{n} slice {config.slice_n}, {per_sm}/SM, product G={product}: {cells}",
                  flush=True)  # fmt: skip
            rows.append({"m": m, "n": n, "config": config._asdict(), "product_groups": product,
                         "us": {str(g): t for g, t in times.items()},
                         "y_equal": {str(g): s for g, s in same.items()}})  # fmt: skip
        del x, args, arg_sets
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
