"""Probe: the grouped backward (v20) with narrower slices and more programs an SM.

v20's backward gives each program of a row's group a 16384-column slice (2 chunks of 8192), a
ring of 5 chunk slots (x and dy), one program per SM: 54-65% of the copy at 65536-1048576
columns (run of 05adc346041a), against v19's 73-87% with one row a program. v21's forward found
the same exchange 1.10x faster with 8192-column slices at 4 programs an SM than with 16384 at 1
(`2026-11-30-bb689b9d08e7-forward-held-group-sweep.txt`): more programs an SM keep more copies
in flight and hide one program's wait behind another's work. Here the product's kernel
(gluon_kernels.rmsnorm_bwd_held_group_kernel, CHUNKS 1 or 2) at CHUNK 8192 or 4096, CHUNKS 1
or 2, 2 to 4 programs an SM where the shared memory takes them, against the product's backward
(its measured path, v20 at these widths), whole backward (the arrival counts' zeroing, the
kernel, the dw reduction), device-only, the tuner's timer, best of two interleaved passes; dx
and dw against the product's (ulps at the product's magnitude).

Prediction: as in the forward, 1.1-1.2x the product (70-78% of the copy) at 2 programs an SM.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_held_group_slices_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

SHAPES = [
    (1024, 65536, torch.bfloat16),
    (2048, 65536, torch.bfloat16),
    (512, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
]
SHARED_PER_SM = 233472
# (chunk, chunks, ring, warps, programs an SM)
CONFIGS = [
    (8192, 2, 5, 8, 1),  # the product's
    (8192, 2, 4, 8, 1),
    (8192, 1, 2, 8, 2),
    (8192, 1, 3, 8, 2),
    (8192, 1, 2, 16, 2),
    (4096, 2, 4, 8, 2),
    (4096, 2, 5, 8, 2),
    (4096, 1, 2, 4, 4),
    (4096, 1, 2, 8, 4),
    (4096, 1, 3, 8, 3),
]


def _shared_bytes(chunk, chunks, ring):
    return ring * chunk * 4 + chunks * chunk * 2 + 2048 + 1024


def _group_run(m, n, chunk, chunks, ring, warps, per_sm, sms):
    group = launch.cdiv(n, chunks * chunk)
    groups = max(1, min(m, per_sm * sms // group))
    rows_per_group = launch.cdiv(m, groups)
    groups = launch.cdiv(m, rows_per_group)

    def run(a):
        dy, x, w, rstd, dx, dw, partial, dot, count = a
        count.zero_()
        gluon_kernels.rmsnorm_bwd_held_group_kernel[(groups * group,)](
            x, w, dy, rstd, dx, partial, dx, dot, count, x.stride(0), dy.stride(0), dx.stride(0),
            dx.stride(0), m, rows_per_group, 0.0, N=n, GROUP=group,
            GROUP_PADDED=triton.next_power_of_2(group), CHUNK=chunk, CHUNKS=chunks, RING=ring,
            HAS_DH_OUT=False, WARPS=warps, SPIN_LIMIT=launch.HELD_GROUP_SPIN_LIMIT,
            num_warps=warps, launch_cooperative_grid=True,
        )  # fmt: skip
        launch._reduce_partials(partial[:groups], dw)

    return run, group, groups


def _product_run(a):
    dy, x, w, rstd, dx, dw, *_ = a
    launch.rmsnorm_backward(dy, x, w, rstd)


def _ulps(a, ref, dtype):
    spacing = torch.finfo(dtype).eps * ref.float().abs().clamp_min(torch.finfo(dtype).tiny)
    return float(((a.float() - ref.float()).abs() / spacing).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    print("whole backward: GB/s of 3MN, % of 4250, x the product", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        ref_dx, ref_dw = launch.rmsnorm_backward(dy, x, w, rstd)  # measured, tuned
        launched = sorted(launch.take_launch_configs())
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        partial = torch.empty(4 * sms, n, device="cuda")
        dot = torch.empty(m * launch.cdiv(n, 4096), device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        args0 = (dy, x, w, rstd, dx, dw, partial, dot, count)
        runs, checks = {"product": _product_run}, {}
        for chunk, chunks, ring, warps, per_sm in CONFIGS:
            if per_sm * _shared_bytes(chunk, chunks, ring) > SHARED_PER_SM:
                continue
            run, group, groups = _group_run(m, n, chunk, chunks, ring, warps, per_sm, sms)
            if group * groups > per_sm * sms:
                continue
            name = f"{chunk}x{chunks} x {group}, RING {ring}, {per_sm}/SM, {warps} warps"
            try:
                dx.fill_(float("nan"))
                dw.fill_(float("nan"))
                run(args0)
                torch.cuda.synchronize()
                checks[name] = {"dx_ulps": _ulps(dx, ref_dx, dtype),
                                "dw_ulps": _ulps(dw, ref_dw, dtype),
                                "fallbacks": int((count != group).sum())}  # fmt: skip
                runs[name] = run
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
                print("   failed", name, checks[name], flush=True)
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {k: 3 * m * n * x.element_size() / (us * 1e3) for k, us in times.items()}
        print(f"{m}x{n} {str(dtype)[6:]} product {gbps['product']:.0f} {launched}", flush=True)
        for k in sorted(times, key=times.get):
            print(f"    {gbps[k]:5.0f} {gbps[k] / 42.5:5.1f}%  {times['product'] / times[k]:.3f}x"
                  f"  {k} {checks.get(k, '')}", flush=True)  # fmt: skip
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                         "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
