"""Probe: the grouped forward (v21 kernel, v22 exchange) at 16384 < N <= 131072, where the
product offers only the single tile, the looped kernel and v16's held row.

In the wide preset's run 4 (ef67b6007d7c) the forward trails QuACK at 512x131072 (0.84, v16's
held row: one row an SM, 76.6% of the copy), 1024x65536 (0.953) and torch.compile at 2048x32768
(0.964). The grouped forward ran 80-82% of the copy at 262144 columns. Under v21's exchange it
lost to the held row at 131072 (0.91x); under v22's it is unmeasured below 262144.

Each of the product's forward paths that can serve the shape is timed on its own (each tuned at
its first call, as the product's), beside the grouped kernel launched as the product launches it
at several (slice, ring, programs an SM, warps). Device-only, the tuner's timer, best of two
interleaved passes; y and rstd against the product's.

Prediction: at 131072 the group (16 programs a row, 33 groups) 1.03-1.08x the held row (its
pipeline holds 2 rows' slices a program where the held row holds one row an SM, no overlap of a
row's load with the previous row's store beyond the ring); at 65536 and 32768 within 2% of the
best path (the single tile already reads x once at 87-89%).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/forward_group_below_held_row_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import dispatch, gluon_kernels, launch, tuning

SHAPES = [
    (512, 131072, torch.bfloat16),
    (512, 131072, torch.float16),
    (1024, 65536, torch.bfloat16),
    (1024, 65536, torch.float16),
    (2048, 32768, torch.bfloat16),
    (4096, 16384, torch.bfloat16),
    (256, 262144, torch.bfloat16),
]
SHARED_PER_SM = 233472
RESERVED = 1024
# (slice, ring, programs an SM, warps)
CONFIGS = [
    (8192, 2, 4, 8),  # the product's (v21)
    (8192, 3, 3, 8),
    (4096, 2, 7, 4),
    (4096, 2, 7, 8),
    (4096, 3, 6, 4),
    (16384, 2, 2, 16),
]


def _group_run(m, n, slice_cols, ring, per_sm, warps):
    group = launch.cdiv(n, slice_cols)
    groups = launch._group_count(m, group, torch.device("cuda", 0), per_sm)
    meta = {"N": n, "GROUP": group, "GROUP_PADDED": launch.held_group_words(group, warps),
            "SLICE": slice_cols, "RING": ring, "WARPS": warps,
            "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT, "num_warps": warps,
            "launch_cooperative_grid": True}  # fmt: skip

    def run(a):
        x, w, y, rstd, sums = a
        sums.zero_()  # as the product's torch.zeros a call
        gluon_kernels.rmsnorm_fwd_held_group_kernel[(groups * group,)](
            x, w, y, rstd, sums, x.stride(0), y.stride(0), m, 1e-6, 0.0, 0, **meta
        )

    return run, group, groups


def _path_run(path):
    def run(a):
        x, w, y, rstd, _ = a
        path(x, w, y, rstd, x, x, (x.stride(0), y.stride(0), x.stride(0), x.stride(0)), 1e-6,
             0.0, False)  # fmt: skip

    return run


def main(out_path: str, shapes=SHAPES, configs=CONFIGS) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (2MN), % of 4250, x the product", flush=True)
    for m, n, dtype in shapes:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)
        launched = sorted(launch.take_launch_configs())
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        sums = torch.zeros(
            m * launch.cdiv(n, min(c[0] for c in configs)), dtype=torch.int64, device="cuda"
        )
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        device = torch.device("cuda", 0)
        paths = {dispatch.path_name(p): p for p in launch._forward_paths(m, n, device)}
        if launch.SINGLE_TILE_MAX_N < n <= launch.HELD_ROW_MAX_N:
            paths["held row"] = launch._forward_held_row
        candidates = {name: _path_run(p) for name, p in paths.items()}
        for slice_cols, ring, per_sm, warps in configs:
            if per_sm * ((ring + 1) * slice_cols * 2 + 4096 + RESERVED) > SHARED_PER_SM:
                continue
            run, group, groups = _group_run(m, n, slice_cols, ring, per_sm, warps)
            name = f"group {slice_cols} x {group}, RING {ring}, {per_sm}/SM, {warps} warps"
            candidates[name] = run
        checks = {}
        for name, run in candidates.items():
            try:
                y.fill_(float("nan"))
                rstd.fill_(float("nan"))
                run((x, w, y, rstd, sums))
                torch.cuda.synchronize()
                checks[name] = {
                    "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "rstd_max_rel_diff": float(((rstd - rstd_ref) / rstd_ref).abs().max()),
                }
                runs[name] = run
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                print("   failed", name, checks[name], flush=True)
        launch.take_launch_configs()
        arg_sets = tuning.rotating_arguments((x, w, y, rstd, sums), l2)
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
