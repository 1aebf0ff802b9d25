"""Probe (issue 30, items 2 and 7): a row reduction whose order no launch configuration changes.

Why. A row's y keeps its bits whatever M only because every M class of a width runs one
reduction tree (the tuner's batch-invariance rule, batch_invariance.py): tl.sum adds in the
order its layout gives (warps, rows a tile), so configurations differ in their bits. At 2048
rows the tree that rule leaves runs 2-8% behind another (forward_mid_m_gap at c1c7ff81a6aa:
2048x3584 fp16 7.93 us against another tree's 7.33, cuDNN's 7.50), and the backward's dx
changes bits with M wherever its configuration does.

The change probed: the sum of squares as a pairwise tree over adjacent columns, written as
log2(BLOCK_N) sums over an axis of two elements (each one addition, whatever the lowering: in a
thread, across lanes or through shared memory), compiled with fp fusion off (an addition fused
with a multiply rounds once; in-thread and cross-thread pairs would fuse differently). Every
configuration then adds the same numbers in the same order: one set of bits for every M.

Prediction: the bits of every configuration identical (canonical rows: 1 distinct y per shape,
against 2-5 trees of the product's kernel); the canonical kernel's best configuration within
1-2% of the product kernel's best of any tree (the extra barriers of the tree's levels, 3-7 a
tile at 4-16 warps in Triton 3.9's PTX for sm_90, hidden behind the loads), so ahead of the
table's tree where that one trails (2048 rows). If so, the single-tile forward (and the same
reduction in the backward) can take it, and the tuner can give each M class its fastest
configuration.

Per shape, for every configuration of the tuner's space for the plain single-tile forward
(launch._candidates; persistent grids included), three launches with the same arguments and
launch keywords (PDL as the product launches it): the product's kernel; the product's kernel
with fp fusion off; the canonical copy (rmsnorm_fwd_canonical_kernel below: the product's
kernel with the reduction replaced, residual, two-level rows and the held storage form left
out). Device µs by the tuner's timer (interleaved passes), the distinct y bit patterns of each
variant across the configurations, and each variant's largest rstd error against fp64.

    PYTHONPATH=.:experiments python experiments/canonical_sum_ab.py out.json [fp16|bf16] [MxN,...]

(the shapes default to SHAPES for the forward and BACKWARD_SHAPES for the backward; ~2-3 min)
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import SINGLE_TILE_FORWARD, time_runs

from impls.triton_rmsnorm import configs, kernel_launch, kernels, launch, tuning
from impls.triton_rmsnorm.backward_launch import (
    _single_tile_backward_args,
    _single_tile_backward_grid,
)
from impls.triton_rmsnorm.forward_launch import (
    _single_tile_forward_args,
    plain_forward_launch_switches,
)

EPS = 1e-6
SHAPES = [(2048, 3584), (2048, 4096), (2048, 2560), (16384, 3584), (256, 4096), (1, 16384)]
BACKWARD_SHAPES = [(2048, 3584), (2048, 4096), (16384, 4096), (256, 4096)]
#: Levels of the pairwise tree at most (BLOCK_N up to 2**20).
MAX_LEVELS = tl.constexpr(20)


@triton.jit
def _pairwise_row_sums(v, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each row's sum of v [BLOCK_M, BLOCK_N] as a pairwise tree over adjacent columns: level
    i adds columns 2j and 2j + 1 of the previous level, one addition each."""
    for i in tl.static_range(MAX_LEVELS):
        if (BLOCK_N >> (i + 1)) > 0:
            v = tl.sum(tl.reshape(v, [BLOCK_M, BLOCK_N >> (i + 1), 2]), axis=2)
    return tl.reshape(v, [BLOCK_M])


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_fwd_canonical_kernel(
    X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row, M,
    N: tl.constexpr, eps, offset, ROWS_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, PERSISTENT: tl.constexpr, LOOP_STAGES: tl.constexpr,
    ROWS_CONTIGUOUS: tl.constexpr = False, HOLD_STORAGE_FORM: tl.constexpr = False,
    W_EARLY: tl.constexpr = False, HEADS: tl.constexpr = 1, STRIDE_X_OUTER: tl.constexpr = 0,
    STORE_RSTD: tl.constexpr = True, WAIT_FOR_PRIOR_GRID: tl.constexpr = False,
):  # fmt: skip
    """kernels.rmsnorm_fwd_kernel (its parameters, so one launch's keywords serve both) with
    the row's sum of squares as _pairwise_row_sums; plain rows only."""
    tl.static_assert(not HAS_RESIDUAL and not HOLD_STORAGE_FORM and HEADS == 1)
    if WAIT_FOR_PRIOR_GRID:
        tl.extra.cuda.gdc_wait()
    if ROWS_CONTIGUOUS:
        stride_x_row = N
        stride_y_row = N
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if PERSISTENT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        tiles = (M - 1) // BLOCK_M + 1
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
            rows, x, rstd = _canonical_tile_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M,
                                                   BLOCK_N)  # fmt: skip
            _tile_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, STORE_RSTD)
    else:
        tile = tl.program_id(0).to(tl.int64)
        if W_EARLY:
            w_early = tl.load(W + cols, mask=col_mask, other=0.0)
        rows, x, rstd = _canonical_tile_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M,
                                               BLOCK_N)  # fmt: skip
        if W_EARLY:
            w = w_early.to(tl.float32) + offset
        else:
            w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        _tile_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, STORE_RSTD)


@triton.jit
def _canonical_tile_reduce(tile, X, stride_x_row, M, N, eps, cols, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr):  # fmt: skip
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean_sq = _pairwise_row_sums(x * x, BLOCK_M, BLOCK_N) / N
    rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
    return rows, x, rstd


@triton.jit
def _tile_store(Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, STORE_RSTD: tl.constexpr):
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_bwd_canonical_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT, stride_x_row, stride_dy_row, stride_dx_row,
    stride_dh_row, M, N, rows_per_program, offset, ROWS_BUCKET, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr, LOOP_STAGES: tl.constexpr,
    HOLD_STORAGE_FORM: tl.constexpr = False, HEADS: tl.constexpr = 1,
    STRIDE_X_OUTER: tl.constexpr = 0,
):  # fmt: skip
    """kernels.rmsnorm_bwd_kernel (its parameters) with each row's mean(g * x_hat) as
    _pairwise_row_sums; plain rows without dh_out or the held storage form only."""
    tl.static_assert(not HAS_DH_OUT and not HOLD_STORAGE_FORM and HEADS == 1)
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
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        x_hat = x.to(tl.float32) * rstd[:, None]
        g = w[None, :] * dy
        mean_gx = _pairwise_row_sums(g * x_hat, BLOCK_M, BLOCK_N) / N
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)  # fmt: skip
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


VARIANTS = {
    "product": (kernels.rmsnorm_fwd_kernel, {"enable_fp_fusion": True}),  # as launched (3.6)
    "product, no fp fusion": (kernels.rmsnorm_fwd_kernel, {"enable_fp_fusion": False}),
    "canonical": (rmsnorm_fwd_canonical_kernel, {"enable_fp_fusion": False}),
}
BACKWARD_VARIANTS = {
    "product": (kernels.rmsnorm_bwd_kernel, {"enable_fp_fusion": True}),
    "product, no fp fusion": (kernels.rmsnorm_bwd_kernel, {"enable_fp_fusion": False}),
    "canonical": (rmsnorm_bwd_canonical_kernel, {"enable_fp_fusion": False}),
}
SINGLE_TILE_BACKWARD = "rmsnorm_bwd_kernel"


class Patterns:
    """The distinct bit patterns of a variant's outputs across configurations, each output
    filled with NaN before its run (a row a configuration leaves unwritten shows) and compared
    as its bits."""

    def __init__(self):
        self.seen: dict[str, list] = {}
        self.tested, self.failed, self.unwritten = [], [], []

    @staticmethod
    def reset(*outputs) -> None:
        for t in outputs:
            t.fill_(float("nan"))

    def add(self, label: str, **outputs) -> None:
        self.tested.append(label)
        if any(bool(t.isnan().any()) for t in outputs.values()):
            self.unwritten.append(label)
        for name, t in outputs.items():
            bits = t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()
            known = self.seen.setdefault(name, [])
            if not any(torch.equal(p, bits) for p in known):
                known.append(bits)

    def summary(self) -> dict:
        return {"distinct": {k: len(v) for k, v in self.seen.items()},
                "tested": len(self.tested), "failed": self.failed, "unwritten": self.unwritten}  # fmt: skip


def _launches(x, w, y, rstd):
    """(config, grid, meta) of every candidate of the tuner's space for this call."""
    m, n = x.shape
    strides = (n, n, n, n)
    args = _single_tile_forward_args(x, w, y, rstd, x, x, strides, EPS, 0.0)
    switches = plain_forward_launch_switches(x, y, rstd, False, strides)

    def grid(meta):
        return (configs._tile_programs(m, meta, x.device),)

    out = []
    for config in launch._candidates(SINGLE_TILE_FORWARD, args, switches):
        launch_grid, meta = configs._kernel_grid_and_meta(SINGLE_TILE_FORWARD, grid,
                                                          {**switches, **config})  # fmt: skip
        out.append((config, launch_grid, meta))
    return out


def _backward_launches(dy, x, w, rstd, dx, partials, rows_per_program):
    """(config, meta) of every candidate of the tuner's space for the single-tile backward."""
    args = _single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partials, rows_per_program)
    switches = {"BLOCK_N": launch.block_size(x.shape[1]), "HAS_DH_OUT": False,
                "HOLD_STORAGE_FORM": False}  # fmt: skip
    return [(config, {**switches, **config})
            for config in launch._candidates(SINGLE_TILE_BACKWARD, args, switches)]  # fmt: skip


def backward_row(m: int, n: int, dtype, stream, l2: int) -> dict:
    """The backward's three variants over the tuner's space at m x n (no dh_out): device µs of
    the main kernel (the dw reduction, the same for all, left out), and the distinct dx bit
    patterns of each variant across the configurations."""
    x = torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=dtype, device="cuda")
    dy = torch.randn(m, n, dtype=dtype, device="cuda")
    rstd = torch.rsqrt(x.float().square().mean(dim=1) + EPS)
    dx = torch.empty_like(x)
    programs, rows_per_program = _single_tile_backward_grid(m, x.device)
    partials = torch.empty(programs, n, device="cuda")
    runs, bits = {}, {}
    launches = _backward_launches(dy, x, w, rstd, dx, partials, rows_per_program)
    args = _single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partials, rows_per_program)
    for name, (kernel, options) in BACKWARD_VARIANTS.items():
        kernel_launch._compile_in_parallel(
            kernel, args, [((programs,), {**meta, **options}) for _, meta in launches]
        )
        patterns = bits[name] = Patterns()
        for config, meta in launches:
            label = f"{name} | " + ",".join(f"{k}={v}" for k, v in config.items())

            def run(a, kernel=kernel, meta=meta, options=options):
                args = _single_tile_backward_args(a[0], a[1], a[2], a[3], 0.0, a[4], a[0], a[5],
                                                  rows_per_program)  # fmt: skip
                kernel[(programs,)](*args, **meta, **options)

            Patterns.reset(dx)
            try:
                run((dy, x, w, rstd, dx, partials))
                torch.cuda.synchronize()
            except Exception as error:
                print(label, type(error).__name__, str(error)[:160], flush=True)
                patterns.failed.append(label)
                continue
            patterns.add(label, dx=dx)
            runs[label] = run
    bits = {name: p.summary() for name, p in bits.items()}
    arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, partials), l2)
    stream.wait_stream(torch.cuda.current_stream())
    times = time_runs(runs, arg_sets, stream, passes=2)
    best = {name: min(((t, k) for k, t in times.items() if k.startswith(name + " |")),
                      default=(float("inf"), None)) for name in BACKWARD_VARIANTS}  # fmt: skip
    print(f"bwd {m}x{n}: patterns {bits}; best " +
          "; ".join(f"{name} {t:.2f} us" for name, (t, _k) in best.items()), flush=True)  # fmt: skip
    return {"m": m, "n": n, "mode": "bwd", "us": times, "patterns": bits, "best": best}


def main(out_path: str, dtype_name: str, shapes, backward_shapes) -> None:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    for m, n in shapes:
        x = torch.randn(m, n, dtype=dtype, device="cuda")
        w = torch.randn(n, dtype=dtype, device="cuda")
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        exact = torch.rsqrt(x.double().square().mean(dim=1) + EPS)
        candidates = _launches(x, w, y, rstd)
        args = _single_tile_forward_args(x, w, y, rstd, x, x, (n, n, n, n), EPS, 0.0)
        runs, bits, errors = {}, {}, {}
        for name, (kernel, options) in VARIANTS.items():
            kernel_launch._compile_in_parallel(
                kernel, args, [(g, {**meta, **options}) for _, g, meta in candidates]
            )
            patterns = bits[name] = Patterns()
            for config, launch_grid, meta in candidates:
                label = f"{name} | " + ",".join(f"{k}={v}" for k, v in config.items())

                def run(a, kernel=kernel, launch_grid=launch_grid, meta=meta, options=options, n=n):
                    args = _single_tile_forward_args(a[0], a[1], a[2], a[3], a[0], a[0],
                                                     (n, n, n, n), EPS, 0.0)  # fmt: skip
                    kernel[launch_grid](*args, **meta, **options)

                Patterns.reset(y, rstd)
                try:
                    run((x, w, y, rstd))
                    torch.cuda.synchronize()
                except Exception as error:  # a configuration this variant cannot compile
                    print(label, type(error).__name__, str(error)[:160], flush=True)
                    patterns.failed.append(label)
                    continue
                patterns.add(label, y=y, rstd=rstd)
                errors[label] = float(((rstd.double() - exact) / exact).abs().max())
                runs[label] = run
        bits = {name: p.summary() for name, p in bits.items()}
        worst = {name: max((e for k, e in errors.items() if k.startswith(name + " |")), default=None)
                 for name in VARIANTS}  # fmt: skip
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream, passes=2)
        best = {name: min(((t, k) for k, t in times.items() if k.startswith(name + " |")),
                          default=(float("inf"), None)) for name in VARIANTS}  # fmt: skip
        row = {"m": m, "n": n, "mode": "fwd", "dtype": dtype_name, "us": times,
               "rstd_rel_err": errors, "worst_rstd_rel_err": worst, "patterns": bits, "best": best}  # fmt: skip
        rows_out.append(row)
        print(f"{m}x{n} {dtype_name}: patterns {bits}; worst rstd error {worst}; best " +
              "; ".join(f"{name} {t:.2f} us ({k.split(' | ')[1] if k else '-'})"
                        for name, (t, k) in best.items()), flush=True)  # fmt: skip
        _save(out_path, rows_out)
    for m, n in backward_shapes:
        if launch.block_size(n) <= BACKWARD_MAX_BLOCK_N and m > 1:
            rows_out.append({**backward_row(m, n, dtype, stream, l2), "dtype": dtype_name})
            _save(out_path, rows_out)


#: The backward's canonical copy leaves out the held storage form, which wider tiles take.
BACKWARD_MAX_BLOCK_N = 8192


def _save(out_path: str, rows: list) -> None:
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                   "torch": torch.__version__, "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    chosen, chosen_backward = SHAPES, BACKWARD_SHAPES
    if len(sys.argv) > 3:
        chosen = chosen_backward = [
            tuple(int(v) for v in s.split("x")) for s in sys.argv[3].split(",")
        ]
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "fp16", chosen, chosen_backward)
