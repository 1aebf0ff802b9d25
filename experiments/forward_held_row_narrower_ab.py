"""Probe: the held-row forward (Gluon, v16) at 32768 and 65536 columns, against the single tile.

At 1024x65536 bf16 the product's forward (the single tile holding x as loaded, v15) ran at
87.0% of the copy, 0.955 of QuACK; at 2048x32768 at 89.1%, 0.964 of torch.compile (run of
e58d4129a949). The held-row kernel (gluon_kernels.rmsnorm_fwd_held_row_kernel: one program per
SM, a row's first REG columns in registers and the rest in shared memory, the next row loaded
while this one's y is written) is offered only past 65536 columns. Here it is launched directly
at narrower rows, over a few splits of the row (REG + SHARED_CHUNKS x CHUNK) and warps, against
the product's forward (its tuned single tile), device-only, the tuner's timer, best of two
interleaved passes. y and rstd are compared with the product's.

Prediction: the single tile keeps 2-4 programs' rows in flight an SM; the held row one, with the
next row's loads overlapping this row's stores. At 1024x65536 (8 rows a program) its fixed cost
(the first row's load, the last row's stores: the backward's held row lost ~20 µs to it) is
~15% of ~70 µs: a tie at best; at 2048x32768 (16 rows a program) a few percent either way.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/forward_held_row_narrower_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

SHAPES = [
    (1024, 65536, torch.bfloat16),
    (512, 65536, torch.float16),
    (2048, 65536, torch.bfloat16),
    (2048, 32768, torch.bfloat16),
    (4096, 32768, torch.bfloat16),
]
#: N -> (REG, CHUNK, SHARED_CHUNKS) splits of the row
SPLITS = {
    65536: [(32768, 32768, 1), (32768, 16384, 2), (16384, 16384, 3)],
    32768: [(16384, 16384, 1), (16384, 8192, 2), (8192, 8192, 3)],
}
WARPS = (16, 32)


def _held_run(m, n, split, warps, programs):
    reg, chunk, chunks = split
    kernel = gluon_kernels.rmsnorm_fwd_held_row_kernel

    def run(a):
        x, w, y, rstd = a
        kernel[(programs,)](
            x, w, y, rstd, x.stride(0), y.stride(0), m, 1e-6, 0.0, N=n, REG=reg,
            SHARED_CHUNKS=chunks, CHUNK=chunk, WARPS=warps, num_warps=warps,
        )  # fmt: skip

    return run


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
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        for split in SPLITS[n]:
            for warps in WARPS:
                name = f"held {split[0]}+{split[2]}x{split[1]}, {warps} warps"
                run = _held_run(m, n, split, warps, min(m, sms))
                try:
                    y.fill_(float("nan"))
                    run((x, w, y, rstd))
                    torch.cuda.synchronize()
                    checks[name] = {
                        "y_differing": int((y != y_ref).sum()),
                        "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                        "rstd_max_rel": float(((rstd - rstd_ref).abs() / rstd_ref).max()),
                    }
                    runs[name] = run
                except Exception as error:  # a configuration that fails is reported, not timed
                    checks[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {name: 2 * m * n * x.element_size() / (us * 1e3) for name, us in times.items()}
        best = min((t, name) for name, t in times.items() if name != "product")
        print(f"{m:5d}x{n:6d} {str(dtype)[6:]:8s} product {gbps['product']:5.0f}  best held "
              f"{gbps[best[1]]:5.0f} ({best[1]})  held/product {times['product'] / best[0]:.3f}"
              f"  {sorted(launched)}", flush=True)  # fmt: skip
        for name in times:
            print(f"    {name}: {gbps[name]:5.0f} {checks.get(name, '')}", flush=True)
        result["rows"].append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                               "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
