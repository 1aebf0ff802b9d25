"""Probe: at decode rows, does a tile of one row beat the table's tiles of several, with the same bits?

The H200 table keeps one configuration per width across M classes (batch invariance), so decode
M takes the largest class's pick: at N = 8192, BLOCK_M = 2 and 8 warps, M / 2 programs for M
rows, fewer programs than SMs (16x8192 bf16: 3.01 us against FlashInfer's 1.98 in run 11,
cf5fbc3e3cde). A [2, N] tile over 8 warps reduces each row over 4 of them; a [1, N] tile over 4
warps reduces it the same way, so the prediction is the same bits with twice the programs, and
the forward at 16-256 rows faster by up to a third where BLOCK_M > 1 now (at 1 row nothing
changes). BLOCK_M = 1 at the table's warps is timed too (more warps a row: other bits expected).

Per (dtype, N, M): the table's configuration (as a default call launches it), then each variant
forced through dispatch.override(forward="single_tile", forward_configs=...); device-only time
by the tuner's timer (CUDA-graph replays over copies past the L2); y bitwise against the
table's. A variant outside the kernel's configuration space is reported, not timed.

Run on the GPU from the repository root:
    PYTHONPATH=. python experiments/decode_tile_rows_ab.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
from ab_timing import forced_single_tile_forwards

from impls.triton_rmsnorm import dispatch

WIDTHS = (2048, 4096, 8192)
ROWS = (1, 16, 64, 256)


def variants(table: dict) -> dict[str, dict]:
    out = {"table": table}
    block_m, warps = table["BLOCK_M"], table["num_warps"]
    if block_m > 1:
        out["one_row_same_warps_per_row"] = {**table, "BLOCK_M": 1,
                                             "num_warps": max(1, warps // block_m)}  # fmt: skip
        out["one_row_table_warps"] = {**table, "BLOCK_M": 1}
    return out


def case(dtype: torch.dtype, n: int, m: int, stream) -> list[dict]:
    gen = torch.Generator().manual_seed(n + m)
    x = torch.randn(m, n, generator=gen).to("cuda", dtype)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to("cuda", dtype)
    describe = {"dtype": str(dtype).removeprefix("torch."), "n": n, "m": m}
    return forced_single_tile_forwards(x, w, variants, describe, stream)


def main(out_path: str) -> None:
    stream = dispatch.private_stream(0)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for n in WIDTHS:
            for m in ROWS:
                rows += case(dtype, n, m, stream)
    with open(out_path, "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
