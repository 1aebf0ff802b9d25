"""Probe: a two-pass chunked forward at N = 4096-32768, against the product's single tile.

Where torch.compile's forward leads ours at d11439644f21 (every preset, every peer): 512x8192
(0.91-0.95), 2048x8192 (0.96-0.97), 4096x8192 (0.97), 2048x32768 (0.90). Inductor's kernel at
N = 8192 is a looped reduction (`triton_red_...`, perf log "v7" inductor facts): one program
per row walks the row in chunks twice, sum of squares then y, the first pass loading x
evict_last and the second evict_first, so the second read comes from L2. Our looped kernel (the
same two passes, persistent, 4096- or 16384-wide chunks) competes only above N = 16384
(FORWARD_LOOPED_FROM_N).

This times, bf16, device-only (the tuner's timer), in one process:
- "single tile": the product's forward path for N <= 65536 (launch._forward_single_tile, tuned
  by the product's own tuner at the first call);
- "looped": a copy of rmsnorm_fwd_looped_kernel (no residual) at chunks of 1024 columns up to
  the row (one chunk: the row is loaded twice, the second time from L1/L2, and not held in
  registers across the reduction), one program per row or 8 or 16 per SM, 4-32 warps, 1 or 3
  stages. (The first run of this probe, at d11439644f21, offered 1024-4096-wide chunks at 8-32
  elements a thread only, which left out Inductor's own pick; its output is kept beside.)
- "looped + hints": the same with Inductor's cache hints (first pass x evict_last; second pass
  x evict_first, w evict_last).
Each configuration timed twice (variants in one order, then the other), the better kept.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/looped_forward_mid_n_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import launch, tuning


@triton.jit
def looped_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, N, eps, offset,
    BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, HINTS: tl.constexpr,
):  # fmt: skip
    chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):
        x_row = X + row * stride_x_row
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=LOOP_STAGES):
            cols = start + tl.arange(0, BLOCK_N)
            if HINTS:
                x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
            else:
                x = tl.load(x_row + cols, mask=cols < N, other=0.0)
            x = x.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps)
        for i in tl.range(0, chunks, num_stages=LOOP_STAGES):
            cols = (chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            if HINTS:
                x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
                w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            else:
                x = tl.load(x_row + cols, mask=mask, other=0.0)
                w = tl.load(W + cols, mask=mask, other=0.0)
            y = (x.to(tl.float32) * rstd * (w.to(tl.float32) + offset)).to(Y.dtype.element_ty)
            tl.store(Y + row * stride_y_row + cols, y, mask=mask)
        tl.store(RSTD + row, rstd)


SHAPES = [(512, 8192), (1024, 8192), (2048, 8192), (4096, 8192), (8192, 5120), (8192, 7168),
          (512, 4096), (4096, 4096), (4096, 16384), (2048, 32768)]  # fmt: skip


def _configs(m: int, n: int) -> list[tuple]:
    """(chunk, programs per SM (0: one program per row), warps, stages): chunks up to the row,
    2 to 32 elements a thread per chunk (Inductor's pick at 512x8192, 2048-wide chunks at 16
    warps, is 4), stagings under 160 KB; of the programs-per-SM choices that give every row a
    program, only one per row."""
    chunks = [c for c in (1024, 2048, 4096, 8192, 16384) if c <= triton.next_power_of_2(n)]
    per_sm = [0] + [p for p in (8, 16) if p * 132 < m]
    return [
        (c, p, w, s)
        for c in chunks
        for p in per_sm
        for w in (4, 8, 16, 32)
        if 2 <= c // (32 * w) <= 32
        for s in (1, 3)
        if (s - 1) * c * 4 <= 160 * 1024
    ]


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("GB/s (2MN) of each variant's best; config (chunk, per SM, warps, stages)", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        product_args = (x, w, y, rstd, x, x, (n, n, n, n), 1e-6, 0.0, False)
        launch._forward_single_tile(*product_args)  # the product's tuner picks its config
        tuned = launch.take_launch_configs().get("rmsnorm_fwd_kernel")
        probe_args = (x, w, y, rstd, n, n, m, n, 1e-6, 0.0)
        arg_sets = tuning.rotating_arguments(probe_args, l2)
        product_sets = [(a[0], a[1], a[2], a[3], a[0], a[0], *product_args[6:]) for a in arg_sets]
        configs = _configs(m, n)
        launches = []
        for hints in (False, True):
            for chunk, per_sm, warps, stages in configs:
                meta = dict(BLOCK_N=chunk, LOOP_STAGES=stages, HINTS=hints, num_warps=warps,
                            num_stages=stages)  # fmt: skip
                launches.append(((m if per_sm == 0 else min(m, per_sm * 132),), meta))
        launch._compile_in_parallel(looped_kernel, probe_args, launches)
        stream.wait_stream(torch.cuda.current_stream())
        times = {}
        for rep in range(2):
            order = [("single tile", None)] + [
                ("looped + hints" if me["HINTS"] else "looped", (g, me)) for g, me in launches
            ]
            for name, entry in order[:: 1 if rep == 0 else -1]:
                if entry is None:
                    sets = product_sets

                    def run(a):
                        launch._forward_single_tile(*a)

                    config = "tuned"
                else:
                    grid, meta = entry
                    sets = arg_sets

                    def run(a, grid=grid, meta=meta):
                        looped_kernel[grid](*a, **meta)

                    config = (meta["BLOCK_N"], grid[0], meta["num_warps"], meta["LOOP_STAGES"])
                try:
                    us = tuning._median_ms(run, sets, stream) * 1e3
                except Exception as error:  # one configuration failing does not end the probe
                    print(name, config, type(error).__name__, str(error)[:120], flush=True)
                    us = float("inf")
                torch.cuda.current_stream().wait_stream(stream)
                times[(name, config)] = min(times.get((name, config), float("inf")), us)
        best = {}
        for (name, config), us in times.items():
            if name not in best or us < best[name][0]:
                best[name] = (us, config)
        base = best["single tile"][0]
        cells = "  ".join(f"{k}: {2 * m * n * 2 / 1e3 / us:5.0f} {c} {base / us:.3f}"
                          for k, (us, c) in best.items())  # fmt: skip
        print(f"{m:5d}x{n:5d}  {cells}  [single tile: {tuned}]", flush=True)
        rows.append({"m": m, "n": n, "single_tile_config": tuned,
                     "best": {k: {"us": us, "config": c} for k, (us, c) in best.items()},
                     "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()}})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
