"""Result files: JSON lines, one record per line, written as rows finish.

Line 1: {"kind": "provenance", ...}; then {"kind": "ceiling", ...}; then {"kind": "row", ...};
last, once every row is in, {"kind": "complete", "rows": N}. An interrupted run keeps every row
it finished and has no "complete" record, so ``load`` can say it is partial (files written
before completion records existed carry no "format" in their provenance: unknown). A file is
never overwritten: a new name is chosen when the target exists. ``load`` also reads
pytest-benchmark's JSON (--benchmark-json).

Where runs go by default: a per-user directory outside the checkout (:func:`default_root`), so
a run never litters the working tree or depends on the current directory, and no measurement
is lost for want of --out. Results meant for the repository are written with --out.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: Provenance "format" of files that end with a "complete" record.
FORMAT = 2


def default_root() -> Path:
    """$RMSNORM_BENCH_RESULTS, else $XDG_CACHE_HOME/rmsnorm-bench/results, else
    ~/.cache/rmsnorm-bench/results."""
    if os.environ.get("RMSNORM_BENCH_RESULTS"):
        return Path(os.environ["RMSNORM_BENCH_RESULTS"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "rmsnorm-bench" / "results"


def gpu_slug(provenance: dict) -> str:
    gpu = provenance.get("gpu") or "cpu"
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def default_path(provenance: dict, root: str | Path | None = None) -> Path:
    day = provenance["date"][:10]
    commit = provenance.get("commit") or "nogit"
    root = default_root() if root is None else Path(root)
    return root / gpu_slug(provenance) / f"{day}-{commit}.jsonl"


def result_files(path: str | Path) -> list[Path]:
    """The results files a --from argument names: the file itself, or a directory's *.jsonl
    files in name order. Raises ValueError (missing path, empty directory)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise ValueError(f"{path}: a directory without results files (*.jsonl)")
        return files
    if not path.is_file():
        raise ValueError(f"{path}: no such file or directory")
    return [path]


def fresh_path(path: Path) -> Path:
    """path itself if free, else path with -2, -3, ... before the suffix."""
    if not path.exists():
        return path
    for i in range(2, 1000):
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise FileExistsError(f"out: no free name next to {path}")


def rewrite(path: Path, records: list[dict]) -> None:
    """path's content replaced by records, one JSON line each, atomically (a staged file
    renamed over it): a resumed run's kept records, before it appends the rest."""
    staged = path.with_name(path.name + ".resuming")
    staged.write_text("".join(json.dumps(r, default=str) + "\n" for r in records), "utf-8")
    os.replace(staged, path)


class ResultWriter:
    def __init__(self, path: Path, append: bool = False) -> None:
        """A new file (never overwriting one), or with append an existing one: a resumed run
        (harness.compare --resume) goes on after the rows it kept."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # "x": never overwrite
        self._file = open(path, "a" if append else "x", encoding="utf-8")  # noqa: SIM115

        self.rows = 0

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.rows += record.get("kind") == "row"

    def finish(self) -> None:
        """Mark the file complete (every row is in) and close it."""
        self.write({"kind": "complete", "rows": self.rows})
        self.close()

    def close(self) -> None:
        self._file.close()


def json_lines(text: str, path: str | Path) -> tuple[list[dict], int | None]:
    """The records of a JSON-lines file's text, and the number of a last line whose write was
    cut short (not JSON, no newline after it: the process killed mid-line), which is left
    out; None when there is none. A line that is not JSON anywhere else raises ValueError."""
    lines = text.splitlines()
    records, cut_line = [], None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                cut_line = number
                continue
            raise ValueError(f"{path}:{number}: not a JSON record ({exc})") from exc
    return records, cut_line


def load(path: str | Path) -> tuple[dict, dict, list[dict]]:
    """(provenance, ceiling, rows) from a results file or a pytest-benchmark JSON file.

    provenance["complete"]: True when the run finished, False when it was interrupted (a
    format-2 file without its "complete" record), None when the file cannot tell. A last line
    that is not JSON and has no newline after it is a record whose write was cut short (the
    process killed mid-line, by a time limit, say): it is left out, and provenance["cut_line"]
    names its line; a line that is not JSON anywhere else is an error."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # JSON lines: one record per line
    if isinstance(whole, dict) and "benchmarks" in whole:
        return _from_pytest_benchmark(whole)
    if whole is not None and not (isinstance(whole, dict) and "kind" in whole):
        raise ValueError(
            f"{path}: JSON, but neither results (JSON lines) nor pytest-benchmark JSON"
        )
    provenance, ceiling, rows = {}, {}, []
    complete = None
    records, cut_line = json_lines(text, path)
    for record in records:
        kind = record.pop("kind", "row")
        if kind == "provenance":
            provenance = record
        elif kind == "ceiling":
            ceiling = record
        elif kind == "complete":
            complete = record
        else:
            rows.append(record)
    if complete is not None:
        provenance["complete"] = complete.get("rows") == len(rows)
    else:
        provenance["complete"] = False if provenance.get("format", 1) >= FORMAT else None
    if cut_line is not None:
        provenance["cut_line"] = cut_line
    return provenance, ceiling, rows


def _from_pytest_benchmark(data: dict) -> tuple[dict, dict, list[dict]]:
    """Rows from pytest-benchmark's JSON: timings are its host-side wall clock ("pytest")."""
    machine = data.get("machine_info", {})
    provenance = {"date": data.get("datetime"), "commit": (data.get("commit_info") or {}).get("id"),
                  "gpu": (data.get("benchmarks") or [{}])[0].get("extra_info", {}).get("gpu"),
                  "python": machine.get("python_version"), "source": "pytest-benchmark",
                  "complete": None}  # fmt: skip
    first = (data.get("benchmarks") or [{}])[0].get("extra_info", {})
    versions = {p: first[p] for p in ("torch", "triton") if first.get(p)}
    if versions:  # benchmark files written before tests/bench_backends.py recorded them have none
        provenance["versions"] = versions
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
