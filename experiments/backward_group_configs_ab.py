"""Probe: the grouped backward's configuration under v22-v26's exchange (one tagged word a
slice), where its fixed cost weighs most: 512-1024 x 65536 (63.6-75% of the copy in the
seventeenth session's runs), 256-512 x 131072, 256x262144, and 2048x32768 (v27).

The product's configuration when this ran (762450216ee4; since v28 launch.HELD_GROUP_BACKWARDS[1],
and "product" below runs launch.HELD_GROUP_BACKWARDS[0]): 16384-column slices (2 chunks of
8192), a ring of 5 chunk slots of x and dy, 8 warps, one program an SM. It was chosen under v20's exchange
(`2026-11-30-1df86ba56326-backward-held-group-slices-ab.txt`: 2 programs an SM with 8192-column
slices ran 0.95-1.04x, then held back by two dependent round trips to L2 a row, which v22 took
out). More programs an SM keep more rows in flight (the grouped forward's lesson, v25: more
groups in flight win), at the cost of more partial rows of dw to reduce and more words to
exchange.

Variants: the product's launch (launch._backward_held_group), and the same kernel launched as
that launcher launches it at (CHUNK, CHUNKS, RING, WARPS, programs an SM) below; each with the
exchange's zeroing and the dw reduction, whole backward, device-only, the tuner's timer
(ab_timing.time_runs, best of two interleaved passes). dx and dw against the product's (ulps at
the product's magnitude).

Prediction: at 512x65536 (33 groups of 4, 15.5 rows each) 2 programs an SM with 8192-column
slices (66 groups of 8) 1.05-1.10x; at 256x262144 and 512x131072 within 3%.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/backward_group_configs_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

SHAPES = [
    (512, 65536, torch.bfloat16),
    (1024, 65536, torch.bfloat16),
    (256, 131072, torch.bfloat16),
    (512, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (2048, 32768, torch.bfloat16),
    (512, 65536, torch.float16),
]
SHARED_PER_SM = 233472
RESERVED = 1024
# (chunk, chunks, ring, warps, programs an SM)
CONFIGS = [
    (8192, 2, 5, 8, 1),  # the product's
    (8192, 1, 2, 8, 2),
    (4096, 2, 5, 8, 2),
    (4096, 2, 4, 4, 2),
    (4096, 1, 2, 4, 4),
    (4096, 1, 3, 4, 3),
    (8192, 2, 2, 8, 2),
]


def _shared_bytes(chunk, chunks, ring):
    return ring * chunk * 4 + chunks * chunk * 2 + launch.HELD_ROW_SCRATCH_BYTES


def _group_run(m, n, chunk, chunks, ring, warps, per_sm):
    """The product's launcher (launch._backward_held_group) at this configuration."""
    device = torch.device("cuda", 0)
    group = launch.cdiv(n, chunk * chunks)
    groups, rows_per_group = launch._row_groups(m, group, device, per_sm)
    meta = {
        "N": n,
        "GROUP": group,
        "GROUP_PADDED": launch.held_group_words(group, warps),
        "CHUNK": chunk,
        "CHUNKS": chunks,
        "RING": ring,
        "WARPS": warps,
        "HAS_DH_OUT": False,
        "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT,
        "num_warps": warps,
        "launch_cooperative_grid": True,
        **launch._register_cap(per_sm, warps),
    }  # fmt: skip  (since v28; uncapped before)

    def run(a):
        dy, x, w, rstd, dx, dw = a
        partial = torch.empty((groups, n), dtype=torch.float32, device=x.device)
        sums = torch.zeros((m * group,), dtype=torch.int64, device=x.device)
        gluon_kernels.rmsnorm_bwd_held_group_kernel[(groups * group,)](
            x, w, dy, rstd, dx, partial, dx, sums, x.stride(0), dy.stride(0), dx.stride(0),
            dx.stride(0), m, rows_per_group, 0.0, 0, **meta,
        )  # fmt: skip
        launch._reduce_partials(partial, dw)

    return run, group, groups


def _product_run(a):
    dy, x, w, rstd, dx, dw = a
    config = launch.HELD_GROUP_BACKWARDS[0]  # (since v28; 762450216ee4 had only the other)
    launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dy, False, dw, config=config)


def _ulps(a, ref, dtype):
    spacing = torch.finfo(dtype).eps * ref.float().abs().clamp_min(torch.finfo(dtype).tiny)
    return float(((a.float() - ref.float()).abs() / spacing).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    print("whole backward: µs, GB/s of 3MN, % of 4250, x the product's configuration", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        args0 = (dy, x, w, rstd, dx, dw)
        _product_run(args0)
        ref_dx, ref_dw = dx.clone(), dw.clone()
        runs, checks = {"product": _product_run}, {}
        for chunk, chunks, ring, warps, per_sm in CONFIGS:
            if per_sm * (_shared_bytes(chunk, chunks, ring) + RESERVED) > SHARED_PER_SM:
                continue
            run, group, groups = _group_run(m, n, chunk, chunks, ring, warps, per_sm)
            if group * groups > per_sm * sms:
                continue
            name = f"{chunk}x{chunks} x {group}, RING {ring}, {per_sm}/SM, {warps} warps"
            try:
                dx.fill_(float("nan"))
                dw.fill_(float("nan"))
                run(args0)
                torch.cuda.synchronize()
                checks[name] = {"dx_ulps": _ulps(dx, ref_dx, dtype),
                                "dw_ulps": _ulps(dw, ref_dw, dtype), "groups": groups}  # fmt: skip
                runs[name] = run
            except Exception as error:  # an unrunnable configuration does not end the probe
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
                print("   failed", name, checks[name], flush=True)
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {k: 3 * m * n * x.element_size() / (us * 1e3) for k, us in times.items()}
        print(f"{m}x{n} {str(dtype)[6:]}", flush=True)
        for k in sorted(times, key=times.get):
            print(f"    {times[k]:7.1f} {gbps[k]:5.0f} {gbps[k] / 42.5:5.1f}%"
                  f"  {times['product'] / times[k]:.3f}x  {k} {checks.get(k, '')}",
                  flush=True)  # fmt: skip
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                         "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip
        del x, dy, dx, dw, arg_sets, args0
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
