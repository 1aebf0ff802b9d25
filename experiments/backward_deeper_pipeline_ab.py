"""Probe: a deeper software pipeline in the single-tile backward's row loop.

The backward's main kernel runs one program per SM (the cap that keeps the dw partials within
SMs x N fp32, target 6), so the bytes in flight per SM come from its row loop's pipelining:
LOOP_STAGES = S keeps S - 2 later steps' loads in flight (cp.async into shared memory). The tuner
tries S in {1, 3, 4} (launch.NUM_STAGES_CHOICES). The narrow backward's main kernel alone runs at
~85% of the copy at its best configuration (`probes/2026-11-30-fb7768dafbc6-backward-config-sweep.txt`),
the seed shapes' backward at 65-83% with the reduction.

Variants of the main kernel (rmsnorm_bwd_kernel alone, without the dw reduction, which is the
same for all), bf16, device-only (the tuner's timer, best of two interleaved passes):
- "product": the product's tuned configuration;
- "S stages": the same BLOCK_M and warps with LOOP_STAGES = num_stages = S, S in {5, 6, 8};
- "2x rows, S stages": BLOCK_M doubled, S in {3, 4, 6}.
Configurations whose staging ((S - 1) x BLOCK_M rows of x and dy) passes launch's
PIPELINE_SHARED_BYTES are skipped. dx and the partials are checked bit for bit against the
product's configuration's where BLOCK_M is the same (the pipeline depth changes no arithmetic).

Prediction (Little's law: ~32 KB in flight per SM for HBM3e at ~1 µs): at N = 128-1024, where a
step is 8-16 KB and S = 4 keeps 2 steps ahead, 6-8 stages +3-8%; at N >= 4096 (a step of one or
two rows is 16-64 KB) within noise.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/backward_deeper_pipeline_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [(262144, 128), (65536, 512), (32768, 1024), (8192, 3584), (4096, 4096), (4096, 8192),
          (1024, 4096)]  # fmt: skip


def _main_run(meta, programs, rows_per_program):
    def run(a):
        dy, x, w, rstd, dx, partial = a
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        kernels.rmsnorm_bwd_kernel[(programs,)](*args, **meta)

    return run


def _staging_bytes(block_m, block_n, stages):
    return max(0, stages - 1) * block_m * block_n * 2 * 2  # x and dy, bf16


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("µs of the main kernel (GB/s of 3MN); the product's configuration first", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        launch.rmsnorm_backward(dy, x, w, rstd)  # the product's tuner picks its configuration
        config = launch.take_launch_configs()["rmsnorm_bwd_kernel"]
        programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
        block_n = triton.next_power_of_2(n)
        held = launch.backward_holds_storage_form(block_n, x.dtype, dy.dtype)
        base = {"BLOCK_N": block_n, "HAS_DH_OUT": False, "HOLD_STORAGE_FORM": held}
        variants = {"product": {**base, **config}}
        for stages in (5, 6, 8):
            variants[f"{stages} stages"] = {**base, **config, "LOOP_STAGES": stages,
                                            "num_stages": stages}  # fmt: skip
        for stages in (3, 4, 6):
            variants[f"2x rows, {stages} stages"] = {
                **base, **config, "BLOCK_M": 2 * config["BLOCK_M"], "LOOP_STAGES": stages,
                "num_stages": stages,
            }  # fmt: skip
        variants = {
            name: meta for name, meta in variants.items()
            if _staging_bytes(meta["BLOCK_M"], block_n, meta["LOOP_STAGES"])
            <= launch.PIPELINE_SHARED_BYTES
        }  # fmt: skip
        dx, partial = torch.empty_like(x), torch.empty(programs, n, device="cuda")
        outputs, checks = {}, {}
        for name, meta in variants.items():
            try:
                dx.fill_(float("nan"))
                partial.fill_(float("nan"))
                _main_run(meta, programs, rows_per_program)((dy, x, w, rstd, dx, partial))
                torch.cuda.synchronize()
                outputs[name] = (dx.clone(), partial.clone())
            except Exception as error:  # an unrunnable configuration does not end the probe
                checks[name] = f"{type(error).__name__}: {str(error)[:120]}"
        for name, meta in variants.items():
            if name in outputs and name != "product" and meta["BLOCK_M"] == config["BLOCK_M"]:
                pairs = zip(outputs[name], outputs["product"], strict=True)
                same = all(torch.equal(a, b) for a, b in pairs)
                checks[name] = "bitwise" if same else "DIFFERS"
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, partial), l2)
        stream.wait_stream(torch.cuda.current_stream())
        runs = {
            name: _main_run(meta, programs, rows_per_program)
            for name, meta in variants.items()
            if name in outputs
        }
        times = time_runs(runs, arg_sets, stream)
        gb = 3 * m * n * 2 / 1e3
        best = min(times, key=times.get)
        cells = "  ".join(f"{name}: {us:7.2f} ({gb / us:4.0f})" for name, us in times.items())
        print(f"{m:6d}x{n:5d}  {cells}  best: {best} {times['product'] / times[best]:.3f}x  "
              f"{checks}  [{config}]", flush=True)  # fmt: skip
        rows_out.append({"m": m, "n": n, "config": config, "us": times, "checks": checks})
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
