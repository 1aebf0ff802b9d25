"""Probe: v16's held-row forward (gluon_kernels.rmsnorm_fwd_held_row_kernel) at 16384-65536
columns, where the product runs the single tile (v15) and trails: 1024x65536 0.955 of QuACK
(87.5% of the copy), 512x65536 fp16 0.96, 2048x32768 bf16 0.97 of torch.compile, 4096x16384
bf16 0.978 of Liger (run 4).

The single tile at 65536 columns is one program of 32 warps an SM, one row a program: while a
row is reduced and written, its SM loads nothing. The held-row kernel is persistent and loads a
row's next row while it writes this one, from registers and a ring of shared buffers; at 131072
it ran one program an SM. Here it runs narrower rows with smaller register parts, so that two or
more programs share an SM (one's reduction under another's loads), beside the product's forward.
The kernel is launched as launch._forward_held_row does, with grid min(M, programs an SM x SMs);
the configurations were checked offline for sm_90 (ptxas: no spills, 40-64 registers a thread
but the 32768-in-registers one).

Prediction: at 65536 columns two programs an SM (16 warps, 16384 elements in registers, three
16384-element buffers) 1.02-1.05x the single tile; at 32768 and 16384 within 2% (the single tile
already runs several programs an SM there).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_row_forward_narrower_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

SHAPES = [
    (1024, 65536, torch.bfloat16),
    (1024, 65536, torch.float16),
    (512, 65536, torch.float16),
    (2048, 32768, torch.bfloat16),
    (2048, 32768, torch.float16),
    (4096, 16384, torch.bfloat16),
]
# (REG, CHUNK, SHARED_CHUNKS, WARPS, programs an SM), by N
CONFIGS = {
    65536: [
        (32768, 16384, 2, 32, 1),
        (16384, 16384, 3, 16, 1),
        (16384, 16384, 3, 16, 2),
        (16384, 8192, 6, 16, 2),
        (8192, 8192, 7, 8, 1),
    ],
    32768: [
        (16384, 8192, 2, 16, 1),
        (16384, 8192, 2, 16, 2),
        (8192, 8192, 3, 16, 3),
        (8192, 8192, 3, 8, 4),
    ],
    16384: [
        (8192, 8192, 1, 8, 3),
        (8192, 4096, 2, 8, 4),
        (4096, 4096, 3, 4, 7),
    ],
}


def _held_row_run(m, n, reg, chunk, chunks, warps, per_sm):
    meta = {"N": n, "REG": reg, "SHARED_CHUNKS": chunks, "CHUNK": chunk, "WARPS": warps,
            "num_warps": warps}  # fmt: skip
    grid = (min(m, per_sm * launch._programs_cap(torch.device("cuda", 0))),)

    def run(a):
        x, w, y, rstd = a
        gluon_kernels.rmsnorm_fwd_held_row_kernel[grid](
            x, w, y, rstd, x.stride(0), y.stride(0), m, 1e-6, 0.0, **meta
        )

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (2MN), % of 4250, x the product", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)
        launched = sorted(launch.take_launch_configs())
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        for config in CONFIGS[n]:
            name = "held row REG {} + {} x {}, {} warps, {}/SM".format(*config)
            run = _held_row_run(m, n, *config)
            try:
                y.fill_(float("nan"))
                rstd.fill_(float("nan"))
                run((x, w, y, rstd))
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
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
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
