"""Probe: the forward of rows that are not 16-byte aligned (odd N), plain against shifted.

At 8192x4095 bf16 the product's forward ran at 3163-3192 GB/s (74.4-74.7% of the copy) against
86-91% at aligned widths (runs 3 of 83f69ecd04db and c448e93b4c87): rows of 4095 elements are
loaded and stored 2 bytes at a time, and the persistent grid's tile loop cannot stage 2-byte
loads through cp.async. Variants, each at its best of the product tuner's candidates for it
(the tuner's timer, device-only, best of two interleaved passes):
- "plain": kernels.rmsnorm_fwd_kernel, as the product launched odd N before;
- "shifted": kernels.rmsnorm_fwd_shifted_kernel (the backward's v17 frame: rows of one residue
  class per program, every load and store of x and y a 16-byte vector but at the rows' ends).
y and rstd of the two are compared (elements differing; largest difference in ulps of y).

Prediction: the shifted forward near the aligned forward (~3700-3800 GB/s at 4096 columns),
1.15-1.2x plain.

Run from the repository root on a GPU:
    PYTHONPATH=.:experiments python experiments/forward_shifted_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from backward_shifted_ab import _ulps

from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [
    (8192, 4095, torch.bfloat16),
    (8192, 4095, torch.float16),
    (16384, 4095, torch.bfloat16),
    (4096, 8191, torch.bfloat16),
    (2048, 16383, torch.bfloat16),
    (32768, 1023, torch.bfloat16),
    (8192, 4096, torch.bfloat16),  # aligned: the plain kernel's reference
]


def _launches(name, m, n, args, constexprs, grid, device):
    """(config key, grid, launch keywords) of each of the product tuner's candidates."""
    out = []
    for config in launch._candidates(name, args, constexprs):
        launch_grid, meta = launch._kernel_grid_and_meta(name, grid, {**constexprs, **config})
        out.append((tuple(sorted(config.items())), launch_grid, meta))
    return out


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("forward, µs (GB/s of 2MN), each variant at its best candidate", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda")
        args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        block_n = launch.block_size(n)
        base = {"BLOCK_N": block_n, "HAS_RESIDUAL": False,
                "HOLD_STORAGE_FORM": launch.forward_holds_storage_form(block_n, dtype)}  # fmt: skip
        kinds = {"plain": (kernels.rmsnorm_fwd_kernel, "rmsnorm_fwd_kernel",
                           {**base, "ROWS_CONTIGUOUS": True},
                           lambda meta, m=m, d=x.device: (launch._tile_programs(m, meta, d),))}  # fmt: skip
        period = launch._row_period(m, n, (x, y))
        if period > 1:
            shifted = {**base, **launch._shift_constants(n, x.element_size(), period)}
            kinds["shifted"] = (
                kernels.rmsnorm_fwd_shifted_kernel, "rmsnorm_fwd_shifted_kernel", shifted,
                lambda meta, m=m, p=period, d=x.device: (
                    launch._shifted_forward_programs(m, p, meta, d),
                ),
            )  # fmt: skip
        runs, failed = {}, {}
        for name, (kernel, tuned_name, constexprs, grid) in kinds.items():
            for key, launch_grid, meta in _launches(tuned_name, m, n, args, constexprs, grid,
                                                    x.device):  # fmt: skip

                def run(a, kernel=kernel, launch_grid=launch_grid, meta=meta):
                    kernel[launch_grid](*a, **meta)

                try:
                    run(args)
                    torch.cuda.synchronize()
                except Exception as error:  # an unrunnable candidate does not end the probe
                    failed[f"{name} {key}"] = f"{type(error).__name__}: {str(error)[:100]}"
                    continue
                runs[(name, key)] = run
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        best = {}
        for (name, key), us in times.items():
            if name not in best or us < best[name][0]:
                best[name] = (us, key)
        outputs = {}
        for name, (_, key) in best.items():
            y.fill_(float("nan"))
            rstd.fill_(float("nan"))
            runs[(name, key)](args)
            torch.cuda.synchronize()
            outputs[name] = (y.clone(), rstd.clone())
        checks = {}
        if "shifted" in outputs:
            (y_s, r_s), (y_p, r_p) = outputs["shifted"], outputs["plain"]
            checks = {"y_differ": int((y_s != y_p).sum()), "y_nan": int(y_s.isnan().sum()),
                      "y_ulps": _ulps(y_s, y_p), "rstd_differ": int((r_s != r_p).sum())}  # fmt: skip
        gb = 2 * m * n * x.element_size() / 1e3
        cells = "  ".join(f"{name}: {us:7.2f} ({gb / us:4.0f})" for name, (us, _) in best.items())
        ratio = ""
        if "shifted" in best:
            ratio = f"  shifted/plain {best['plain'][0] / best['shifted'][0]:.3f}x"
        print(f"{m:6d}x{n:5d} {str(dtype)[6:]:8s} {cells}{ratio}", flush=True)
        for name, (_, key) in best.items():
            print(f"    {name}: {dict(key)}", flush=True)
        if checks:
            print(f"    {checks}", flush=True)
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "period": period,
                         "times": {f"{k[0]} {dict(k[1])}": us for k, us in times.items()},
                         "best": {k: [us, dict(c)] for k, (us, c) in best.items()},
                         "checks": checks, "failed": failed})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
