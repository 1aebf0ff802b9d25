"""python -m harness.page: the results page (results/README.md) from a GPU's index of current runs.

The index (e.g. results/nvidia-h200/INDEX.md) is a markdown table, one line per current run:
``| run | file | plot | what |``. A file ending in .jsonl is a harness.compare run: the results
page shows its plot and ours against the fastest peer, and a page of its own (runs/<run>.md
beside the index) its ranked tables, its costs and what was not measured; a harness.overhead
JSON gets a page with its host-overhead table; any other file (a probe's output, a GPU test
log) is listed on the page of probes and logs (runs/probes-and-logs.md), numbered as the rest.
Adding a current run is one line in the index; superseded files move to the index's archive/
folder (its run page goes when the index stops listing it).

Per-shape tables come from ``python -m harness.compare --from <file> --per-shape``. The per-target status is the
"In short" block of the targets file beside the index (targets.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness import cost_tables, plots
from harness.index import INDEX_COLUMNS, read_index
from harness.rows import fmt, op_of, ops_in, timings_of


def in_short(targets: Path) -> str:
    """The targets file's "**In short**" block (up to the next bold paragraph or table)."""
    if not targets.exists():
        return ""
    lines = targets.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("**In short**")), None)
    if start is None:
        return ""
    end = start + 1
    while end < len(lines) and not (lines[end].startswith("**") or lines[end].startswith("|")):
        end += 1
    return "\n".join(lines[start:end]).strip()


def _table(headers: list[str], body: list[list]) -> str:
    """A markdown table without column padding (the page's size is its cells)."""
    row = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"  # noqa: E731
    return "\n".join([row(headers), row(["---"] * len(headers)), *(row(line) for line in body)])


def _short(reason: str) -> str:
    """A not-run reason's status and first clause ("unavailable: X is not installed"); the
    whole text is in the results file and in `harness.compare --from`."""
    return ": ".join(reason.split(": ")[:2]).split(" (")[0]


def mode_table(rows: list[dict], mode: str, op: str) -> str:
    """One line per backend of op: device-only and host-inclusive geomean GB/s over the cases
    every ranked backend ran, each timing's rank, % of the copy ceiling and the oracle's verdict
    (device-only order; a backend only timed host-inclusive follows)."""
    from harness import report

    timings = timings_of([r for r in rows if op_of(r) == op], mode)
    rankings = {t: {e["backend"]: e for e in report.ranking(rows, mode, t, op)} for t in timings}
    order = list(dict.fromkeys(b for t in timings for b in rankings[t]))
    headers = ["backend", "cases"]
    for t in timings:
        headers += [f"{t} rank", f"{t} GB/s"] + (["% ceiling"] if t == "device" else [])
    headers += ["err/bound", "oracle"]
    body = []
    for backend in order:
        if all(rankings[t].get(backend, {}).get("rank") in (None, "-") for t in timings):
            continue  # nothing timed: the "Not measured" line says why
        first = next(rankings[t][backend] for t in timings if backend in rankings[t])
        line = [backend, first["cases"]]
        for t in timings:
            e = rankings[t].get(backend)
            ceiling = t == "device"
            if e is None:
                line += ["", ""] + ([""] if ceiling else [])
                continue
            gbps = e["common_geomean_gbps"] if e["common_cases"] else e["geomean_gbps"]
            line += [e["rank"], fmt(gbps, ".0f")]
            line += [fmt(e["geomean_pct_ceiling"], ".1f")] if ceiling else []
        verdict = first["oracle"] + (" SUSPECT" if first["suspect"] else "")
        line += [fmt(first["worst_bound_use"], ".2f"), verdict]
        body.append(line)
    notes = sorted({f"{e['backend']}: {_short(n)}" for t in timings
                    for e in rankings[t].values() for n in e["not_run"]})  # fmt: skip
    failed = list(dict.fromkeys(f"{e['backend']}: {n}" for t in timings
                                for e in rankings[t].values() for n in report.shown_failures(e)))  # fmt: skip
    text = _table(headers, body)
    text += "\n\nNot measured: " + "; ".join(notes) if notes else ""
    return text + ("\n\nWhy FAIL: " + "; ".join(failed) if failed else "")


def costs_table(rows: list[dict], op: str) -> str:
    """The cost columns a run measured (harness.costs; none: ""), one line a backend, forward
    and backward side by side: median host us a call, first call seconds (cold and warm
    caches), batch invariance and cross-process determinism. `harness.compare --from` shows
    each with its case counts and the first call's extra memory."""

    modes = [m for m in ("fwd", "bwd") if cost_tables.has_costs(rows, op, m)]
    if not modes:
        return ""
    entries = {m: {e["backend"]: e for e in cost_tables.cost_entries(rows, op, m)} for m in modes}
    columns = [
        ("host us", "host_us", ".1f"),
        ("first s cold/warm", None, None),
        ("batch-invariant", "batch", None),
        ("deterministic", "deterministic", None),
    ]
    shown = [c for c in columns if any(_cost_cell(e, c) != "-" for m in modes
                                       for e in entries[m].values())]  # fmt: skip
    headers = ["backend"] + [f"{m} {c[0]}" for c in shown for m in modes]
    body = []
    for backend in dict.fromkeys(b for m in modes for b in entries[m]):
        cells = [_cost_cell(entries[m].get(backend), c) for c in shown for m in modes]
        if any(cell != "-" for cell in cells):
            body.append([backend, *cells])
    return _table(headers, body) if body else ""


def _cost_cell(entry: dict | None, column: tuple) -> str:
    if entry is None:
        return "-"
    _title, field, spec = column
    if field is None:  # first call: cold/warm seconds
        cold, warm = entry["first_cold_s"], entry["first_warm_s"]
        return "-" if cold is None else f"{cold:.2f}/{fmt(warm, '.2f')}"
    value = entry[field]
    if spec is not None:
        return fmt(value, spec)
    return str(value).split(" (")[0]  # yes / no / -: the counts are in compare --from


def json_tables(path: Path) -> list[str] | None:
    """The tables of a JSON the index names: a harness.host_cost grid (it has "bars"), a
    harness.ncu_bytes file (records with the model's bytes), a harness.first_call JSON or a
    harness.overhead record (rows per backend and mode); None for any other JSON (listed
    only)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if "bars" in data:
        return [host_cost_table(data)]
    records = data.get("records") if isinstance(data, dict) else None
    if records and all("model_bytes" in r for r in records):
        from harness.cost_tables import NCU_HEADERS, NCU_NOTE, ncu_rows

        return [f"{NCU_NOTE}\n\n{_table(NCU_HEADERS, ncu_rows(records))}"]
    rows = data.get("rows") if isinstance(data, dict) else None
    if rows and all("first_s" in r for r in rows):
        return [first_call_table(rows)]
    if rows and all("backend" in r and "mode" in r for r in rows):
        return [overhead_table(path)]
    return None


def first_call_table(rows: list[dict]) -> str:
    """A harness.first_call JSON: each shape's first call and a steady one, per cache state."""
    mib = lambda b: fmt(None if b is None else b / 2**20, ".1f")  # noqa: E731
    body = [[f"{r['m']}x{r['n']}", r["dtype"].removeprefix("torch."), r["backend"], r["cache"],
             fmt(r.get("process_first_s"), ".2f"), fmt(r.get("first_s"), ".3f"),
             fmt(None if r.get("steady_s") is None else 1e3 * r["steady_s"], ".3f"),
             mib(r.get("first_extra_bytes")), mib(r.get("steady_extra_bytes"))]
            for r in rows]  # fmt: skip
    head = ("First calls (`python -m harness.first_call`): in a fresh process, a warm-up call "
            "at another shape class (the process's first), then the shape's first "
            "forward+backward and steady ones; memory above the inputs:\n\n")  # fmt: skip
    headers = ["shape", "dtype", "backend", "caches", "process's first s", "shape's first s",
               "steady ms", "first MiB", "steady MiB"]  # fmt: skip
    return head + _table(headers, body)


def host_cost_table(data: dict) -> str:
    """A harness.host_cost JSON: its summary against the bars, then every case."""
    body = [[r["dtype"], f"{r['m']}x{r['n']}", r["mode"], r.get("host_path", "python"),
             fmt(r.get("ours_us"), ".1f"), fmt(r.get("torch_us"), ".1f"),
             fmt(r.get("ratio"), ".2f"),
             {True: "yes", False: "no"}.get(r.get("met"), "-")] for r in data["rows"]]  # fmt: skip
    head = ("Host µs a call, ours against torch.nn.functional.rms_norm, the GPU kept busy "
            "(`python -m harness.host_cost`; nograd: the forward under torch.no_grad, fwd_bwd: "
            "forward and torch.autograd.grad):\n\n")  # fmt: skip
    return (head + data.get("summary", "") + "\n\n"
            + _table(["dtype", "shape", "call", "our host path", "ours µs", "torch µs",
                      "ours / torch", "met"], body))  # fmt: skip


def overhead_table(path: Path) -> str:
    """A harness.overhead JSON as a table: host and device microseconds a call per backend."""
    data = json.loads(path.read_text(encoding="utf-8"))
    body = [[r["backend"], r["mode"], fmt(r.get("host_us"), ".1f"), fmt(r.get("device_us"), ".1f"),
             r.get("status", "")] for r in data.get("rows", [])]  # fmt: skip
    shape = "x".join(str(s) for s in data.get("shape", []))
    head = f"Host overhead at {shape} {data.get('dtype', '')} (`python -m harness.overhead`):\n\n"
    return head + _table(["backend", "mode", "host µs", "device µs", "status"], body)


def _software(provenance: dict) -> str:
    """GPU, driver and versions: what a run ran on (the same for most runs of a page)."""
    v = provenance.get("versions", {})
    peers = ", ".join(f"{k} {val}" for k, val in v.items() if val and k not in ("torch", "triton"))
    return (f"{provenance.get('gpu')}, driver {provenance.get('driver')}; torch {v.get('torch')}, "
            f"triton {v.get('triton')}; peers: {peers or '-'}")  # fmt: skip


def _provenance_line(provenance: dict, ceiling: dict, previous_software: str | None) -> str:
    """Commit, date and copy ceiling; the software too where it differs from the run before."""
    line = f"Commit {provenance.get('commit')}, {(provenance.get('date') or '')[:16]}"
    if ceiling.get("ceiling_gbps"):
        line += f"; copy ceiling {ceiling['ceiling_gbps']:.0f} GB/s"
    software = _software(provenance)
    if software != previous_software:
        line += f"; {software}"
    return line


def runs_folder(index: Path, out: Path) -> Path:
    """Where the run pages of the results page out go: runs/ beside the index where the index
    lies in out's folder or below it (results/README.md and results/nvidia-h200/INDEX.md:
    results/nvidia-h200/runs/); for a results page written elsewhere (a preview, --out
    /tmp/page.md), <out's folder>/<the index's folder name>/runs/, so that a preview never
    rewrites the committed pages."""
    index_folder, out_folder = (
        Path(os.path.abspath(index.parent)),
        Path(os.path.abspath(out.parent)),
    )
    if index_folder == out_folder or out_folder in index_folder.parents:
        return index.parent / "runs"
    return out.parent / index_folder.name / "runs"


def run_page_path(runs: Path, run: str) -> Path:
    """Where a run's full tables go: <run>.md in the runs folder (runs_folder)."""
    return runs / f"{run}.md"


def build_pages(index: Path, out: Path, make_plots: bool = True) -> dict[Path, str]:
    """{path: text} of the results page (out) and of each run's page (run_page_path): the
    results page holds the runs table, the targets' summary and per run its plot and the
    one-line verdicts (ours against the fastest peer); a run's page holds its ranked tables,
    its costs and what was not measured. Plots named in the index that do not exist are drawn
    (make_plots)."""
    from harness import report, results

    entries = read_index(index)
    rel = lambda p, page=out: os.path.relpath(p, page.parent)  # noqa: E731
    extra = (
        [c for c in entries[0] if c not in (*INDEX_COLUMNS, "path", "plot_path")] if entries else []
    )
    # a JSON's tables (None: a probe's JSON, listed in the runs table only, with no section)
    json_of = {e["run"]: json_tables(e["path"]) for e in entries if e["path"].suffix == ".json"}
    has_section = {e["run"]: e["path"].suffix == ".jsonl" or json_of.get(e["run"]) is not None
                   for e in entries}  # fmt: skip
    numbered = list(enumerate(entries, 1))  # a run's number: its line in the index

    def runs_table(rows: list, page: Path) -> str:
        return _table(["#", "run", "file", *extra, "what"], [
            [f"[{i}](#run-{i})" if has_section[e["run"]] else i, e["run"],
             f"[{e['file']}]({rel(e['path'], page)})", *(e[c] for c in extra), e["what"]]
            for i, e in rows
        ])  # fmt: skip

    listed = [(i, e) for i, e in numbered if not has_section[e["run"]]]
    runs = runs_folder(index, out)
    listed_page = runs / LISTED_PAGE
    if any(run_page_path(runs, e["run"]) == listed_page for e in entries):
        raise ValueError(f"index {index}: a run may not be named {listed_page.stem!r}")
    command = f"python -m harness.page {index} --out {out}"
    tie = f"{report.TIE:.0%}"
    lines = [
        "# RMSNorm results: the current runs",
        "",
        f"Generated by `{command}` from the index [{rel(index)}]({rel(index)}), one line per current "
        "run; do not edit by hand. Superseded runs are in the index's `archive/` folder, probe "
        "outputs in `probes/` beside it (their scripts: `experiments/`). Each run's ranked tables, "
        f"costs and unmeasured backends are on its own page (in `{rel(runs)}/`); per-shape "
        "tables: `python -m harness.compare --from <file> --per-shape`.",
        "",
        GLOSSARY.format(tie=tie),
        "",
        runs_table([(i, e) for i, e in numbered if has_section[e["run"]]], out),
        "",
    ]
    if listed:
        lines += [f"The probe outputs and GPU test logs among the current runs ({len(listed)}, "
                  f"numbered with them) are listed in [{rel(listed_page)}]({rel(listed_page)}).",
                  ""]  # fmt: skip
    status = in_short(index.parent / "targets.md")
    if status:
        lines += ["## Where our kernel stands (H200)", "",
                  f"From [{rel(index.parent / 'targets.md')}]({rel(index.parent / 'targets.md')}), "
                  "which has the numbers and runs behind each line; run numbers are this page's.",
                  "", status, ""]  # fmt: skip
    pages: dict[Path, str] = {}
    software = None  # the previous run's, shown again only when it changes
    for i, e in enumerate(entries, 1):
        path = e["path"]
        if path.suffix not in (".jsonl", ".json"):
            continue
        page_path = run_page_path(runs, e["run"])
        link = f"[all tables]({rel(page_path)})"
        head = [f'<a id="run-{i}"></a>', "", f"## Run {i}: {e['run']}", ""]
        if path.suffix == ".json":
            tables = json_of[e["run"]]
            if tables is None:  # a probe's JSON: listed in the runs table only
                continue
            lines += [*head, f"`{rel(path)}`. {link}.", ""]  # its what: the runs table
            pages[page_path] = _run_page(e, i, tables, page_path, out, command)
            continue
        provenance, ceiling, rows = results.load(path)
        line = _provenance_line(provenance, ceiling, software)
        software = _software(provenance)
        lines += [*head, f"`{rel(path)}`: {line}. {link}.", ""]  # its what: the runs table
        plot = []
        if e["plot_path"] is not None:
            if make_plots and not e["plot_path"].exists():
                ops = ops_in(rows)
                plots.plot(rows, str(e["plot_path"]), title=f"{e['run']}, {path.name}",
                            op=ops[0] if ops else "rmsnorm")  # fmt: skip
            if e["plot_path"].exists():
                plot = [e["plot_path"]]
        lines += [f"![bandwidth, {e['run']}]({rel(p)})" for p in plot] + ([""] if plot else [])
        body = [f"`{rel(path, page_path)}`: {e['what']}. {_provenance_line(provenance, ceiling, None)}.",
                "", *(f"![bandwidth, {e['run']}]({rel(p, page_path)})\n" for p in plot)]  # fmt: skip
        body += [f"![{title}, {e['run']}]({rel(p, page_path)})\n"
                 for title, p in _run_plots(path, rows, make_plots)]  # fmt: skip
        for op in ops_in(rows):
            for mode in ("fwd", "bwd"):
                if not any(r["mode"] == mode and op_of(r) == op for r in rows):
                    continue
                versus = [report.versus_line(rows, mode, t, op) for t in timings_of(rows, mode)]
                verdicts = [f"- {op} {v}" if op != "rmsnorm" else f"- {v}" for v in versus if v]
                lines += verdicts
                body += [f"## {op} {mode}", "", mode_table(rows, mode, op), "", *verdicts, ""]
            costs = costs_table(rows, op)
            if costs:
                body += [f"## {op}: costs per backend", "", cost_tables.COSTS_NOTE, "", costs, ""]
        lines += [""]
        pages[page_path] = _run_page(e, i, body, page_path, out, command)
    pages[out] = "\n".join(lines).rstrip() + "\n"
    if listed:
        results_page = os.path.relpath(out, listed_page.parent)
        pages[listed_page] = "\n".join([
            "# Probe outputs and GPU test logs", "",
            f"Generated by `{command}`; do not edit by hand. The current runs of "
            f"[the results page]({results_page}) that are a probe's output or a test log, "
            "numbered as there (the index's order); each probe's script is in `experiments/`.",
            "", runs_table(listed, listed_page),
        ]) + "\n"  # fmt: skip
    return pages


#: The page (in runs/ beside the index) listing the current runs that have no section: probe
#: outputs and GPU test logs, kept off the results page, which stays under 40 KB.
LISTED_PAGE = "probes-and-logs.md"


#: A run's page plots bandwidth against N where its cases span at least this many widths.
VS_N_MIN_WIDTHS = 3


def _run_plots(path: Path, rows: list[dict], make_plots: bool) -> list[tuple[str, Path]]:
    """(title, file) of a run page's own plots, drawn beside the run's file when missing
    (make_plots): bandwidth against N per backend where the cases span VS_N_MIN_WIDTHS widths
    or more, and first-call seconds where the run measured them (--costs first_call)."""

    wanted = []
    if len({r["n"] for r in rows if "n" in r}) >= VS_N_MIN_WIDTHS:
        wanted.append(("bandwidth against N", path.with_name(f"bandwidth-vs-n-{path.stem}.png"),
                      plots.plot_vs_n))  # fmt: skip
    if any(r.get("first_call_cold_s") is not None for r in rows):
        wanted.append(("first-call seconds", path.with_name(f"first-call-{path.stem}.png"),
                      plots.plot_first_call))  # fmt: skip
    out = []
    for title, plot_path, draw in wanted:
        if make_plots and not plot_path.exists():
            draw(rows, str(plot_path))
        if plot_path.exists():
            out.append((title, plot_path))
    return out


GLOSSARY = (
    "GB/s = counted bytes / time (rmsnorm fwd 2·M·N elements, bwd 3·M·N; add_rmsnorm 4·M·N "
    "each): a model of the traffic, not a DRAM counter. `device` = CUDA-graph replay over "
    "rotating inputs (> 3x L2); `host` = do_bench median, host overhead included. GB/s is the "
    "geomean over the cases every ranked backend ran; `% ceiling` the geomean of per-case "
    "bandwidth over the run's 2 GiB copy; `err/bound` the largest error against the fp32 "
    "oracle as a fraction of the backend's written bound (at most 1 passes). A backend that "
    "fails the oracle is listed after those that pass, never ranked among them. Under each "
    "table: ours against the fastest peer that passed, per case; tied = within {tie}."
)


def _run_page(entry: dict, number: int, body: list[str], page_path: Path, out: Path,
              command: str) -> str:  # fmt: skip
    results_page = os.path.relpath(out, page_path.parent)
    note = (f"Generated by `{command}`; do not edit by hand. Run {number} of "
            f"[the results page]({results_page}#run-{number}), whose opening paragraphs say how "
            "each column is measured.")  # fmt: skip
    return "\n".join([f"# Run {number}: {entry['run']}", "", note, "", *body]).rstrip() + "\n"


def build_page(index: Path, out: Path, make_plots: bool = True) -> str:
    """The results page's text alone (build_pages has the run pages too)."""
    return build_pages(index, out, make_plots)[out]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.page", description=__doc__.splitlines()[0])
    p.add_argument("index", type=Path, help="the GPU's index of current runs (INDEX.md)")
    p.add_argument("--out", type=Path, default=Path("results/README.md"),
                   help="the page to write; the run pages go to runs/ beside the index where the "
                   "index lies under --out's folder, else to <--out's folder>/<index folder>/runs/ "
                   "(a preview elsewhere leaves the committed pages alone)")  # fmt: skip
    p.add_argument(
        "--no-plots",
        action="store_true",
        help="do not draw plots that are missing (drawn beside the index's files, a preview's too)",
    )
    args = p.parse_args(argv)
    if not args.no_plots:
        from harness.plots import plotting_problem

        problem = plotting_problem()
        if problem:
            p.error(f"{problem} (or --no-plots: the page without the plots that are missing)")
    pages = build_pages(args.index, args.out, make_plots=not args.no_plots)
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    stale = sorted(set(runs_folder(args.index, args.out).glob("*.md")) - set(pages))
    for path in stale:  # a run that left the index takes its page with it
        path.unlink()
    text = pages[args.out]
    print(f"results page written to {args.out} ({len(text.encode())} bytes) and "
          f"{len(pages) - 1} run pages to {runs_folder(args.index, args.out)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
