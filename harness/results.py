"""Result files: JSON lines, one record per line, written as rows finish.

Line 1: {"kind": "provenance", ...}; then {"kind": "ceiling", ...}; then {"kind": "row", ...}.
An interrupted run keeps every row it finished. A file is never overwritten: a new name is
chosen when the target exists. ``load`` also reads pytest-benchmark's JSON (--benchmark-json).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def default_path(provenance: dict, root: str = "results") -> Path:
    gpu = provenance.get("gpu") or "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    day = provenance["date"][:10]
    commit = provenance.get("commit") or "nogit"
    return Path(root) / slug / f"{day}-{commit}.jsonl"


def fresh_path(path: Path) -> Path:
    """path itself if free, else path with -2, -3, ... before the suffix."""
    if not path.exists():
        return path
    for i in range(2, 1000):
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise FileExistsError(f"out: no free name next to {path}")


class ResultWriter:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "x", encoding="utf-8")  # noqa: SIM115  ("x": never overwrite)

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def load(path: str | Path) -> tuple[dict, dict, list[dict]]:
    """(provenance, ceiling, rows) from a results file or a pytest-benchmark JSON file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # JSON lines: one record per line
    if isinstance(whole, dict) and "benchmarks" in whole:
        return _from_pytest_benchmark(whole)
    provenance, ceiling, rows = {}, {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON record ({exc})") from exc
        kind = record.pop("kind", "row")
        if kind == "provenance":
            provenance = record
        elif kind == "ceiling":
            ceiling = record
        else:
            rows.append(record)
    return provenance, ceiling, rows


def _from_pytest_benchmark(data: dict) -> tuple[dict, dict, list[dict]]:
    """Rows from pytest-benchmark's JSON: timings are its host-side wall clock ("pytest")."""
    machine = data.get("machine_info", {})
    provenance = {"date": data.get("datetime"), "commit": (data.get("commit_info") or {}).get("id"),
                  "gpu": (data.get("benchmarks") or [{}])[0].get("extra_info", {}).get("gpu"),
                  "python": machine.get("python_version"), "source": "pytest-benchmark"}  # fmt: skip
    rows = []
    for bench in data.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "backend" not in info:
            continue
        ms = bench["stats"]["median"] * 1e3
        # pytest-benchmark keeps quartiles, not p20/p80: stored under their own names
        rows.append({**info, "timing": "pytest", "status": "ok", "ms": ms,
                     "q1": bench["stats"].get("q1", ms / 1e3) * 1e3,
                     "q3": bench["stats"].get("q3", ms / 1e3) * 1e3,
                     "gbps": info["bytes"] / (ms * 1e-3) / 1e9})  # fmt: skip
    return provenance, {}, rows
