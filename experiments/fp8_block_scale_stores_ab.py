"""Probe: per 1x128 block, do the column-major scale stores cost the forward its time? (issue 34)

Run 81 (`results/nvidia-h200/probes/2026-12-04-d332fd25c670-fp8-models-seed-fwd.log`): at 16384
rows per block takes 1.05-1.20x per token's time (16384x4096: 53.9 against 49.6 µs; 16384x8192
113.7 against 105.1) and reaches 90% of the copy at 4 of 16 shapes of 64 MiB and more (per
token 14). Run 91 (`probes/2026-12-04-fe5b7746bdd7-fp8-padded-sweep.log`): no BLOCK_M x warps
is more than 2.3% faster than the table's. The sm_90 PTX a thread (Triton 3.6, 4096 columns, 4
warps, one row a tile) is 484 instructions and 4 barriers per block against 472 and 2 per token:
about the same work.

Reading: the scales are stored column-major (scale [m, g] at g * align(M, 4) + m, the layout
DeepSeek-style GEMMs read), and the tile is one row, so a program writes its row's 32-64 scales
4 bytes each, 32-64 different 32-byte sectors. At one scale per 128 codes that is one partial
sector write for every 4 full sectors of codes: the codes' store requests grow by a quarter,
and L2 must merge 8 programs' 4-byte writes into each sector. Per token writes one scale a row.

Timed here, one process, device-only (harness.fp8_bench's timer: a CUDA graph over rotating
inputs), bf16 to e4m3, without a residual:
- per block, the product's call (column-major scales, the table's configuration);
- the same with row-major scales (`scale_layout="row_major"`: a row's scales contiguous, 4-8
  sectors a row): where the reading holds, near per token's time;
- column-major with BLOCK_M 2, 4 and 8 rows a tile at 4-32 warps (8 rows fill a sector of
  each group's column), through FP8_LAUNCH_TABLE;
- beside them per token (the product's call) and our plain forward.
Each variant passes the fp8 oracle first.

Prediction: row-major 0.90-0.95 of column-major at 16384 x 4096-8192 (toward per token's
time), less at 2048 rows (fewer bytes in flight); BLOCK_M 4-8 column-major between the two
where it does not spill. If row-major is not faster, the scale stores are not the cost and the
group maxima are the next suspect.

    PYTHONPATH=.:$PYTHONPATH python experiments/fp8_block_scale_stores_ab.py OUT.json [--shapes MxN ...]

About 20 s a shape (each configuration compiles its kernel).
"""

from __future__ import annotations

import sys

import torch
from ab_timing import shapes_argument, write_probe_json

from harness.fp8_bench import _sets, _time
from harness.oracle_fp8 import check_fp8
from impls.triton_rmsnorm import fp8, rmsnorm

SHAPES = [(16384, 2048), (16384, 4096), (16384, 8192), (16384, 5120), (2048, 2880), (2048, 4096),
          (1, 4096)]  # fmt: skip
#: (BLOCK_M, num_warps) tried column-major besides the table's.
CONFIGS = [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16), (8, 32)]
EPS = 1e-6
E4 = torch.float8_e4m3fn


def _forward(s, scaling, layout):
    return lambda: fp8.rmsnorm_fp8_forward(s.x, s.weight, EPS, 0.0, scaling, None, E4,
                                           scale_layout=layout)  # fmt: skip


def _row(shape, sets, scaling, layout, config) -> dict:
    """One variant: checked by the oracle, then timed; config None is the table's."""
    block_n, tail_n = fp8.choose_tiles(shape[1], scaling, 2, sets[0].x.device, None)
    entry = None if config is None else {"BLOCK_M": config[0], "num_warps": config[1]}
    with fp8.launch_table_entry((scaling, block_n, 2, tail_n), entry):
        row = {"shape": list(shape), "scaling": scaling, "scale_layout": layout,
               "tiles": [block_n, tail_n], "table": config is None,
               "config": fp8.fp8_launch_config(shape[1], scaling, 2, sets[0].x.device,
                                               (block_n, tail_n))}  # fmt: skip
        try:
            q, scales, _rstd, _h = _forward(sets[0], scaling, layout)()
            reports = check_fp8(q, scales, sets[0].x, sets[0].weight, EPS, scaling=scaling,
                                fp8_dtype=E4)  # fmt: skip
            row["passed"] = all(r.passed for r in reports)
            if row["passed"]:
                row["us"] = _time([_forward(s, scaling, layout) for s in sets]).ms * 1e3
        except Exception as exc:  # a configuration that does not compile or fit: a row, go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def main(out_path: str, shapes: list | None = None) -> None:
    rows, references = [], {}
    for shape in shapes or SHAPES:
        label = f"{shape[0]}x{shape[1]}"
        sets, _ = _sets(shape, torch.bfloat16, EPS, False, E4)
        references[label] = {
            "plain_us": _time([lambda s=s: rmsnorm(s.x, s.weight, EPS) for s in sets]).ms * 1e3,
        }
        variants = [("per_token", "column_major", None), ("block", "column_major", None),
                    ("block", "row_major", None)]  # fmt: skip
        variants += [("block", "column_major", c) for c in CONFIGS if c[0] <= shape[0]]
        product = None
        for scaling, layout, config in variants:
            row = _row(shape, sets, scaling, layout, config)
            rows.append(row)
            if scaling == "block" and layout == "column_major" and config is None:
                product = row.get("us")
            us = row.get("us")
            ratio = f"{us / product:.3f}" if us and product else "-"
            print(f"{label:>11} {scaling:<9} {layout:<12} {row['config']} table={row['table']!s:<5} "
                  f"{us if us else row.get('error')} x block product {ratio}", flush=True)  # fmt: skip
        print(label, references[label], flush=True)
        del sets
        torch.cuda.empty_cache()
        write_probe_json(out_path, references=references, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1], shapes=shapes_argument(sys.argv[2:]))
