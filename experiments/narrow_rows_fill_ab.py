"""Probe: at the qk-norm preset's 16-token views, do tiles that fill the SMs beat the table's?

Run 24 (71c7f68e31cb) has our forward at 0.51-0.91 of FlashInfer's on the 16-token qk-norm views
(launch-bound calls of 128-1024 rows of 64-256 columns). The H200 table keeps one configuration
per width across M (batch invariance), so these calls take the largest M's tiles: at 256 columns
fp16, 32 rows a tile on a persistent grid, i.e. 4 programs for 128 rows on 132 SMs
(16x8x256 fp16: 55 GB/s against FlashInfer's 108). configs.one_row_tiles (392e4cb) splits
tiles only where the tile's warps all lie along the row, which narrow rows never satisfy.

Prediction: with the warps and the 16-byte vectors kept, a row is reduced by the same threads in
the same order whatever BLOCK_M (Triton lays a tile's threads and warps along the row first,
from the row's width, not from BLOCK_M), so tiles of fewer rows on a grid of one program a tile
keep the bits; the forward then runs up to 2x faster where the table gives fewer than ~32
programs. The probe checks both claims; if the bits hold at every case, configs.one_row_tiles'
condition can drop the warps-along-the-row test and fill the SMs at narrow rows too.

Per view (fp16 and bf16): the table's configuration (as a default call launches it), then
  - fill: one program a tile (PROGRAMS_PER_SM 0, LOOP_STAGES 1, num_stages 1), BLOCK_M the
    largest power of two whose tiles reach the SM count (at least 1), the table's warps;
  - one_row: BLOCK_M 1, one program a tile, the table's warps;
each forced through dispatch.override(forward="single_tile", forward_configs=...); device-only
time by the tuner's timer (CUDA-graph replays over copies past the L2); y bitwise against the
table's. A variant outside the kernel's configuration space is reported, not timed.

Run on the GPU from the repository root:
    PYTHONPATH=. python experiments/narrow_rows_fill_ab.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
from ab_timing import forced_single_tile_forwards

from harness.layouts import make_case_inputs
from harness.shapes import PRESETS, HeadView
from impls.triton_rmsnorm import common, dispatch

TOKENS = 16


def variants(table: dict, m: int, sms: int) -> dict[str, dict]:
    one_program_a_tile = {**table, "PROGRAMS_PER_SM": 0, "LOOP_STAGES": 1, "num_stages": 1}
    block_m = table["BLOCK_M"]
    while block_m > 1 and -(-m // block_m) < sms:
        block_m //= 2
    out = {"table": table}
    if block_m != table["BLOCK_M"] or table["PROGRAMS_PER_SM"] != 0:
        out["fill"] = {**one_program_a_tile, "BLOCK_M": block_m}
    if table["BLOCK_M"] > 1 and block_m != 1:
        out["one_row"] = {**one_program_a_tile, "BLOCK_M": 1}
    return out


def case(view: HeadView, dtype: torch.dtype, stream, sms: int) -> list[dict]:
    inputs = make_case_inputs(view, dtype, "cuda", seed=view.heads * view.head_dim)
    describe = {"dtype": str(dtype).removeprefix("torch."), "view": list(view.dims),
                "packed_width": view.packed_width, "m": view[0], "n": view[1]}  # fmt: skip
    return forced_single_tile_forwards(inputs.x, inputs.weight,
                                       lambda table: variants(table, view[0], sms), describe,
                                       stream)  # fmt: skip


def main(out_path: str) -> None:
    stream = dispatch.private_stream(0)
    sms = common._programs_cap(torch.device("cuda", 0))
    views = [v for v in PRESETS["qk-norm"][1] if v.tokens == TOKENS]
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for view in views:
            rows += case(view, dtype, stream, sms)
    with open(out_path, "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
