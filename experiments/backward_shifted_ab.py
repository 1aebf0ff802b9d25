"""Probe: the backward of rows that are not 16-byte aligned (odd N), three kernels side by side.

At 8192x4095 bf16 the product's backward ran at 2082 GB/s (49% of the copy) against 3444 at
4096 columns: its 2-byte loads cannot be widened nor staged by cp.async, and no config of
rmsnorm_bwd_kernel recovers it at one program per SM
(probes/2026-11-30-602c254d9e20-backward-odd-n-sweep.txt). Variants, main kernel alone (the dw
reduction is the same for all), device-only, each at its best of the product tuner's candidates
for it (the tuner's timer, best of two interleaved passes):
- "plain": kernels.rmsnorm_bwd_kernel, as the product launched odd N before;
- "shifted": kernels.rmsnorm_bwd_shifted_kernel (rows of one alignment class per program, the
  tile in the frame lane = (column + shift) mod BLOCK_N, every load an aligned 16-byte vector);
- "shifted, edges ahead": the probe's first version of that kernel (whole groups as vectors,
  the row's end columns in a separate 2 * VEC-column tile, element by element) with each
  step's edge loads issued one step ahead (a copy, below). Its first run, with and without the
  edges ahead: `2026-11-30-602c254d9e20-backward-shifted-ab-edge-tile.txt`.
dx of each shifted variant is compared with plain's (elements differing, largest difference in
ulps of the output dtype), and dw (the partials summed) likewise.

Prediction: the shifted kernel near the aligned 4096-column backward (3400-3600 GB/s main kernel),
1.5-1.7x plain, and ahead of the edge-tile version with its edges ahead (1.03-1.27x plain in its
first run: the edge tile cost ~100 registers a thread, ptxas, and its loads were not staged).

Run from the repository root on a GPU:
    PYTHONPATH=.:experiments python experiments/backward_shifted_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [
    (8192, 4095, torch.bfloat16),
    (8192, 4095, torch.float16),
    (16384, 4095, torch.bfloat16),
    (4096, 8191, torch.bfloat16),
    (2048, 16383, torch.bfloat16),
    (32768, 1023, torch.bfloat16),
    (8192, 4096, torch.bfloat16),  # aligned: the plain kernel's reference
]


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def shifted_prefetch_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, N, rows_per_program, offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VEC: tl.constexpr,  # elements in 16 bytes
    PERIOD: tl.constexpr,  # rows after which the rows' alignment repeats (VEC / gcd(stride, VEC))
    HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    HOLD_STORAGE_FORM: tl.constexpr = False,
):  # fmt: skip
    """kernels.rmsnorm_bwd_shifted_kernel with its edge loads issued one step ahead."""
    pid = tl.program_id(0)
    row_class = pid % PERIOD
    shift = row_class * (stride_x_row % VEC) % VEC  # (not row_class * stride: int32)
    lanes = tl.arange(0, BLOCK_N)
    group = (lanes // VEC) * VEC
    whole = (group >= shift) & (group + VEC <= shift + N)  # constant within each group of VEC
    cols = lanes - shift
    # the row's columns outside the whole groups, fewer than VEC at each end: head columns
    # [0, head) and tail columns [tail, N), in an edge tile of 2 * VEC columns
    head = (VEC - shift) % VEC
    tail = (shift + N) // VEC * VEC - shift
    edge = tl.arange(0, 2 * VEC)
    in_tail = edge // VEC
    edge_cols = tl.where(in_tail == 0, edge, tail + edge - VEC)
    edge_in = tl.where(in_tail == 0, edge < head, edge_cols < N)

    w = tl.load(W + cols, mask=whole, other=0.0).to(tl.float32) + offset
    w_edge = tl.load(W + edge_cols, mask=edge_in, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dw_edge = tl.zeros([BLOCK_M, 2 * VEC], dtype=tl.float32)

    class_rows = (M - row_class + PERIOD - 1) // PERIOD
    first = (pid // PERIOD).to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, class_rows)
    x_e_next, dy_e_next = _edges(X, DY, first, last, row_class, stride_x_row, stride_dy_row,
                                 edge_cols, edge_in, BLOCK_M, PERIOD)  # fmt: skip
    for step in tl.range(first, last, BLOCK_M, num_stages=LOOP_STAGES):
        index = step + tl.arange(0, BLOCK_M)
        row_mask = index < last
        rows = row_class + index * PERIOD
        main_mask = row_mask[:, None] & whole[None, :]
        edge_mask = row_mask[:, None] & edge_in[None, :]
        x_e = x_e_next
        dy_e = dy_e_next
        x_e_next, dy_e_next = _edges(X, DY, step + BLOCK_M, last, row_class, stride_x_row,
                                     stride_dy_row, edge_cols, edge_in, BLOCK_M, PERIOD)  # fmt: skip
        x_start = tl.multiple_of(rows * stride_x_row - shift, VEC)
        dy_start = tl.multiple_of(rows * stride_dy_row - shift, VEC)
        x_loaded = tl.load(X + x_start[:, None] + lanes[None, :], mask=main_mask, other=0.0)
        dy_loaded = tl.load(DY + dy_start[:, None] + lanes[None, :], mask=main_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)

        dy = dy_loaded.to(tl.float32)
        x_hat = x_loaded.to(tl.float32) * rstd[:, None]
        g = w[None, :] * dy
        x_hat_e = x_e * rstd[:, None]
        g_e = w_edge[None, :] * dy_e
        dot = tl.sum(g * x_hat, axis=1) + tl.sum(g_e * x_hat_e, axis=1)
        mean_gx = dot / N
        if HOLD_STORAGE_FORM:  # second pass: from the values as loaded, upcast again
            x_hat = kernels._upcast_opaque(x_loaded) * rstd[:, None]
            dy = kernels._upcast_opaque(dy_loaded)
            g = w[None, :] * dy
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        dx_e = (g_e - x_hat_e * mean_gx[:, None]) * rstd[:, None]
        dx_start = tl.multiple_of(rows * stride_dx_row - shift, VEC)
        if HAS_DH_OUT:
            dh_start = tl.multiple_of(rows * stride_dh_row - shift, VEC)
            dh = tl.load(DH_OUT + dh_start[:, None] + lanes[None, :], mask=main_mask, other=0.0)
            dx += dh.to(tl.float32)
            dh_e = tl.load(
                DH_OUT + (rows * stride_dh_row)[:, None] + edge_cols[None, :],
                mask=edge_mask,
                other=0.0,
            )
            dx_e += dh_e.to(tl.float32)
        out_ty = DX.dtype.element_ty
        tl.store(DX + dx_start[:, None] + lanes[None, :], dx.to(out_ty), mask=main_mask)
        tl.store(
            DX + (rows * stride_dx_row)[:, None] + edge_cols[None, :], dx_e.to(out_ty),
            mask=edge_mask,
        )  # fmt: skip

        dw_acc += dy * x_hat
        dw_edge += dy_e * x_hat_e

    partial = DW_PARTIAL + pid.to(tl.int64) * N
    tl.store(partial + cols, tl.sum(dw_acc, axis=0), mask=whole)
    tl.store(partial + edge_cols, tl.sum(dw_edge, axis=0), mask=edge_in)


@triton.jit
def _edges(X, DY, step, last, row_class, stride_x_row, stride_dy_row, edge_cols, edge_in,
           BLOCK_M: tl.constexpr, PERIOD: tl.constexpr):  # fmt: skip
    index = step + tl.arange(0, BLOCK_M)
    rows = row_class + index * PERIOD
    mask = (index < last)[:, None] & edge_in[None, :]
    x_e = tl.load(X + (rows * stride_x_row)[:, None] + edge_cols[None, :], mask=mask, other=0.0)
    dy_e = tl.load(DY + (rows * stride_dy_row)[:, None] + edge_cols[None, :], mask=mask, other=0.0)
    return x_e.to(tl.float32), dy_e.to(tl.float32)


def _run(kernel, meta, programs, rows_per_program):
    def run(a):
        dy, x, w, rstd, dx, partial = a
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        kernel[(programs,)](*args, **meta)

    return run


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in ulps of b's dtype at b's magnitude."""
    spacing = torch.finfo(b.dtype).eps * b.float().abs().clamp_min(torch.finfo(b.dtype).tiny)
    return float(((a.float() - b.float()).abs() / spacing).max())


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("main kernel alone, µs (GB/s of 3MN), each variant at its best candidate", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        block_n = triton.next_power_of_2(n)
        period = launch.backward_row_period(x, dy, None)
        held = launch.backward_holds_storage_form(block_n, x.dtype, dy.dtype)
        base = {"BLOCK_N": block_n, "HAS_DH_OUT": False, "HOLD_STORAGE_FORM": held}
        kinds = {"plain": (kernels.rmsnorm_bwd_kernel, "rmsnorm_bwd_kernel", 1, {})}
        if period > 1:
            vec = 16 // x.element_size()
            shifted = {"VEC": vec, "PERIOD": period}
            wrap = {"MAY_WRAP": n + vec - vec // period > block_n}  # as launch sets it
            kinds["shifted"] = (kernels.rmsnorm_bwd_shifted_kernel, "rmsnorm_bwd_shifted_kernel",
                                period, {**shifted, **wrap})  # fmt: skip
            kinds["shifted, edges ahead"] = (shifted_prefetch_kernel,
                                             "rmsnorm_bwd_shifted_kernel", period, shifted)  # fmt: skip
        runs, grids = {}, {}
        programs_max = 0
        for name, (_, _, kind_period, _) in kinds.items():
            programs, rows_per_program = launch._single_tile_backward_grid(m, x.device, kind_period)
            programs_max = max(programs_max, programs)
            grids[name] = (programs, rows_per_program)
        dx, partial = torch.empty_like(x), torch.zeros(programs_max, n, device="cuda")
        args0 = (dy, x, w, rstd, dx, partial)
        for name, (kernel, tuned_name, _, extra) in kinds.items():
            programs, rows_per_program = grids[name]
            kernel_args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                            rows_per_program)  # fmt: skip
            for config in launch._candidates(tuned_name, kernel_args, {**base, **extra}):
                meta = {**base, **extra, **config}
                key = (name, tuple(sorted(config.items())))
                runs[key] = _run(kernel, meta, programs, rows_per_program)
        outputs, failed = {}, {}
        for key, run in list(runs.items()):
            try:
                run(args0)
                torch.cuda.synchronize()
            except Exception as error:  # an unrunnable candidate does not end the probe
                failed[str(key)] = f"{type(error).__name__}: {str(error)[:100]}"
                del runs[key]
        arg_sets = tuning.rotating_arguments(args0, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        best = {}
        for (name, config), us in times.items():
            if name not in best or us < best[name][0]:
                best[name] = (us, config)
        checks = {}
        for name in best:  # each variant's best candidate once more, on args0, for its outputs
            programs = grids[name][0]
            dx.fill_(float("nan"))
            partial.zero_()
            runs[(name, best[name][1])](args0)
            torch.cuda.synchronize()
            outputs[name] = (dx.clone(), partial[:programs].sum(0))
        for name in outputs:
            if name != "plain":
                (dx_a, dw_a), (dx_b, dw_b) = outputs[name], outputs["plain"]
                checks[name] = {
                    "dx_differ": int((dx_a != dx_b).sum()), "dx_nan": int(dx_a.isnan().sum()),
                    "dx_ulps": _ulps(dx_a, dx_b), "dw_max_rel": float(
                        ((dw_a - dw_b).abs() / dw_b.abs().clamp_min(1e-3)).max()),
                }  # fmt: skip
        gb = 3 * m * n * x.element_size() / 1e3
        cells = "  ".join(f"{name}: {us:7.2f} ({gb / us:4.0f})" for name, (us, _) in best.items())
        ratio = ""
        if "shifted" in best:
            ratio = f"  shifted/plain {best['plain'][0] / best['shifted'][0]:.3f}x"
        print(f"{m:6d}x{n:5d} {str(dtype)[6:]:8s} {cells}{ratio}", flush=True)
        for name, (_, config) in best.items():
            print(f"    {name}: {dict(config)} {checks.get(name, '')}", flush=True)
        rows_out.append({"m": m, "n": n, "dtype": str(dtype), "period": period,
                         "times": {f"{k[0]} {dict(k[1])}": us for k, us in times.items()},
                         "best": {k: [us, dict(c)] for k, (us, c) in best.items()},
                         "checks": checks, "failed": failed})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
