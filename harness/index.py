"""The index of a GPU's current runs (results/<gpu>/INDEX.md): a markdown table, one line per
run, ``| run | file | plot | what |``. A run's number is its line in the table: the results page
(harness.page) and harness.compare --from number runs so, and the docs cite them by it."""

from __future__ import annotations

from pathlib import Path

#: Columns every index must have (more may follow; they are shown in the runs table).
INDEX_COLUMNS = ("run", "file", "plot", "what")


def read_index(path: Path) -> list[dict]:
    """The index's table rows as dicts keyed by its (lower-cased) header; paths resolved against
    the index's folder. Raises ValueError naming the file when the table or a column is missing."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 2:
        raise ValueError(f"index {path}: expected a markdown table '| run | file | plot | what |'")
    header = [cell.strip().lower() for cell in table[0].strip("|").split("|")]
    missing = [c for c in INDEX_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"index {path}: table lacks column(s) {missing}; has {header}")
    rows = []
    for line in table[2:]:
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        if len(cells) != len(header):
            raise ValueError(
                f"index {path}: row {line!r} has {len(cells)} cells, header {len(header)}"
            )
        row = dict(zip(header, cells, strict=True))
        row["path"] = path.parent / row["file"]
        row["plot_path"] = path.parent / row["plot"] if row["plot"] not in ("", "-") else None
        if not row["path"].exists():
            raise ValueError(f"index {path}: {row['run']}: file {row['path']} does not exist")
        rows.append(row)
    return rows


def run_numbers(files: list[Path]) -> dict[Path, tuple[int, str]]:
    """{resolved file: (its line in the INDEX.md that lists it, the run's name)} for the files an
    index lists: the run numbers of results/README.md. The index looked in is the file's
    folder's or the one above it (a run kept under probes/)."""
    numbers: dict[Path, tuple[int, str]] = {}
    for index in {d / "INDEX.md" for f in files for d in (f.parent, f.parent.parent)}:
        if not index.is_file():
            continue
        try:
            entries = read_index(index)
        except (OSError, ValueError):  # an index that does not parse numbers nothing
            continue
        for i, entry in enumerate(entries, 1):
            numbers[entry["path"].resolve()] = (i, entry["run"])
    return numbers


def folder_runs(folder: Path) -> list[Path]:
    """A results folder's runs: the .jsonl files its INDEX.md lists (under probes/ too), in the
    index's order, then the folder's other *.jsonl (a run copied in, not yet indexed) by name.
    An index that is missing or does not parse leaves the folder's own files."""
    listed: list[Path] = []
    index = folder / "INDEX.md"
    if index.is_file():
        try:
            listed = [row["path"] for row in read_index(index)]
        except (OSError, ValueError):
            listed = []
    found = {p.resolve(): p for p in [*listed, *sorted(folder.glob("*.jsonl"))]
             if p.suffix == ".jsonl" and p.is_file()}  # fmt: skip
    return list(found.values())
