"""Small helpers over long-format result rows (harness.run writes them): which op, mode and
timing a row is, and the statistics and cell format every view of them uses."""

from __future__ import annotations

import math
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
