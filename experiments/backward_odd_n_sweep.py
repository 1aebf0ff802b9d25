"""Probe: the backward at odd N (8192x4095 bf16 ran at 48% of the copy and 0.96 of
torch.compile, the one backward case behind a peer; run 3). Rows of odd width are not 16-byte
aligned, so the kernel loads 2-byte scalars, which Triton's pipeliner cannot stage through
cp.async (4-byte minimum): with one program per SM, a step's loads are the only bytes in flight.
Tells whether more rows per step (BLOCK_M up to 8, the tuner tries 1 and 2) or more programs per
SM recover it, against the aligned 8192x4096 beside it. Same timing as backward_config_sweep.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/backward_odd_n_sweep.py out.json
"""

import json
import sys
import time

import torch
from backward_config_sweep import device_us, fixed_config, product
from triton.runtime.errors import OutOfResources

from impls.triton_rmsnorm import launch

SHAPES = [(8192, 4095, torch.bfloat16), (8192, 4095, torch.float16), (8192, 4096, torch.bfloat16)]


def main(out: str) -> None:
    stream = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, start = [], time.time()
    for m, n, dtype in SHAPES:
        kb = 3 * m * n * 2 / 1e3
        us = device_us(product, m, n, dtype, stream)
        tuned = launch.take_launch_configs().get("rmsnorm_bwd_kernel")
        rows.append({"m": m, "n": n, "dtype": str(dtype), "config": "tuned", "tuned": tuned,
                     "us": us})  # fmt: skip
        print(f"{m}x{n} {dtype} product (tuned {tuned}) {kb / us:5.0f} GB/s", flush=True)
        for per_sm in (1, 2):
            results = []
            for block_m in (1, 2, 4, 8):
                for warps in (4, 8, 16, 32):
                    if not 4 <= block_m * launch.block_size(n) / (32 * warps) <= 64:
                        continue
                    for stages in launch.NUM_STAGES_CHOICES:
                        config = {"BLOCK_M": block_m, "num_warps": warps, "num_stages": stages,
                                  "programs_per_sm": per_sm}  # fmt: skip
                        cfg = fixed_config(block_m, warps, stages, per_sm * sms)
                        try:
                            t = device_us(cfg, m, n, dtype, stream)
                        except OutOfResources as error:
                            rows.append({"m": m, "n": n, "config": config, "skipped": str(error)})
                            continue
                        rows.append({"m": m, "n": n, "dtype": str(dtype), "us": t,
                                     "config": config})  # fmt: skip
                        results.append((t, block_m, warps, stages))
            for block_m in (1, 2, 4, 8):
                mine = [r for r in results if r[1] == block_m]
                if mine:
                    t, _, warps, stages = min(mine)
                    print(f"  {per_sm}/SM BLOCK_M={block_m} best warps={warps} stages={stages} "
                          f"{kb / t:5.0f} GB/s", flush=True)  # fmt: skip
        print(f"  ({time.time() - start:.0f} s)", flush=True)
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
