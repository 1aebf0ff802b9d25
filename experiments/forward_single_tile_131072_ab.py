"""Probe: the held single-tile forward past 65536 columns, its overflow spilled to L1.

v15 made the single-tile forward hold 16-bit x as loaded between its reduction and its scaling:
at 65536 columns and 32 warps that is 64 registers a thread and no spills, and the forward went
from 68.5% to 87.6% of the copy. At N = 131072 the row is 256 KB, the whole register file; the
product takes the looped kernel there (x read twice, 66.5% of the copy at 512x131072, 0.73 of
QuACK). ptxas (Triton 3.6, sm_90, bf16, held, 32 warps) reports 64 registers, 192 bytes of spill
stores and a 136-byte stack frame a thread: 136 KB a program in local memory, which L1 (up to
256 KB an SM, less the shared memory in use) may hold, so that x would still cross HBM once.
At 16 warps: 512 bytes of spills (400 KB of stack a program: past L1). At 262144 columns the
spills are 2 KB a thread, so it is not tried.

Timed: the product's forward (whatever path it measures fastest: the looped kernel here) and
rmsnorm_fwd_kernel at BLOCK_N = 131072 with HOLD_STORAGE_FORM, one program per row, 16 and 32
warps, device-only (the tuner's timer, best of two interleaved passes). y and rstd against the
product's: elements differing, and the largest difference of y relative to each element, in
ulps of bf16/fp16 (the single tile and the looped kernel sum the squares in different orders, so
rstd may differ in its last bits and y by about an ulp; for fp16 y in the subnormal range the
relative measure overstates it: a sanity check, not a bound).

Prediction: if the stack stays in L1, ~80-88% of the copy at 32 warps (v15's 65536 figure, less
the spill traffic); if it goes to L2, below the product's 66.5%.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=. python experiments/forward_single_tile_131072_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [("bf16", 512, 131072), ("bf16", 256, 131072), ("bf16", 1024, 131072),
          ("fp16", 512, 131072)]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ULP = {"bf16": 2.0**-7, "fp16": 2.0**-10}


def _held_tile_run(m, n, num_warps):
    meta = {"BLOCK_M": 1, "BLOCK_N": triton.next_power_of_2(n), "HAS_RESIDUAL": False,
            "PERSISTENT": False, "LOOP_STAGES": 1, "ROWS_CONTIGUOUS": True,
            "HOLD_STORAGE_FORM": True, "num_warps": num_warps, "num_stages": 1}  # fmt: skip

    def run(a):
        x, w, y, rstd = a
        args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        kernels.rmsnorm_fwd_kernel[(m,)](*args, **meta)

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (2MN); y and rstd against the product's", flush=True)
    for dtype_name, m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=DTYPES[dtype_name])
        w = torch.randn(n, device="cuda", dtype=DTYPES[dtype_name])
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)  # path measured, tuned
        launched = launch.take_launch_configs()
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        for warps in (32, 16):
            runs[f"held tile, {warps} warps"] = _held_tile_run(m, n, warps)
        checks = {}
        for name, run in runs.items():
            if name == "product":
                continue
            try:
                y.fill_(float("nan"))
                run((x, w, y, rstd))
                torch.cuda.synchronize()
                ulps = (y.float() - y_ref.float()).abs() / (
                    y_ref.float().abs().clamp_min(1e-30) * ULP[dtype_name]
                )
                checks[name] = {"y_differing": int((y != y_ref).sum()),
                                "y_max_ulps": float(ulps.max()),
                                "rstd_max_rel": float(((rstd - rstd_ref).abs() / rstd_ref).max())}  # fmt: skip
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {name: 2 * m * n * 2 / (us * 1e3) for name, us in times.items()}
        cells = "  ".join(f"{name}: {gbps[name]:5.0f}" for name in times)
        print(f"{dtype_name} {m:5d}x{n:6d}  {cells}  {sorted(launched)}  {checks}", flush=True)
        result["rows"].append({"dtype": dtype_name, "m": m, "n": n, "us": times, "gbps": gbps,
                               "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
