"""Probe: what still separates our one-program-per-tile forward from the best peer at the small
seed shapes (v12 run, 7b5ddc8ee89b: 512x8192 0.94 of torch.compile, 2048x8192 0.955-0.97,
512x2048 and 1024x2048 fp16 0.97 of Liger, 8192x5120 0.945 of QuACK).

At these shapes every program is resident at once (one wave), so a kernel's time is about one
program's life: the x load's round trip, the reduction, then, in v12, w's load (an L2 hit, but
a dependent round trip after the reduction's barrier), the scaling and the stores. v9 had moved
w's load before the reduction, as fp32 + offset hoisted out of the tile loop, and lost up to 25%
at one program per tile (perf log, v11); it never tried w loaded in its storage dtype, next to
x, inside the program's straight-line body. Liger and torch.compile load w beside x.

Variants of the per-tile body (no tile loop, as v12), each at its best configuration (BLOCK_M
1 or 2 x num_warps 4, 8 or 16), bf16, no residual, in one process with the tuner's timer:
- v12: the product's kernel (rmsnorm_fwd_kernel, PERSISTENT False): the control.
- w after: this probe's copy of v12's body (w loaded after the reduction): must match v12.
- w beside x: w loaded in its storage dtype with x, before the reduction, converted after it.
  (Loading w before x in the source compiles to the same SASS on Triton 3.6: ptxas issues x's
  loads first either way, so that order is not a separate variant.)
- w after + streaming: v12's body with x loaded evict_first and y stored .cs (streaming).
- w beside x + streaming.
Each configuration is timed twice, the variants in one order then the other; the better time
counts. The JSON is rewritten after each shape.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/forward_per_tile_variants_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit
def per_tile_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, N, eps, offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, W_BESIDE_X: tl.constexpr,
    STREAMING: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    if STREAMING:
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
    else:
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    if W_BESIDE_X:
        w_raw = tl.load(W + cols, mask=col_mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    if not W_BESIDE_X:
        w_raw = tl.load(W + cols, mask=col_mask, other=0.0)
    w = w_raw.to(tl.float32) + offset
    y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
    y_ptrs = Y + rows[:, None] * stride_y_row + cols[None, :]
    if STREAMING:
        tl.store(y_ptrs, y, mask=mask, cache_modifier=".cs")
    else:
        tl.store(y_ptrs, y, mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


SHAPES = [(512, 2048), (1024, 2048), (2048, 2048), (512, 4096), (1024, 4096), (512, 8192),
          (1024, 8192), (2048, 8192), (4096, 8192), (8192, 5120)]  # fmt: skip
CONFIGS = [(block_m, warps) for block_m in (1, 2) for warps in (4, 8, 16)]
VARIANTS = {  # name -> (W_BESIDE_X, STREAMING); "v12" is the product's kernel
    "v12": None,
    "w after": (False, False),
    "w beside x": (True, False),
    "w after + streaming": (False, True),
    "w beside x + streaming": (True, True),
}


def _launches(m, n, x, w, y, rstd):
    """name -> [(config, kernel, args, grid, meta)] for every variant and configuration."""
    block_n = triton.next_power_of_2(n)
    product_args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
    probe_args = (x, w, y, rstd, n, n, m, n, 1e-6, 0.0)
    out = {}
    for name, variant in VARIANTS.items():
        out[name] = []
        for block_m, warps in CONFIGS:
            grid = (launch.cdiv(m, block_m),)
            common = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=1)
            if variant is None:
                meta = {**common, "HAS_RESIDUAL": False, "PERSISTENT": False, "LOOP_STAGES": 1}
                entry = (kernels.rmsnorm_fwd_kernel, product_args, grid, meta)
            else:
                meta = {**common, "W_BESIDE_X": variant[0], "STREAMING": variant[1]}
                entry = (per_tile_kernel, probe_args, grid, meta)
            out[name].append(((block_m, warps), *entry))
    return out


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("GB/s of each variant's best configuration (BLOCK_M, warps); ratio to v12", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        launches = _launches(m, n, x, w, y, rstd)
        arg_sets_of = {  # one rotating set per argument tuple, shared by its variants
            id(entries[0][2]): tuning.rotating_arguments(entries[0][2], l2)
            for entries in launches.values()
        }
        for entries in launches.values():  # compile each variant's configurations at once
            kernel, args = entries[0][1], entries[0][2]
            launch._compile_in_parallel(kernel, args, [(g, meta) for *_, g, meta in entries])
        stream.wait_stream(torch.cuda.current_stream())  # the inputs and their copies are made
        times = {}
        for rep in range(2):
            for name, entries in list(launches.items())[:: 1 if rep == 0 else -1]:  # both orders
                for config, kernel, args, grid, meta in entries:
                    arg_sets = arg_sets_of[id(args)]

                    def run(a, kernel=kernel, grid=grid, meta=meta):
                        kernel[grid](*a, **meta)

                    try:
                        us = tuning._median_ms(run, arg_sets, stream) * 1e3
                    except Exception as error:  # one variant failing does not end the probe
                        print(name, config, type(error).__name__, str(error)[:160], flush=True)
                        us = float("inf")
                    torch.cuda.current_stream().wait_stream(stream)
                    times[(name, config)] = min(times.get((name, config), float("inf")), us)
        best = {}
        for name in VARIANTS:
            us, config = min((times[(name, c)], c) for c in CONFIGS)
            best[name] = {"gbps": 2 * m * n * 2 / 1e3 / us, "us": us, "config": config}
        rows.append({"m": m, "n": n, "best": best,
                     "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()}})  # fmt: skip
        base = best["v12"]["gbps"] or float("nan")  # 0 when every v12 configuration failed
        cells = "  ".join(f"{name}: {b['gbps']:5.0f} {b['config']} {b['gbps'] / base:.3f}"
                          for name, b in best.items())  # fmt: skip
        print(f"{m:5d}x{n:5d}  {cells}", flush=True)
        with open(out_path, "w") as f:  # rewritten after each shape: a cut run keeps its rows
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
