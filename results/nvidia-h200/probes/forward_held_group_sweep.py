"""Probe: where the grouped forward's time goes, and its configuration space widened.

The first run of `forward_held_group_ab.py` (b0c0097d6209) found the group at 1.135-1.157x the
product at 256x262144 and 1.148x at 64x1048576 (70-72% of the copy), its best at the smallest
ring (2 rows of 16384-column slices) and 2 programs an SM; slower than v16's held row at
512x131072 (0.91x) and the single tile at 1024x65536 (0.82x). Here:
- slices of 8192 columns (CHUNK 8192 x 1 or 4096 x 2) at up to 4 programs an SM, and 4 warps;
- EXCHANGE off (a diagnostic, not a norm: each program scales its own slice's sum, publishing
  but never waiting), to separate the wait on partners from the streaming itself;
- 1024x262144 beside 256x262144: 4x the rows a group, to see the fill and drain's share.

Prediction: if the exchange's waits are the loss, EXCHANGE off runs 10-20% faster; if it is
the fill and drain, 1024 rows runs at 80%+ of the copy where 256 rows runs at 70%.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:results/nvidia-h200/probes python results/nvidia-h200/probes/forward_held_group_sweep.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from forward_held_group_ab import _group_run

from impls.triton_rmsnorm import launch, tuning

SHAPES = [
    (256, 262144, torch.bfloat16),
    (1024, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
    (512, 131072, torch.bfloat16),
]
SHARED_BYTES = 227 * 1024
# (chunk, chunks, ring, warps, per_sm, exchange)
CONFIGS = [
    (8192, 2, 4, 8, 2, True),  # the first run's best
    (8192, 2, 4, 8, 2, False),
    (8192, 2, 4, 4, 2, True),
    (8192, 2, 5, 8, 2, True),
    (8192, 1, 2, 8, 2, True),
    (8192, 1, 2, 8, 3, True),
    (8192, 1, 2, 8, 4, True),
    (8192, 1, 2, 4, 4, True),
    (8192, 1, 3, 8, 3, True),
    (8192, 1, 2, 8, 4, False),
    (4096, 2, 4, 8, 4, True),
    (4096, 2, 5, 8, 3, True),
    (4096, 4, 8, 8, 2, True),
    (4096, 4, 8, 4, 2, True),
]


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (2MN) and % of 4250 GB/s", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)
        launched = sorted(launch.take_launch_configs())
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        dot = torch.empty(m * launch.cdiv(n, 4096), device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        for chunk, chunks, ring, warps, per_sm, exchange in CONFIGS:
            if per_sm * (ring + chunks) * chunk * 2 + per_sm * 4096 > SHARED_BYTES:
                continue
            run, group, groups = _group_run(m, n, chunks, ring, warps, per_sm, sms, chunk,
                                            exchange)  # fmt: skip
            if groups * group > per_sm * sms:
                continue
            name = (f"{chunk}x{chunks} x {group}, RING {ring}, {per_sm}/SM, {warps} warps"
                    + ("" if exchange else ", NO EXCHANGE"))  # fmt: skip
            try:
                y.fill_(float("nan"))
                run((x, w, y, rstd, dot, count))
                torch.cuda.synchronize()
                checks[name] = {
                    "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "fallback_rows": int((count != group).sum()),
                }
                runs[name] = run
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        arg_sets = tuning.rotating_arguments((x, w, y, rstd, dot, count), l2)
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
