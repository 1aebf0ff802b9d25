"""Probe: cache hints in the single-tile forward and backward, each hint on its own.

forward_per_tile_variants_ab.py (fd874b3d0581) found v12's per-tile forward 4-12% faster at
every shape it ran with x loaded evict_first and y stored .cs ("streaming") together. Which of
the two does it, and does it carry over to the persistent tile loop and to the backward?

A store with .cs marks y's lines evict-first in L2. The next op of a model (a GEMM) reads y at
once; if it then misses L2, the forward's gain is paid by the consumer. So the forward is also
timed with a consumer behind it: a kernel that reads y back (per-row sums), forward and consumer
in one graph. x is read once by the forward; its next reader (the backward, or the residual
stream's next add) comes many ops later.

Variants (bf16, no residual), copies of the product's kernels at fd874b3d0581 with two flags:
- forward (rmsnorm_fwd_kernel, both grids: one program per tile, and persistent at 2 or 4
  programs per SM, 3 or 4 stages): none / x evict_first / y .cs / both;
- backward (rmsnorm_bwd_kernel, one program per SM walking its rows): none / x and dy
  evict_first / dx .cs / both.
Each variant at its best configuration over a small grid (BLOCK_M, warps, stages); each
configuration timed twice, the variants in one order then the other, the better time kept.
The "+ consumer" columns time the forward's best configuration of each variant, then the
consumer, per rotating set. JSON rewritten after each shape.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/streaming_hints_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import launch, tuning


@triton.jit
def fwd_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, N, eps, offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PERSISTENT: tl.constexpr,
    LOOP_STAGES: tl.constexpr, X_EVICT_FIRST: tl.constexpr, Y_CS: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if PERSISTENT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        tiles = (M - 1) // BLOCK_M + 1
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
            rows, x, rstd = _reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M, X_EVICT_FIRST)
            _store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, Y_CS)
    else:
        tile = tl.program_id(0).to(tl.int64)
        rows, x, rstd = _reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M, X_EVICT_FIRST)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        _store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, Y_CS)


@triton.jit
def _reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M: tl.constexpr,
            X_EVICT_FIRST: tl.constexpr):  # fmt: skip
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    ptrs = X + rows[:, None] * stride_x_row + cols[None, :]
    if X_EVICT_FIRST:
        x = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    return rows, x, rstd


@triton.jit
def _store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, Y_CS: tl.constexpr):
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
    ptrs = Y + rows[:, None] * stride_y_row + cols[None, :]
    if Y_CS:
        tl.store(ptrs, y, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptrs, y, mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def bwd_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, stride_x_row, stride_dy_row, stride_dx_row, M, N,
    rows_per_program, offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    LOADS_EVICT_FIRST: tl.constexpr, DX_CS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for block_start in tl.range(row_start, row_end, BLOCK_M, num_stages=LOOP_STAGES):
        rows = block_start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x_ptrs = X + rows[:, None] * stride_x_row + cols[None, :]
        dy_ptrs = DY + rows[:, None] * stride_dy_row + cols[None, :]
        if LOADS_EVICT_FIRST:
            x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
            dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptrs, mask=mask, other=0.0)
            dy = tl.load(dy_ptrs, mask=mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        x_hat = x * rstd[:, None]
        g = w[None, :] * dy
        mean_gx = tl.sum(g * x_hat, axis=1) / N
        dx = ((g - x_hat * mean_gx[:, None]) * rstd[:, None]).to(DX.dtype.element_ty)
        dx_ptrs = DX + rows[:, None] * stride_dx_row + cols[None, :]
        if DX_CS:
            tl.store(dx_ptrs, dx, mask=mask, cache_modifier=".cs")
        else:
            tl.store(dx_ptrs, dx, mask=mask)
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


@triton.jit
def consumer_kernel(Y, S, N, BLOCK_N: tl.constexpr):
    """One program per row: the row's sum, in fp32 (reads y once, as a next op would)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    y = tl.load(Y + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(S + row, tl.sum(y, axis=0))


FORWARD_SHAPES = [(512, 2048), (2048, 2048), (4096, 2048), (512, 4096), (2048, 4096),
                  (4096, 4096), (512, 8192), (1024, 8192), (2048, 8192), (4096, 8192),
                  (8192, 5120), (65536, 8192), (32768, 1024), (262144, 128)]  # fmt: skip
BACKWARD_SHAPES = [(512, 2048), (2048, 4096), (4096, 8192), (8192, 5120), (16384, 8192),
                   (32768, 1024), (65536, 512), (262144, 128)]  # fmt: skip
FORWARD_VARIANTS = {"none": (False, False), "x evict_first": (True, False),
                    "y .cs": (False, True), "both": (True, True)}  # fmt: skip
BACKWARD_VARIANTS = {"none": (False, False), "loads evict_first": (True, False),
                     "dx .cs": (False, True), "both": (True, True)}  # fmt: skip


def _block_ms(block_n: int, tiles: tuple) -> list[int]:
    return sorted({max(1, t // block_n) for t in tiles})


def _forward_configs(m: int, n: int) -> list[tuple]:
    """(BLOCK_M, warps, programs per SM (0: one per tile), stages)."""
    block_n = triton.next_power_of_2(n)
    per_tile = [(bm, w, 0, 1) for bm in _block_ms(block_n, (4096, 8192, 16384))
                for w in (4, 8, 16)]  # fmt: skip
    persistent = [(bm, w, p, st) for bm in _block_ms(block_n, (2048, 4096, 8192))
                  for w in (2, 4, 8) for p in (2, 4) for st in (3, 4)
                  if bm * block_n <= 8192 or w >= 4]  # fmt: skip
    return per_tile + [c for c in persistent if launch.cdiv(m, c[0]) > c[2] * 132]


def _backward_configs(n: int) -> list[tuple]:
    """(BLOCK_M, warps, stages)."""
    block_n = triton.next_power_of_2(n)
    return [(bm, w, st) for bm in _block_ms(block_n, (2048, 4096, 8192)) for w in (4, 8, 16)
            for st in (1, 3, 4) if bm * block_n // (w * 32) <= 32]  # fmt: skip


def _time_all(entries, arg_sets_of, stream) -> dict:
    """entries: name -> [(config, kernel, args, grid, meta)]; best of two interleaved passes."""
    for items in entries.values():
        launch._compile_in_parallel(items[0][1], items[0][2], [(g, me) for *_, g, me in items])
    stream.wait_stream(torch.cuda.current_stream())
    times = {}
    for rep in range(2):
        for name, items in list(entries.items())[:: 1 if rep == 0 else -1]:
            for config, kernel, args, grid, meta in items:

                def run(a, kernel=kernel, grid=grid, meta=meta):
                    kernel[grid](*a, **meta)

                try:
                    us = tuning._median_ms(run, arg_sets_of[id(args)], stream) * 1e3
                except Exception as error:  # one configuration failing does not end the probe
                    print(name, config, type(error).__name__, str(error)[:120], flush=True)
                    us = float("inf")
                torch.cuda.current_stream().wait_stream(stream)
                times[(name, config)] = min(times.get((name, config), float("inf")), us)
    return times


def _best(times: dict, names, configs) -> dict:
    best = {}
    for name in names:
        us, config = min((times[(name, c)], c) for c in configs)
        best[name] = (us, config)
    return best


def forward_shape(m, n, stream, l2):
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
    sums = torch.empty(m, device="cuda")
    args = (x, w, y, rstd, n, n, m, n, 1e-6, 0.0)
    arg_sets = tuning.rotating_arguments((*args, sums), l2)
    arg_sets_of = {id(args): [a[:-1] for a in arg_sets]}
    block_n = triton.next_power_of_2(n)
    configs = _forward_configs(m, n)
    entries = {}
    for name, (evict, cs) in FORWARD_VARIANTS.items():
        entries[name] = []
        for bm, warps, per_sm, st in configs:
            tiles = launch.cdiv(m, bm)
            grid = (tiles if per_sm == 0 else min(tiles, per_sm * 132),)
            meta = dict(BLOCK_M=bm, BLOCK_N=block_n, PERSISTENT=per_sm > 0, LOOP_STAGES=st,
                        X_EVICT_FIRST=evict, Y_CS=cs, num_warps=warps, num_stages=st)  # fmt: skip
            entries[name].append(((bm, warps, per_sm, st), fwd_kernel, args, grid, meta))
    best = _best(_time_all(entries, arg_sets_of, stream), FORWARD_VARIANTS, configs)
    # the forward's best configuration of each variant, then the consumer reading y
    with_consumer = {}
    consumer_warps = max(1, min(16, block_n // 512))
    for name, (_us, config) in best.items():
        meta = next(me for c, *_, me in entries[name] if c == config)
        grid = next(g for c, _, _, g, _ in entries[name] if c == config)

        def run(a, meta=meta, grid=grid):
            fwd_kernel[grid](*a[:-1], **meta)
            consumer_kernel[(m,)](a[2], a[-1], n, BLOCK_N=block_n, num_warps=consumer_warps)

        pair = min(tuning._median_ms(run, arg_sets, stream) for _ in range(2)) * 1e3
        torch.cuda.current_stream().wait_stream(stream)
        with_consumer[name] = pair

    def consumer_only(a):
        consumer_kernel[(m,)](a[2], a[-1], n, BLOCK_N=block_n, num_warps=consumer_warps)

    alone = tuning._median_ms(consumer_only, arg_sets, stream) * 1e3
    torch.cuda.current_stream().wait_stream(stream)
    return best, with_consumer, alone


def backward_shape(m, n, stream, l2):
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rstd = torch.rand(m, device="cuda") + 0.5
    dx = torch.empty_like(x)
    programs = min(m, 132)
    rows_per_program = launch.cdiv(m, programs)
    programs = launch.cdiv(m, rows_per_program)
    partial = torch.empty(programs, n, device="cuda")
    args = (x, w, dy, rstd, dx, partial, n, n, n, m, n, rows_per_program, 0.0)
    arg_sets_of = {id(args): tuning.rotating_arguments(args, l2)}
    block_n = triton.next_power_of_2(n)
    configs = _backward_configs(n)
    entries = {}
    for name, (evict, cs) in BACKWARD_VARIANTS.items():
        entries[name] = [
            ((bm, warps, st), bwd_kernel, args, (programs,),
             dict(BLOCK_M=bm, BLOCK_N=block_n, LOOP_STAGES=st, LOADS_EVICT_FIRST=evict,
                  DX_CS=cs, num_warps=warps, num_stages=st))
            for bm, warps, st in configs
        ]  # fmt: skip
    return _best(_time_all(entries, arg_sets_of, stream), BACKWARD_VARIANTS, configs)


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "forward": [], "backward": []}  # fmt: skip

    def dump():
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)

    print("forward: GB/s of each variant's best config (BLOCK_M, warps, per SM, stages), ratio"
          " to none; then us of forward + consumer (consumer alone)", flush=True)  # fmt: skip
    for m, n in FORWARD_SHAPES:
        best, pair, alone = forward_shape(m, n, stream, l2)
        base = best["none"][0]
        cells = "  ".join(f"{k}: {2 * m * n * 2 / 1e3 / us:5.0f} {c} {base / us:.3f}"
                          for k, (us, c) in best.items())  # fmt: skip
        pairs = "  ".join(f"{k} {v:7.2f}" for k, v in pair.items())
        print(f"{m:6d}x{n:5d}  {cells}\n              +consumer us: {pairs}  (alone {alone:.2f})",
              flush=True)  # fmt: skip
        result["forward"].append({"m": m, "n": n, "best": {k: {"us": us, "config": c}
                                  for k, (us, c) in best.items()},
                                  "with_consumer_us": pair, "consumer_alone_us": alone})  # fmt: skip
        dump()
    print("backward: GB/s (3MN) of each variant's best config (BLOCK_M, warps, stages)", flush=True)
    for m, n in BACKWARD_SHAPES:
        best = backward_shape(m, n, stream, l2)
        base = best["none"][0]
        cells = "  ".join(f"{k}: {3 * m * n * 2 / 1e3 / us:5.0f} {c} {base / us:.3f}"
                          for k, (us, c) in best.items())  # fmt: skip
        print(f"{m:6d}x{n:5d}  {cells}", flush=True)
        result["backward"].append({"m": m, "n": n, "best": {k: {"us": us, "config": c}
                                   for k, (us, c) in best.items()}})  # fmt: skip
        dump()


if __name__ == "__main__":
    main(sys.argv[1])
