"""Probe: does the one-iteration tile loop cost the single-tile forward at one program per tile?

forward_w_placement_ab.py (11199f13b75e) timed v8's kernel (no tile loop: the program's tile is
its program id) 2-8% above v11's per-tile path (the same body, w after the reduction, inside a
`tl.range` tile loop that runs once) at 4 of 6 shapes: 512x8192 2236 against 2056 GB/s,
512x4096 1960 / 1891, 1024x2048 2026 / 1960, 4096x8192 3601 / 3524. v12 gives one program per
tile a straight-line path (rmsnorm_fwd_kernel with PERSISTENT False).

This times, in one process with the tuner's timer (CUDA-graph replays over rotating copies),
v11's per-tile kernel (below, as it was at fbd0ce2af1a5) against today's per-tile path, at
the same configurations: BLOCK_M 1, 2 or 4 (more than 1 only in tiles of at most 16384
elements) x num_warps in {2, 4, 8, 16, 32}, bf16, no residual. Each variant's best configuration is what its tuner
would keep (approximately: the tuner's BLOCK_M and warps choices are pruned differently).
Each configuration is timed twice, interleaved, once in each order; the better time counts.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/forward_tile_loop_ab.py out.json

Its run at 7b5ddc8ee89b (2026-11-30-7b5ddc8ee89b-forward-tile-loop-ab.txt) stopped at its last
shape, 2048x32768, which its configuration filter then left without BLOCK_M 1, and so wrote no
JSON. Fixed since, not yet rerun: the filter, the JSON (now written after each shape), the
variants' order (v11 first in both repetitions then; now alternated) and the timing stream
(now ordered after the rotating copies).
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def v11_kernel(
    X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row,
    M, N, eps, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_kernel at fbd0ce2af1a5 with LOOP_STAGES 1 and no residual: the tile loop
    runs once per program, w is loaded after the reduction."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    tiles = (M - 1) // BLOCK_M + 1
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        mean_sq = tl.sum(x * x, axis=1) / N
        rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        y = x * rstd[:, None] * w[None, :]
        tl.store(
            Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask
        )
        tl.store(RSTD + rows, rstd, mask=row_mask)


SHAPES = [
    *((m, n) for n in (2048, 4096, 8192) for m in (512, 1024, 2048, 4096)),
    (8192, 3584), (8192, 4095), (8192, 5120), (8192, 7168), (32768, 1024), (4096, 16384),
    (2048, 32768),
]  # fmt: skip
WARPS = (2, 4, 8, 16, 32)


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print(f"{'shape':>11}  {'v11 best':>20}  {'v12 best':>20}  ratio", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())  # the inputs and their copies are made
        block_n = triton.next_power_of_2(n)
        # BLOCK_M 1 always (wide rows), more rows only up to 16384-element tiles; >= 2 per thread
        configs = [(bm, warps) for bm in (1, 2, 4) if bm == 1 or bm * block_n <= 16384
                   for warps in WARPS if bm * block_n >= 32 * warps * 2]  # fmt: skip
        times = {}
        for rep in range(2):
            for bm, warps in configs:
                common = dict(BLOCK_M=bm, BLOCK_N=block_n, HAS_RESIDUAL=False, LOOP_STAGES=1,
                              num_warps=warps, num_stages=1)  # fmt: skip
                variants = [
                    ("v11", v11_kernel, common),
                    ("v12", kernels.rmsnorm_fwd_kernel, {**common, "PERSISTENT": False}),
                ]
                for name, kernel, meta in variants[:: 1 if rep == 0 else -1]:  # both orders
                    grid = (launch.cdiv(m, bm),)

                    def run(a, kernel=kernel, grid=grid, meta=meta):
                        kernel[grid](*a, **meta)

                    us = tuning._median_ms(run, arg_sets, stream) * 1e3
                    torch.cuda.current_stream().wait_stream(stream)
                    key = (name, bm, warps)
                    times[key] = min(times.get(key, float("inf")), us)
        gbps = {key: 2 * m * n * 2 / 1e3 / us for key, us in times.items()}
        best = {  # variant -> (GB/s, (BLOCK_M, warps)) of its fastest configuration
            name: max((g, (bm, warps)) for (v, bm, warps), g in gbps.items() if v == name)
            for name in ("v11", "v12")
        }
        row = {
            "m": m,
            "n": n,
            "best": {
                name: {"gbps": g, "block_m": cfg[0], "warps": cfg[1]}
                for name, (g, cfg) in best.items()
            },  # fmt: skip
            "configs": [
                {"variant": v, "block_m": bm, "warps": wp, "us": times[(v, bm, wp)]}
                for (v, bm, wp) in times
            ],  # fmt: skip
        }
        rows.append(row)
        (g11, c11), (g12, c12) = best["v11"], best["v12"]
        print(f"{m:5d}x{n:5d}  {g11:6.0f} (BLOCK_M {c11[0]}, {c11[1]:2d}w)  "
              f"{g12:6.0f} (BLOCK_M {c12[0]}, {c12[1]:2d}w)  {g12 / g11:.3f}", flush=True)  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape: a cut run keeps its rows
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
