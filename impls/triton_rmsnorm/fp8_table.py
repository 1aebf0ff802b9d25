"""rmsnorm_fp8's launch table: per GPU class, the single-tile fp8 kernel's BLOCK_M and num_warps
for each (scaling, tile width, x's element size, tail tile width), chosen ahead of time by
`python -m impls.triton_rmsnorm.fp8_tune` and read by every call, which times nothing.

One JSON file per GPU class, `tables/fp8/<gpu slug>.json` (dispatch_table.gpu_slug):

    {"format": "rmsnorm-fp8-launch-table/1", "gpu": "NVIDIA H200", "made_with": {...},
     "entries": [
      {"scaling": "block", "block_n": 4096, "itemsize": 2, "BLOCK_M": 2, "num_warps": 8,
       "measured_at": [16384, 4096], "us": 41.2},
      ...]}

one entry per line, sorted. A call's tile width is fp8.fp8_block_n(N, scaling); a width with no
entry (or a GPU with no file) takes the heuristic (fp8.fp8_launch_config). An entry with a
"tail_n" (> 0) is a split tile (fp8.fp8_tiles: a power-of-two tile and a tail tile in place of
one padded tile), written by `fp8_tune --split-n` only where it timed faster than the padded
tile at that width; a call whose split tiles have an entry takes them (fp8.choose_tiles). The
configuration and tiles do not depend on M, so a row's codes and scale are the same whatever M
(only the grid changes with M).
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from pathlib import Path
from typing import NamedTuple

from .dispatch_table import TABLES_DIR, gpu_slug, write_atomically

FORMAT = "rmsnorm-fp8-launch-table/1"
#: A table holding split entries (tail_n): a reader of /1 only refuses it (the heuristic serves)
#: rather than taking a split entry's configuration for the padded tile of the same BLOCK_N.
SPLIT_FORMAT = "rmsnorm-fp8-launch-table/2"
FP8_TABLES_DIR = TABLES_DIR / "fp8"
SCALINGS = ("per_token", "per_tensor", "block")


class Fp8Entry(NamedTuple):
    scaling: str
    block_n: int
    itemsize: int
    block_m: int
    num_warps: int
    measured_at: tuple[int, int]  # (M, N) the configuration was timed at
    us: float  # its device-only time there
    tail_n: int = 0  # > 0: a split tile, BLOCK_N columns then a tail tile of tail_n
    padded_us: float | None = None  # a split entry: the padded tile's time at the same (M, N)

    @property
    def key(self) -> tuple[str, int, int, int]:
        return self.scaling, self.block_n, self.itemsize, self.tail_n

    @property
    def config(self) -> dict:
        return {"BLOCK_M": self.block_m, "num_warps": self.num_warps}

    def to_json(self) -> dict:
        item = {"scaling": self.scaling, "block_n": self.block_n, "itemsize": self.itemsize,
                "BLOCK_M": self.block_m, "num_warps": self.num_warps,
                "measured_at": list(self.measured_at), "us": round(self.us, 3)}  # fmt: skip
        if self.tail_n:
            item["tail_n"] = self.tail_n
            if self.padded_us is not None:
                item["padded_us"] = round(self.padded_us, 3)
        return item

    @classmethod
    def from_json(cls, item: dict, where: str) -> Fp8Entry:
        try:
            padded_us = item.get("padded_us")
            entry = cls(item["scaling"], item["block_n"], item["itemsize"], item["BLOCK_M"],
                        item["num_warps"], tuple(item["measured_at"]), float(item["us"]),
                        item.get("tail_n", 0), None if padded_us is None else float(padded_us))  # fmt: skip
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where}: entry {item!r} lacks or mistypes {error}") from None
        if entry.scaling not in SCALINGS:
            raise ValueError(f"{where}: scaling expected one of {SCALINGS}, got {entry.scaling!r}")
        for name in ("block_n", "itemsize", "block_m", "num_warps"):
            value = getattr(entry, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{where}: {name} expected a power of two, got {value!r}")
        tail = entry.tail_n
        smallest = 128 if entry.scaling == "block" else 1  # a whole group of block scales
        bad = not isinstance(tail, int) or tail < 0 or tail & (tail - 1) or tail >= entry.block_n
        if bad or 0 < tail < smallest:
            raise ValueError(f"{where}: tail_n expected 0 or a power of two below block_n "
                             f"({smallest} at least per block), got {tail!r}")  # fmt: skip
        return entry


def load(path: str | os.PathLike) -> dict[tuple[str, int, int, int], Fp8Entry]:
    """A table file's entries by key; ValueError naming the file when it is not one."""
    where = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, SPLIT_FORMAT):
        raise ValueError(f"{where}: expected format {FORMAT!r} or {SPLIT_FORMAT!r}")
    entries = [Fp8Entry.from_json(item, where) for item in data.get("entries", [])]
    return {e.key: e for e in entries}


def save(path: str | os.PathLike, gpu: str, entries, made_with: dict) -> None:
    """Write the table atomically (dispatch_table.write_atomically), one entry per line, sorted
    by key."""
    entries = sorted(entries, key=lambda e: e.key)
    rows = [json.dumps(e.to_json(), sort_keys=True) for e in entries]
    fmt = SPLIT_FORMAT if any(e.tail_n for e in entries) else FORMAT  # (SPLIT_FORMAT's note)
    head = json.dumps({"format": fmt, "gpu": gpu, "made_with": made_with})[:-1]
    write_atomically(path, head + ', "entries": [\n' + ",\n".join(rows) + "\n]}\n")


def committed_path(device_name: str) -> Path:
    return FP8_TABLES_DIR / f"{gpu_slug(device_name)}.json"


@functools.cache
def committed(device_name: str) -> dict[tuple[str, int, int, int], Fp8Entry]:
    """The committed table of this GPU class, or {} where there is none; a broken file is
    reported and skipped (the heuristic serves: it never takes a call down)."""
    path = committed_path(device_name)
    if not path.exists():
        return {}
    try:
        return load(path)
    except (OSError, ValueError) as error:
        warnings.warn(f"rmsnorm_fp8: launch table skipped ({error})", RuntimeWarning, stacklevel=2)
        return {}
