"""Small helpers over long-format result rows (harness.run writes them): which op, mode and
timing a row is, and the statistics and cell format every view of them uses."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from impls import OPS

#: The order timings are shown in.
TIMING_ORDER = ("device", "host", "pytest")


def op_of(row: dict) -> str:
    return row.get("op", "rmsnorm")  # files from before add_rmsnorm have no op field


def ops_in(rows: list[dict]) -> list[str]:
    return sorted({op_of(r) for r in rows}, key=OPS.index)


def timings_of(rows: list[dict], mode: str) -> list[str]:
    return sorted({r["timing"] for r in rows if r["mode"] == mode}, key=TIMING_ORDER.index)


def select(rows: list[dict], mode: str, timing: str, op: str) -> list[dict]:
    return [r for r in rows if r["mode"] == mode and r["timing"] == timing and op_of(r) == op]


def geomean(values: Iterable[float]) -> float | None:
    """Over the positive values; None when there are none."""
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def fmt(value, spec: str) -> str:
    """A table cell: '-' for a value not measured."""
    return "-" if value is None else format(value, spec)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(text: str | None, limit: int = 200) -> str:
    """What an error or oracle detail says, on one line: its first non-empty line, without
    terminal colour codes; one that only names the error ("CUDADialectError:") is joined with
    the line after it. "" for no text."""
    lines = [line.strip() for line in _ANSI.sub("", text or "").splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines[0] = f"{lines[0]} {lines[1]}"
    return lines[0][:limit] if lines else ""
