"""The dispatch table: which path and which launch configurations serve a call, decided ahead
of time (by `python -m impls.triton_rmsnorm.tune`, or by opt-in runtime tuning) and read by
every later call, which then times nothing. This module owns the format and the lookup; the
offline tuner, the runtime tuning cache and the launcher all go through it.

A table is one JSON file per GPU class, named by its slug (`gpu_slug`: the device name,
lower-case, runs of other characters turned into '-': "NVIDIA H200" -> "nvidia-h200"):

    {"format": "rmsnorm-dispatch-table/1", "gpu": "NVIDIA H200", "made_with": {...},
     "entries": [
      {"direction": "fwd", "dtypes": ["bfloat16", "bfloat16", "bfloat16"], "residual": false,
       "n": 4096, "m": 512, "path": "single_tile",
       "configs": {"rmsnorm_fwd_kernel": {"BLOCK_M": 2, "PROGRAMS_PER_SM": 0, ...}}},
      ...]}

one entry per line, sorted, so a diff shows each decision that changed. An entry's key:
- direction: "fwd" or "bwd";
- dtypes: the forward's (x, weight, y), the backward's (x, weight, dy, dh) with dh = dy's dtype
  when there is no dh_out;
- residual: the forward has a residual add / the backward a dh_out;
- n: the hidden size; m: the rows.
Its value: the path's name (dispatch.path_name: "single_tile", "looped", "held_row(warps=16)",
...) and the launch configuration of each tuned kernel the path launched (launch keywords, as
launch.take_launch_configs reports them).

A call (direction, dtypes, residual, N, M) maps to an entry thus (`Table.lookup`):
1. only entries with the same direction, dtypes and residual, and the same padded tile width
   next_power_of_2(n) (the single-tile kernels' BLOCK_N: entries of one padded width share
   their kernels' configuration space), count; none: no entry (the heuristic serves the call);
2. of those, the n nearest N in log space (ties: the larger n);
3. of that n's entries, the m nearest M's class in log space, M's class being 2**floor(log2 M)
   (M's bit length, as the kernels' own ROWS_BUCKET; ties: the larger m).
An entry whose path is not offered for the call (a condition on alignment or device failed),
or whose configuration is not among the kernel's candidates there, is not used: the heuristic
serves that part of the call (launch.py). An entry's configuration is launched as it is, but
for one rule: the plain single-tile forward takes one row a tile where the entry's tiles would
fill fewer programs than SMs and that cannot change a row's bits (configs.one_row_tiles).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch

FORMAT = "rmsnorm-dispatch-table/1"
DIRECTIONS = ("fwd", "bwd")
#: Where the committed tables live (package data: pyproject.toml ships tables/*.json).
TABLES_DIR = Path(__file__).with_name("tables")

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float16, torch.bfloat16, torch.float32)}


def gpu_slug(device_name: str) -> str:
    """The table's file stem for a GPU: "NVIDIA H200" -> "nvidia-h200"."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if not slug:
        raise ValueError(
            f"device_name: expected a GPU name with letters or digits, got {device_name!r}"
        )
    return slug


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {name!r}") from None


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def m_class(m: int) -> int:
    """M's class: 2**floor(log2 M) (M >= 1)."""
    return 1 << (m.bit_length() - 1)


class Key(NamedTuple):
    """What selects an entry family: the call's direction, dtypes (names) and residual."""

    direction: str
    dtypes: tuple[str, ...]
    residual: bool


class Entry(NamedTuple):
    key: Key
    n: int
    m: int
    path: str
    configs: dict  # kernel name -> launch keywords

    def configs_text(self) -> str:
        """The configurations in short: "fwd:BLOCK_N=4096,num_warps=8 ..." (kernel names
        without rmsnorm_ and _kernel)."""
        parts = []
        for kernel, config in self.configs.items():
            kernel = kernel.removeprefix("rmsnorm_").removesuffix("_kernel")
            parts.append(kernel + ":" + ",".join(f"{k}={v}" for k, v in config.items()))
        return " ".join(parts)

    def to_json(self) -> dict:
        return {
            "direction": self.key.direction,
            "dtypes": list(self.key.dtypes),
            "residual": self.key.residual,
            "n": self.n,
            "m": self.m,
            "path": self.path,
            "configs": {k: dict(sorted(v.items())) for k, v in sorted(self.configs.items())},
        }

    @classmethod
    def from_json(cls, item: dict, where: str) -> Entry:
        try:
            direction, dtypes = item["direction"], tuple(item["dtypes"])
            residual, n, m = item["residual"], item["n"], item["m"]
            path, configs = item["path"], item["configs"]
        except (KeyError, TypeError) as error:
            raise ValueError(f"{where}: entry {item!r} lacks {error}") from None
        if direction not in DIRECTIONS:
            raise ValueError(f"{where}: direction expected one of {DIRECTIONS}, got {direction!r}")
        for name in dtypes:
            if name not in _DTYPES:
                raise ValueError(f"{where}: dtype expected one of {sorted(_DTYPES)}, got {name!r}")
        if len(dtypes) != (3 if direction == "fwd" else 4):
            raise ValueError(
                f"{where}: {direction} entry needs {3 if direction == 'fwd' else 4} dtypes, got {dtypes}"
            )
        for name, value in (("n", n), ("m", m)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} expected an integer >= 1, got {value!r}")
        if not isinstance(path, str) or not isinstance(configs, dict):
            raise ValueError(f"{where}: path must be a string and configs an object, got {item!r}")
        return cls(Key(direction, dtypes, bool(residual)), n, m, path, configs)


class Table:
    """Entries indexed for lookup. Later entries with an existing (key, n, m) replace it."""

    def __init__(self, entries: Iterable[Entry] = (), meta: dict | None = None):
        self.meta = dict(meta or {})
        self._entries: dict[tuple, Entry] = {}
        self._index: dict[tuple, dict[int, dict[int, Entry]]] | None = None
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        self._entries[(entry.key, entry.n, entry.m)] = entry
        self._index = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: tuple) -> bool:
        """(key, n, m) has an entry of its own."""
        return item in self._entries

    def entries(self) -> list[Entry]:
        return [self._entries[k] for k in sorted(self._entries, key=_sort_key)]

    def merged(self, over: Table) -> Table:
        """This table with `over`'s entries added (replacing this one's at the same point)."""
        return Table([*self._entries.values(), *over._entries.values()], {**self.meta, **over.meta})

    def lookup(self, key: Key, n: int, m: int) -> Entry | None:
        """The entry that serves (key, n, m), by the rule in the module docstring."""
        if self._index is None:
            index: dict = {}
            for entry in self._entries.values():
                family = index.setdefault((entry.key, next_power_of_2(entry.n)), {})
                family.setdefault(entry.n, {})[entry.m] = entry
            self._index = index
        family = self._index.get((key, next_power_of_2(n)))
        if not family:
            return None
        rows = family[_nearest(family, math.log2(n))]
        return rows[_nearest(rows, float(m.bit_length() - 1))]

    # ---- files ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> Table:
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{where}: expected a JSON object with format {FORMAT!r}")
        entries = data.get("entries")
        if not isinstance(entries, list):
            raise ValueError(f"{where}: expected a list under 'entries'")
        meta = {k: v for k, v in data.items() if k not in ("format", "entries")}
        return cls((Entry.from_json(item, where) for item in entries), meta)

    def dumps(self) -> str:
        head = {"format": FORMAT, **self.meta}
        lines = [json.dumps(e.to_json(), separators=(", ", ": ")) for e in self.entries()]
        text = json.dumps(head, indent=1)[:-2]  # the header's members, left open
        body = ",\n  ".join(lines)
        return (
            f'{text},\n "entries": [\n  {body}\n ]\n}}\n'
            if lines
            else f'{text},\n "entries": []\n}}\n'
        )

    def save(self, path: str | os.PathLike) -> None:
        write_atomically(path, self.dumps())


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write a table file atomically (a temporary file in the same folder, then renamed): a
    reader never sees half a table, and concurrent writers leave one of their tables whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _nearest(points: dict[int, object], log_value: float) -> int:
    """The point whose log2 is nearest log_value (ties: the larger point)."""
    return min(points, key=lambda p: (abs(math.log2(p) - log_value), -p))


def _sort_key(item: tuple) -> tuple:
    key, n, m = item
    return (key.direction, key.dtypes, key.residual, n, m)


def committed_table_path(device_name: str) -> Path:
    return TABLES_DIR / f"{gpu_slug(device_name)}.json"
