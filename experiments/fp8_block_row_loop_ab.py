"""Probe: per 1x128 block, several rows a program so that the column-major scales are stored a
sector at a time (issue 34: >= 90% of the copy at the shapes of >= 64 MiB).

Run 98 (`results/nvidia-h200/probes/2026-12-04-f63c5edcc0a8-fp8-block-scale-stores.log`): with
row-major scales per block took 0.938-0.987 of the column-major product's time (16384x4096 0.952,
16384x8192 0.975), closing 26-95% of its gap to per token. Column-major, a one-row program
writes each of its 32-64 scales (4 bytes) into its own 32-byte sector. Tiles of 2-8 rows, which
would fill a sector, were 1.09-2.93x slower: the [BLOCK_M, N] tile costs more than the stores
save.

The change probed: the product's one-row tile, unchanged, done ROWS times in a program (an
unrolled loop over consecutive rows), its scales kept in registers ([ROWS, groups]) and stored
after the loop, a group's ROWS scales contiguous (column-major: scale [m, g] at
g * align(M, 4) + m). At ROWS = 8 a group's scales of a program fill a sector; w is loaded once
a program. Each row is computed by the same operations in the same layout as the product's, so
the codes, scales and rstd must be bitwise the product's: checked first at every shape (and
against the fp8 oracle), then timed by harness.fp8_bench's timer beside the product (timed
before and after the variants; ratios to the mean), per token and the row-major product. w is
loaded as the product loads it (with x only where the grid is at most one program an SM).
Shapes where the product takes another tile (BLOCK_M > 1, a split tile) are skipped.

Prediction: at 16384 rows ROWS = 8 between the column-major product and the row-major one
(0.95-0.98 of the product's time at 16384 x 4096-8192); at 2048 rows and fewer no gain or a
loss (fewer programs, and a program's rows run one after another); ROWS = 1 within 1% of the
product (the same kernel, less general). If so, the launch table can take ROWS by M class (the
bits do not depend on it), and the shapes of >= 64 MiB gain up to row-major's margin.

    PYTHONPATH=.:experiments:$PYTHONPATH python experiments/fp8_block_row_loop_ab.py OUT.json [--shapes MxN ...]

Power-of-two widths only (the product's split tiles are not mirrored). About 15 s a shape.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from ab_timing import shapes_argument, write_probe_json

from impls.triton_rmsnorm import common, fp8, launch, rmsnorm
from impls.triton_rmsnorm.fp8_kernels import (
    _dynamic_scale,
    _max_propagating_nan,
    _store_codes,
    _tile_source,
    _weight,
    _weight_row,
)

SHAPES = [(16384, 2048), (16384, 4096), (16384, 8192), (4096, 8192), (8192, 4096),
          (2048, 4096), (1024, 4096), (16, 4096)]  # fmt: skip
ROWS = (1, 2, 4, 8)
EPS = 1e-6
E4 = torch.float8_e4m3fn


@triton.jit
def fp8_block_rows_kernel(
    X, W, Q, SCALES, RSTD, stride_x_row, stride_q_row, stride_s_row, stride_s_col, M,
    N: tl.constexpr, eps, offset, FP8_MAX: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAST_IN_KERNEL: tl.constexpr,
    SATURATE: tl.constexpr, W_EARLY: tl.constexpr, WAIT_FOR_PRIOR_GRID: tl.constexpr = False,
):  # fmt: skip
    """The product's per-block single tile (BLOCK_M 1, RECIPROCAL, W_AS_ROW, no residual, no
    tail) for ROWS consecutive rows; the scales stored once, [ROWS, groups] at a time. w is
    loaded once a program: with x (W_EARLY, as the product where its grid is at most one
    program an SM), else after the first row's sum, as the product loads it."""
    if WAIT_FOR_PRIOR_GRID:
        tl.extra.cuda.gdc_wait()
    GROUPS: tl.constexpr = BLOCK_N // GROUP
    first = tl.program_id(0).to(tl.int64) * ROWS
    cols = tl.arange(0, BLOCK_N)
    if W_EARLY:
        w = _weight(W, cols, N, offset, _weight_row(W, cols, N, True), True, True)
    picks = tl.arange(0, ROWS)
    kept = tl.zeros([ROWS, GROUPS], dtype=tl.float32)
    for i in tl.static_range(ROWS):
        rows = first + i + tl.arange(0, 1)
        row_mask = rows < M
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = _tile_source(X, X, X, rows, cols, mask, stride_x_row, 0, 0, False)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) / N + eps)
        if i == 0 and not W_EARLY:  # constexprs: the first row's iteration loads w for all
            w = _weight(W, cols, N, offset, None, False, True)
        y = x * rstd[:, None] * w
        y3 = tl.reshape(y, [1, GROUPS, GROUP])
        scale = _dynamic_scale(tl.reduce(tl.abs(y3), 2, _max_propagating_nan), FP8_MAX)
        inverse = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
        v = tl.reshape(y3 * inverse[:, :, None], [1, BLOCK_N])
        _store_codes(v, Q, rows, cols, mask, stride_q_row, FP8_MAX, CAST_IN_KERNEL, SATURATE)
        tl.store(RSTD + rows, rstd, mask=row_mask)
        kept = tl.where(picks[:, None] == i, scale, kept)
    rows = first + picks
    groups = tl.arange(0, GROUPS)
    group_mask = (rows < M)[:, None] & (groups < (N + GROUP - 1) // GROUP)[None, :]
    tl.store(SCALES + rows[:, None] * stride_s_row + groups[None, :] * stride_s_col, kept,
             mask=group_mask)  # fmt: skip


def rows_forward(x, w, rows: int, num_warps: int, layout: str = "column_major"):
    """(q, scales, rstd) by fp8_block_rows_kernel, as fp8.rmsnorm_fp8_forward allocates them."""
    m, n = x.shape
    cast = not launch.interpreting()
    q = torch.empty((m, n), dtype=E4 if cast else torch.float32, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    scales = fp8._empty_scales(m, n, "block", layout, x.device)
    programs = launch.cdiv(m, rows)
    with launch._on_device(x):
        launch._launch_fixed(
            fp8_block_rows_kernel, (programs,), x, w, q, scales, rstd, x.stride(0),
            q.stride(0), scales.stride(0), scales.stride(1), m, n, EPS, 0.0,
            num_warps=4 if launch.interpreting() else num_warps, FP8_MAX=fp8.FP8_MAX[E4],
            GROUP=fp8.BLOCK_GROUP, BLOCK_N=triton.next_power_of_2(n), ROWS=rows,
            CAST_IN_KERNEL=cast, SATURATE=fp8.clamps_before_cast(None, cast, x.device),
            W_EARLY=common.loads_w_early(programs, x.device), **common.pdl_switches(x.device),
        )  # fmt: skip
    return (q if cast else q.to(E4)), scales, rstd


def _product(x, w, scaling="block", layout="column_major"):
    return fp8.rmsnorm_fp8_forward(x, w, EPS, 0.0, scaling, None, E4, scale_layout=layout)


def same_bits(x, w, rows: int, num_warps: int) -> bool:
    """The probe kernel's codes, scales and rstd bitwise the product's (its table config)."""
    q, scales, rstd, _ = _product(x, w)
    q2, scales2, rstd2 = rows_forward(x, w, rows, num_warps)
    bits = lambda t: t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int32)  # noqa: E731
    return all(
        torch.equal(bits(a), bits(b)) for a, b in ((q, q2), (scales, scales2), (rstd, rstd2))
    )


def main(out_path: str, shapes: list | None = None) -> None:
    from harness.fp8_bench import _sets, _time
    from harness.oracle_fp8 import check_fp8

    rows_out, references = [], {}
    for shape in shapes or SHAPES:
        m, n = shape
        if n & (n - 1):
            raise SystemExit(
                f"{m}x{n}: power-of-two widths only (the split tiles are not mirrored)"
            )
        label = f"{m}x{n}"
        sets, _ = _sets(shape, torch.bfloat16, EPS, False, E4)
        config = fp8.fp8_launch_config(n, "block", 2, sets[0].x.device, (n, 0))
        if config["BLOCK_M"] != 1 or fp8.choose_tiles(n, "block", 2, sets[0].x.device) != (n, 0):
            print(f"{label}: the product takes {config} here, not the one-row padded tile the "
                  "probe mirrors: skipped", flush=True)  # fmt: skip
            continue
        timed = lambda fns: _time(fns).ms * 1e3  # noqa: E731
        product = [lambda s=s: _product(s.x, s.weight) for s in sets]
        ref = {
            "plain_us": timed([lambda s=s: rmsnorm(s.x, s.weight, EPS) for s in sets]),
            "per_token_us": timed([lambda s=s: _product(s.x, s.weight, "per_token") for s in sets]),
            "block_row_major_us": timed(
                [lambda s=s: _product(s.x, s.weight, layout="row_major") for s in sets]
            ),  # fmt: skip
            "block_product_us": timed(product),
            "config": config,
        }
        measured = []
        references[label] = ref
        print(label, ref, flush=True)
        for rows in ROWS:
            if rows > m:
                continue
            row = {"shape": [m, n], "rows": rows, "num_warps": config["num_warps"]}
            try:
                x, w = sets[0].x, sets[0].weight
                row["same_bits"] = same_bits(x, w, rows, config["num_warps"])
                q, scales, _rstd = rows_forward(x, w, rows, config["num_warps"])
                reports = check_fp8(q, scales, x, w, EPS, scaling="block", fp8_dtype=E4)
                row["passed"] = all(r.passed for r in reports)
                if row["passed"]:
                    warps = config["num_warps"]
                    row["us"] = timed([lambda s=s, r=rows, nw=warps: rows_forward(s.x, s.weight, r, nw)
                                       for s in sets])  # fmt: skip
                    measured.append(row)
            except Exception as exc:  # a variant that does not compile or fit: a row, go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            rows_out.append(row)
            print(f"{label:>11} rows={rows} {row}", flush=True)
        # the product timed again after the variants: each ratio is to the mean of both times
        ref["block_product_us_after"] = timed(product)
        baseline = (ref["block_product_us"] + ref["block_product_us_after"]) / 2
        for row in measured:
            row["x_product"] = row["us"] / baseline
        print(label, "product before / after the variants:", ref["block_product_us"],
              ref["block_product_us_after"], flush=True)  # fmt: skip
        del sets
        torch.cuda.empty_cache()
        write_probe_json(out_path, references=references, rows=rows_out)


if __name__ == "__main__":
    main(sys.argv[1], shapes=shapes_argument(sys.argv[2:]))
