"""Probe: is torch.compile's forward lead at N = 8192 its static shapes?

At d11439644f21 torch.compile's forward led ours at 512x8192 (0.91-0.95), 2048x8192 and
4096x8192 (0.96-0.97). Its kernel (inductor_forward_configs.py, same commit) is a two-pass
chunked reduction, one program per row, 16 warps, 2048- or 8192-wide chunks, x evict_last then
evict_first. Our copy of that structure with runtime shapes (looped_forward_mid_n_ab.py) stayed
below our single tile. One difference remains: Inductor compiles for one shape (dynamic=False),
with M and N as constants, so its masks fold away and its row offsets are constant multiples.

Per-tile forward variants, bf16, no residual, in one process with the tuner's timer:
- "runtime": v12's one-program-per-tile body (as rmsnorm_fwd_kernel, PERSISTENT False), M and N
  runtime arguments;
- "N constexpr": the same body with N (and the row stride, = N) compile-time constants (the
  column mask folds away where N is a power of two; the row mask cannot fold, with or without
  a constant M, since the compiler does not know the grid);
- "N constexpr, strides runtime": N a constant, the row strides runtime arguments (specialized
  on divisibility by 16), as the product would have them;
- "inductor": Inductor's generated kernel at 512x8192 as it printed it, with M and N constexpr,
  at its chunk widths (2048, 8192) and 8 or 16 warps.
Its first run at d11439644f21 (`...-static-shape-forward-ab-run1.*`) had no "strides runtime"
variant; the second (`...-static-shape-forward-ab.*`) has all four.
Each at its best configuration (BLOCK_M 1 or 2 x 4, 8 or 16 warps; "inductor": chunk x warps);
each configuration timed twice, the variants in one order then the other, the better kept.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/static_shape_forward_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl

from impls.triton_rmsnorm import launch, tuning


@triton.jit
def runtime_kernel(X, W, Y, RSTD, stride_x_row, stride_y_row, M, N, eps, offset,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32) + offset
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rows < M)


@triton.jit
def static_kernel(X, W, Y, RSTD, M, eps, offset, N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """runtime_kernel with N (and the row strides, N) a compile-time constant."""
    cols = tl.arange(0, BLOCK_N)
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32) + offset
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rows < M)


@triton.jit
def static_n_kernel(X, W, Y, RSTD, stride_x_row, stride_y_row, M, eps, offset,
                    N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """runtime_kernel with N a compile-time constant, the row strides still runtime
    arguments (as the product's, whose rows may be strided)."""
    cols = tl.arange(0, BLOCK_N)
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32) + offset
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rows < M)


@triton.jit
def inductor_kernel(in_ptr0, in_ptr1, out_ptr1, xnumel: tl.constexpr, r0_numel: tl.constexpr,
                    XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):  # fmt: skip
    """Inductor's triton_red_fused_add_mean_mul_pow_rsqrt_0 (torch 2.11, 512x8192 bf16), its
    constant shapes made constexpr parameters, its temporaries renamed; eps 1e-6."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    acc = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        x = tl.load(in_ptr0 + (r0_index + r0_numel * xindex), r0_mask & xmask,
                    eviction_policy="evict_last", other=0.0).to(tl.float32)  # fmt: skip
        acc = tl.where(r0_mask & xmask, acc + x * x, acc)
    total = tl.sum(acc, 1)[:, None]
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        w = tl.load(in_ptr1 + r0_index, r0_mask, eviction_policy="evict_last", other=0.0)
        x = tl.load(in_ptr0 + (r0_index + r0_numel * xindex), r0_mask & xmask,
                    eviction_policy="evict_first", other=0.0).to(tl.float32)  # fmt: skip
        rstd = tl.math.rsqrt(total / r0_numel + 1e-06)
        tl.store(out_ptr1 + (r0_index + r0_numel * xindex), w.to(tl.float32) * (x * rstd),
                 r0_mask & xmask)  # fmt: skip


SHAPES = [(512, 8192), (1024, 8192), (2048, 8192), (4096, 8192), (512, 4096), (1024, 2048),
          (8192, 5120)]  # fmt: skip
TILE_CONFIGS = [(bm, w) for bm in (1, 2) for w in (4, 8, 16)]


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows = []
    print("GB/s (2MN) of each variant's best configuration; ratio to runtime", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        block_n = triton.next_power_of_2(n)
        sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        entries = []  # (variant, config, kernel, grid, args of a set, meta)
        for bm, warps in TILE_CONFIGS:
            grid = (launch.cdiv(m, bm),)
            common = dict(BLOCK_M=bm, BLOCK_N=block_n, num_warps=warps, num_stages=1)
            entries.append(("runtime", (bm, warps), runtime_kernel, grid,
                            lambda a, m=m, n=n: (*a, n, n, m, n, 1e-6, 0.0), common))  # fmt: skip
            entries.append(("N constexpr, strides runtime", (bm, warps), static_n_kernel, grid,
                            lambda a, m=m, n=n: (*a, n, n, m, 1e-6, 0.0),
                            {**common, "N": n}))  # fmt: skip
            entries.append(("N constexpr", (bm, warps), static_kernel, grid,
                            lambda a, m=m: (*a, m, 1e-6, 0.0), {**common, "N": n}))  # fmt: skip
        for chunk in (2048, 8192):
            if chunk > block_n:
                continue
            for warps in (8, 16):
                entries.append(("inductor", (chunk, warps), inductor_kernel, (m,),
                                lambda a: (a[0], a[1], a[2]),
                                dict(xnumel=m, r0_numel=n, XBLOCK=1, R0_BLOCK=chunk,
                                     num_warps=warps, num_stages=1)))  # fmt: skip
        stream.wait_stream(torch.cuda.current_stream())
        times = {}
        for rep in range(2):
            for variant, config, kernel, grid, make_args, meta in entries[:: 1 if rep == 0 else -1]:

                def run(a, kernel=kernel, grid=grid, make_args=make_args, meta=meta):
                    kernel[grid](*make_args(a), **meta)

                try:
                    us = tuning._median_ms(run, sets, stream) * 1e3
                except Exception as error:  # one configuration failing does not end the probe
                    print(variant, config, type(error).__name__, str(error)[:120], flush=True)
                    us = float("inf")
                torch.cuda.current_stream().wait_stream(stream)
                times[(variant, config)] = min(times.get((variant, config), float("inf")), us)
        best = {}
        for (variant, config), us in times.items():
            if variant not in best or us < best[variant][0]:
                best[variant] = (us, config)
        base = best["runtime"][0]
        cells = "  ".join(f"{k}: {2 * m * n * 2 / 1e3 / us:5.0f} {c} {base / us:.3f}"
                          for k, (us, c) in best.items())  # fmt: skip
        print(f"{m:5d}x{n:5d}  {cells}", flush=True)
        rows.append({"m": m, "n": n,
                     "best": {k: {"us": us, "config": c} for k, (us, c) in best.items()},
                     "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()}})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
