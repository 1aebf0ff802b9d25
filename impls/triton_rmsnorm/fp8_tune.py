"""Offline tuning of rmsnorm_fp8's single-tile kernel: for each (scaling, tile width, x's element
size), every candidate BLOCK_M x num_warps timed device-only on this GPU, the fastest written
to the GPU class's launch table (fp8_table.py), which later calls read.

    python -m impls.triton_rmsnorm.fp8_tune [--out impls/triton_rmsnorm/tables/fp8/nvidia-h200.json]

Each width is timed at M = --elements / N rows (default 2**24 elements: 32 MiB of 16-bit x,
past the L2, where the kernel is bound by memory), by the tuner's timer (CUDA-graph replays
over rotating copies of the inputs, tuning.py), without a residual. One configuration serves
every M of a width, so a row's codes do not change with M. --budget-s stops between widths
and writes what it has; the table is saved after every width (atomically), and a width the
--out file already holds is skipped, so a sweep can run over several calls.

--split-n N ...: for each N whose split tiles (fp8.fp8_tiles: a power-of-two tile and a tail)
have fewer columns than its padded tile, the split's candidates are timed at the width the two
tiles fill (4608 for 4096 + 512), beside the padded tile's own configuration (the table's entry,
else the heuristic) at that width; the split entry is written only where it is faster, and
then every call whose split tiles it names takes it (fp8.choose_tiles). Run after the padded
entries are in the table.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

from . import dispatch, fp8, fp8_table, tuning
from .configs import NUM_WARPS_CHOICES, ROWS_PER_TILE_CHOICES

#: Tile widths tuned: the powers of two the single-tile fp8 kernel takes.
BLOCK_NS = tuple(2**k for k in range(7, 16))  # 128 .. 32768
#: The [BLOCK_M, BLOCK_N] tiles a candidate holds (a row wider than the largest: one row), and
#: the elements a thread holds: outside these a tile only spills, idles or launches too often.
TILE_ELEMENTS = (2048, 16384)
ELEMENTS_PER_THREAD = (4, 32)
DTYPE_OF_ITEMSIZE = {2: torch.bfloat16, 4: torch.float32}
#: The split's best candidate and the padded tile are timed this many times each, in turn.
SPLIT_REPEATS = 3
EPS = 1e-6


def candidates(block_n: int) -> list[dict]:
    """BLOCK_M x num_warps for a tile width: whole rows, TILE_ELEMENTS a tile (one row where a
    row has more) and ELEMENTS_PER_THREAD a thread."""
    low, high = ELEMENTS_PER_THREAD
    smallest, largest = TILE_ELEMENTS
    out = []
    for block_m in ROWS_PER_TILE_CHOICES:
        tile = block_m * block_n
        if tile > max(largest, block_n):
            break
        if tile < smallest and block_m * 2 * block_n <= largest:
            continue  # a larger tile of whole rows fits
        for warps in NUM_WARPS_CHOICES:
            if low <= tile // (32 * warps) <= high:
                out.append({"BLOCK_M": block_m, "num_warps": warps})
    return out or [fp8.heuristic_fp8_launch_config(block_n)]


def _time_config(scaling, itemsize, tiles, config, arg_sets, static, stream) -> float:
    """Device µs of one forward at these tiles and configuration (FP8_LAUNCH_TABLE, restored)."""

    def call(args, scaling=scaling, static=static, split=tiles[1] > 0):
        fp8.rmsnorm_fp8_forward(args[0], args[1], EPS, 0.0, scaling, static,
                                torch.float8_e4m3fn, split_tile=split)  # fmt: skip

    with fp8.launch_table_entry((scaling, tiles[0], itemsize, tiles[1]), config):
        return 1e3 * tuning._median_ms(call, arg_sets, stream)


def tune_width(
    scaling: str, block_n: int, itemsize: int, elements: int, stream, tail_n: int = 0,
    padded: dict | None = None,
) -> fp8_table.Fp8Entry | None:  # fmt: skip
    """The fastest candidate at one width, timed as described above. With tail_n, the split
    tiles (block_n, tail_n) at block_n + tail_n columns; padded: the padded tile's configuration
    there, timed too (the entry's padded_us); None when the split is not faster."""
    m, n = max(1, elements // (block_n + tail_n)), block_n + tail_n
    gen = torch.Generator().manual_seed(block_n + itemsize)
    dtype = DTYPE_OF_ITEMSIZE[itemsize]
    x = torch.randn(m, n, generator=gen).to("cuda", dtype)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to("cuda", dtype)
    scale = torch.full((1,), 0.05, dtype=torch.float32, device="cuda")
    static = scale if scaling == "per_tensor" else None
    arg_sets = tuning.rotating_arguments((x, w), tuning.l2_bytes(0))
    best = None
    for config in candidates(block_n):
        us = _time_config(scaling, itemsize, (block_n, tail_n), config, arg_sets, static, stream)
        if best is None or us < best[1]:
            best = (config, us)
    config, us = best
    padded_us = None
    if tail_n:  # the split's best and the padded tile, timed again in turn: the same odds
        padded_tiles = fp8.fp8_tiles(n, scaling)
        split_times, padded_times = [], []
        for _ in range(SPLIT_REPEATS):
            split_times.append(_time_config(scaling, itemsize, (block_n, tail_n), config,
                                            arg_sets, static, stream))  # fmt: skip
            padded_times.append(_time_config(scaling, itemsize, padded_tiles, padded, arg_sets,
                                             static, stream))  # fmt: skip
        us, padded_us = min(split_times), min(padded_times)
        if us >= padded_us:
            return None
    return fp8_table.Fp8Entry(scaling, block_n, itemsize, config["BLOCK_M"], config["num_warps"],
                              (m, n), us, tail_n, padded_us)  # fmt: skip


def _single_tile_width(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--split-n: expected an integer, got {text!r}") from None
    if not 1 <= n <= fp8.FP8_SINGLE_TILE_MAX_N:
        raise argparse.ArgumentTypeError(
            f"--split-n: expected a width the single tile serves, 1-{fp8.FP8_SINGLE_TILE_MAX_N}, "
            f"got {n}")  # fmt: skip
    return n


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m impls.triton_rmsnorm.fp8_tune",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="table file (default: the committed one of this GPU class)")  # fmt: skip
    p.add_argument("--scalings", nargs="+", default=list(fp8_table.SCALINGS),
                   choices=fp8_table.SCALINGS)  # fmt: skip
    p.add_argument("--itemsizes", nargs="+", type=int, default=[2], choices=[2, 4],
                   help="x's element size: 2 (bf16 and fp16 share entries; the default) or "
                   "4 (fp32)")  # fmt: skip
    p.add_argument("--block-n", nargs="+", type=int, default=list(BLOCK_NS), choices=BLOCK_NS)
    p.add_argument("--split-n", nargs="+", type=_single_tile_width, default=None, metavar="N",
                   help="widths whose split tiles to tune instead of the padded tiles (above)")  # fmt: skip
    p.add_argument("--elements", type=int, default=1 << 24, help="M x N of each timing")
    p.add_argument("--budget-s", type=float, default=None, help="start no width after this")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_tune times kernels on a CUDA GPU; none is visible here.", file=sys.stderr)
        return 1
    if args.elements < 1:
        print(f"--elements: expected a positive count, got {args.elements}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0)
    out = args.out or fp8_table.committed_path(name)
    entries = fp8_table.load(out) if out.exists() else {}
    made_with = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                 "elements": args.elements, "command": " ".join(sys.argv)}  # fmt: skip
    stream = dispatch.private_stream(0)
    started = time.monotonic()
    if args.split_n is not None:
        return _tune_splits(args, name, out, entries, made_with, stream, started)
    for scaling in args.scalings:
        for itemsize in args.itemsizes:
            for block_n in args.block_n:
                if (scaling, block_n, itemsize, 0) in entries:
                    continue
                if args.budget_s is not None and time.monotonic() - started > args.budget_s:
                    print("budget spent: the table holds what was tuned", flush=True)
                    return 0
                entry = tune_width(scaling, block_n, itemsize, args.elements, stream)
                entries[entry.key] = entry
                fp8_table.save(out, name, entries.values(), made_with)
                print(f"{scaling:<10} N={block_n:<6} itemsize {itemsize}: BLOCK_M "
                      f"{entry.block_m:<3} warps {entry.num_warps:<2} {entry.us:8.2f} us",
                      flush=True)  # fmt: skip
    return 0


def _tune_splits(args, name, out, entries, made_with, stream, started) -> int:
    device = torch.device("cuda", 0)
    for scaling in args.scalings:
        for itemsize in args.itemsizes:
            for n in args.split_n:
                block_n, tail_n = fp8.fp8_tiles(n, scaling, split=True)
                if not tail_n or (scaling, block_n, itemsize, tail_n) in entries:
                    continue  # no split with fewer columns, or tuned already
                if args.budget_s is not None and time.monotonic() - started > args.budget_s:
                    print("budget spent: the table holds what was tuned", flush=True)
                    return 0
                padded_tiles = fp8.fp8_tiles(block_n + tail_n, scaling)
                tabled = entries.get((scaling, padded_tiles[0], itemsize, 0))
                padded = (tabled.config if tabled is not None else
                          fp8.fp8_launch_config(block_n + tail_n, scaling, itemsize, device))  # fmt: skip
                entry = tune_width(scaling, block_n, itemsize, args.elements, stream, tail_n,
                                   padded)  # fmt: skip
                where = f"{scaling:<10} N={block_n}+{tail_n} itemsize {itemsize}"
                if entry is None:
                    print(f"{where}: not faster than the padded tile; no entry", flush=True)
                    continue
                entries[entry.key] = entry
                fp8_table.save(out, name, entries.values(), made_with)
                print(f"{where}: BLOCK_M {entry.block_m:<3} warps {entry.num_warps:<2} "
                      f"{entry.us:8.2f} us (padded {entry.padded_us:8.2f})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
