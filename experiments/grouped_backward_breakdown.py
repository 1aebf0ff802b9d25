"""Probe: where the grouped backward's fixed cost a call goes, after
`...-58c1c681e183-grouped-fill-drain.txt`.

That probe fitted the grouped backward's time against M: a cost a row at 86.9% of the copy at
131072 columns and 88.5% at 262144 (75.4% at 1048576), but a fixed cost of 19.9, 21.4 and
35.5 µs a call against the copy kernel's 2.1-2.8. At 512x131072 that is a sixth of the call
(run 4: 74.5% of the copy). Here the product's grouped backward (launch._backward_held_group,
called directly) whole, without its dw reduction (backward_launch._reduce_partials replaced by nothing:
the exchange buffer's zeroing and the main kernel), the reduction alone over the same [groups,
N] partials, and the zeroing alone, over M at each width; a least-squares line for each.

Prediction: the reduction 3-5 µs (the partials' 8-16 MB read, and its launch), the zeroing 1;
the rest, 12-16 µs at 131072 and 262144, is the main kernel's fill and drain (a group's first
row waits for its whole ring, 5 chunks of x and dy an SM, and its last row's dx and the
partials' store run with nothing behind them).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/grouped_backward_breakdown.py out.json [config index [own-sets]]
"""

import json
import sys

import torch
from ab_timing import time_runs
from grouped_fill_drain import _fit

from impls.triton_rmsnorm import backward_launch, launch, tuning

#: The configuration this probe measured (the only one before v28: 16384-column slices, 1 an SM);
#: a second argument picks another of launch.HELD_GROUP_BACKWARDS by index (0: v28's 8192-column
#: slices at 2 an SM, measured in the eighteenth session).
MEASURED = launch.HELD_GROUP_BACKWARDS[int(sys.argv[2]) if len(sys.argv) > 2 else 1]
#: A third argument "own-sets" times the reduction and the zeroing alone on rotating sets of their
#: own small tensors (up to the tuner's set count), not on the whole call's 1-3 sets, where the
#: graph's replay overhead a node dominates such small kernels (the eighteenth session's review:
#: the zeroing read 1.5 -> 6.2 µs over M that way, against a flat 1.0-1.1 µs timed on its own).
OWN_SETS = sys.argv[3:] == ["own-sets"]

WIDTHS = {
    131072: [96, 192, 384, 768],
    262144: [48, 96, 192, 384],
    1048576: [12, 24, 48, 96],
}


def _whole(a):
    x, w, dy, rstd, dx, dw = a[:6]
    launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dx, False, dw, config=MEASURED)


def _without_reduction(a):
    kept = backward_launch._reduce_partials
    backward_launch._reduce_partials = lambda partial, dw: None
    try:
        _whole(a)
    finally:
        backward_launch._reduce_partials = kept


def _reduction(a):
    backward_launch._reduce_partials(a[6], a[5])


def _zeroing(a):
    a[7].zero_()


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    device = torch.device("cuda", 0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": [], "fits": []}
    runs = {"whole": _whole, "without reduction": _without_reduction, "reduction alone": _reduction,
            "zeroing alone": _zeroing}  # fmt: skip
    for n, row_counts in WIDTHS.items():
        series = {name: [] for name in runs}
        for m in row_counts:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
            dx, dw = torch.empty_like(x), torch.empty_like(w)
            group = launch.cdiv(n, MEASURED.slice_n)
            per_sm = launch._held_group_backward_programs_per_sm(0, MEASURED)
            groups, _ = launch._row_groups(m, group, device, per_sm)
            partial = torch.randn(groups, n, device="cuda")
            sums = torch.empty(m * group, dtype=torch.int64, device="cuda")
            args = (x, w, dy, rstd, dx, dw, partial, sums)
            arg_sets = tuning.rotating_arguments(args, l2)
            stream.wait_stream(torch.cuda.current_stream())
            if OWN_SETS:
                times = time_runs({k: runs[k] for k in ("whole", "without reduction")}, arg_sets,
                                  stream)  # fmt: skip
                alone = {"reduction alone": (lambda a: backward_launch._reduce_partials(a[0], a[1]),
                                             (partial, dw)),
                         "zeroing alone": (lambda a: a[0].zero_(), (sums,))}  # fmt: skip
                for name, (run, small) in alone.items():
                    small_sets = tuning.rotating_arguments(small, l2)
                    stream.wait_stream(torch.cuda.current_stream())
                    times[name] = time_runs({name: run}, small_sets, stream)[name]
            else:
                times = time_runs(runs, arg_sets, stream)
            for name, us in times.items():
                series[name].append(us)
            line = "  ".join(f"{k} {v:6.1f}" for k, v in times.items())
            print(f"{m}x{n} ({groups} groups of {group}): {line} µs", flush=True)
            result["rows"].append({"m": m, "n": n, "groups": groups, "us": times})
        for name, us in series.items():
            a, b = _fit(row_counts, us)
            steady = 3 * n * 2 / (b * 1e3) if b > 0 else float("nan")
            print(f"N={n} {name:18s}: fixed {a:6.1f} µs, a row {b:6.3f} µs ({steady:5.0f} GB/s)",
                  flush=True)  # fmt: skip
            result["fits"].append({"n": n, "case": name, "fixed_us": a, "row_us": b})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
