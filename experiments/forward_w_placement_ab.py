"""Probe: why v9's single-tile forward at one program per tile runs slower than v8's.

tuner_vs_harness.py (3aaf9221f6df) timed v8's per-tile picks 15-20% below v8's own preset
(512x8192: 2114 against 2584 GB/s) while both timers agreed in one process, so the kernel, not
the timer, changed. v9 made two changes to rmsnorm_fwd_kernel: the tile loop, and w loaded (and
kept in fp32 registers) before the loop instead of after the row's reduction. This times, in
one process with the tuner's timer, three kernels on each shape's per-tile and persistent
picks: v8's kernel (one program per tile only), today's, and today's with w loaded inside the
loop after the reduction (v8's order). bf16, no residual.

"today" is the kernel of the checkout it runs in: at 11199f13b75e (its results) v9's, with w
loaded before the tile loop; since v12 (7b5ddc8ee89b) the kernel takes PERSISTENT, and its
per-tile path is loop-free with w after the reduction.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/forward_w_placement_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import kernels, launch, tuning


@triton.jit
def v8_kernel(X, W, Y, RSTD, stride, M, N, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def w_in_loop_kernel(
    X, W, Y, RSTD, stride, M, N, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    tiles = (M - 1) // BLOCK_M + 1
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * stride + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)


#: (m, n) -> per-tile (BLOCK_M, warps) and persistent (BLOCK_M, per SM, stages, warps) picks
CASES = {
    (512, 8192): ((1, 16), (1, 1, 4, 8)),
    (1024, 2048): ((1, 8), (1, 4, 4, 4)),
    (512, 4096): ((1, 16), (1, 2, 4, 4)),
    (1024, 8192): ((2, 8), (1, 2, 4, 4)),
    (4096, 8192): ((1, 16), (1, 2, 4, 8)),
    (2048, 32768): ((1, 16), (1, 2, 4, 16)),
}


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = tuning.l2_bytes(0)
    rows = []
    for (m, n), ((tile_m, tile_warps), (pers_m, per_sm, stages, pers_warps)) in CASES.items():
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        block_n = triton.next_power_of_2(n)
        today = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        mine = (x, w, y, rstd, n, m, n, 1e-6)
        per_tile_grid = (triton.cdiv(m, tile_m),)
        pers_grid = (min(triton.cdiv(m, pers_m), per_sm * sms),)
        variants = {
            "v8 per tile": (v8_kernel, mine, per_tile_grid,
                            dict(BLOCK_M=tile_m, BLOCK_N=block_n, num_warps=tile_warps)),
            "today per tile": (kernels.rmsnorm_fwd_kernel, today, per_tile_grid,
                               dict(BLOCK_M=tile_m, BLOCK_N=block_n, HAS_RESIDUAL=False,
                                    PERSISTENT=False, LOOP_STAGES=1, num_warps=tile_warps,
                                    num_stages=1)),
            "w in loop per tile": (w_in_loop_kernel, mine, per_tile_grid,
                                   dict(BLOCK_M=tile_m, BLOCK_N=block_n, LOOP_STAGES=1,
                                        num_warps=tile_warps, num_stages=1)),
            "today persistent": (kernels.rmsnorm_fwd_kernel, today, pers_grid,
                                 dict(BLOCK_M=pers_m, BLOCK_N=block_n, HAS_RESIDUAL=False,
                                      PERSISTENT=True, LOOP_STAGES=stages, num_warps=pers_warps,
                                      num_stages=stages)),
            "w in loop persistent": (w_in_loop_kernel, mine, pers_grid,
                                     dict(BLOCK_M=pers_m, BLOCK_N=block_n, LOOP_STAGES=stages,
                                          num_warps=pers_warps, num_stages=stages)),
        }  # fmt: skip
        row = {"m": m, "n": n}
        for _rep in range(2):
            for name, (kernel, args, grid, meta) in variants.items():
                arg_sets = tuning.rotating_arguments(args, l2)

                def run(a, kernel=kernel, grid=grid, meta=meta):
                    kernel[grid](*a, **meta)

                try:
                    us = tuning._median_ms(run, arg_sets, stream) * 1e3
                    gbps = 2 * m * n * 2 / 1e3 / us
                except Exception as error:  # one variant failing does not end the probe
                    gbps = float("nan")
                    print(name, type(error).__name__, str(error)[:200], flush=True)
                torch.cuda.current_stream().wait_stream(stream)
                row.setdefault(name, []).append(gbps)
        rows.append(row)
        cells = "  ".join(f"{k}: {max(v):5.0f}" for k, v in row.items() if k not in ("m", "n"))
        print(f"{m:5d}x{n:5d}  {cells}", flush=True)
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
