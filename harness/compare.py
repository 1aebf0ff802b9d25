"""python -m harness.compare: measure every backend the same way and rank them.

Parses arguments, then hands over to harness.run (measure) and harness.report (tables, plots).
Without CUDA there is nothing to time (Triton runs through its CPU interpreter), so the run is
a correctness run: each backend against the fp32 oracle, no timings, no ranking; the H200
ranking is read from the committed results with --from.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
import time
from pathlib import Path

#: Where the committed H200 results of the current ranking live (one run per .jsonl file).
H200_RESULTS = "results/nvidia-h200/"

#: Rough seconds per step (one backend, shape and dtype) of a correctness run on a CPU, through
#: the Triton interpreter: a fixed part and a part per element of the input for a backend that
#: runs here, and the time to skip one that cannot. From a 2-core x86 machine shared with other
#: work (every rmsnorm backend, fwd and bwd checked): the cpu preset's 36 steps took 37 s;
#: 512x2048 bf16's 9 steps 17 s; 2048x4096 bf16 with triton, eager and compile 63 s.
CPU_CHECK_SECONDS = (1.0, 2.0e-6)
CPU_SKIP_SECONDS = 0.2


def _backend_epilog() -> str:
    from impls import all_backends

    return "\n".join(f"  {b.name:<14} {b.op:<12} {b.label}" for b in all_backends(None))


def _parser(on_cuda: bool) -> argparse.ArgumentParser:
    from harness.shapes import PRESETS
    from impls import all_backends

    presets = "\n".join(f"  {name}: {desc}" for name, (desc, _) in PRESETS.items())
    timings = (
        "timings:\n"
        "  device  CUDA-graph replay over rotating inputs (> 3x L2): needs CUDA\n"
        "  host    triton do_bench median, host overhead included: needs CUDA\n"
        "  check   no timing: each backend against the fp32 oracle only. The only choice\n"
        "          without CUDA, where Triton runs through its CPU interpreter and times mean\n"
        "          nothing (default there).\n"
        f"  The H200 ranking without a GPU: python -m harness.compare --from {H200_RESULTS}"
    )
    p = argparse.ArgumentParser(
        prog="python -m harness.compare",
        description=textwrap.fill(
            "Rank RMSNorm backends by bandwidth (byte model: fwd 2MN, bwd 3MN elements; a "
            "model, not a DRAM counter), each row checked against the fp32 oracle. Without "
            "CUDA: a correctness run (oracle verdicts and errors, no timings).",
            width=90,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"backends (impls/__init__.py; name, op, label):\n{_backend_epilog()}\n\n"
        f"presets (harness/shapes.py):\n{presets}\n\n{timings}\n\n"
        + textwrap.fill(
            f"results: written as rows finish to --out, by default under "
            f"{_default_root_text()}; a run that did not finish has no final 'complete' record, "
            "and --from says so.",
            width=90,
        ),
    )
    p.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        choices=[b.name for b in all_backends(None)],  # rmsnorm_fp8's have harness.fp8_bench
        help="backends to measure (default: all registered backends of --op; listed below)",
    )
    p.add_argument(
        "--op",
        default="rmsnorm",
        choices=["rmsnorm", "add_rmsnorm", "all"],
        help="whose backends to measure by default: rmsnorm, add_rmsnorm (pre-norm residual "
        "add, byte model fwd 4MN, bwd 4MN) or all",
    )
    p.add_argument(
        "--preset",
        nargs="+",
        default=None,
        metavar="NAME",
        choices=list(PRESETS),
        help=f"shape presets, listed below (default: {'seed' if on_cuda else 'cpu'} here: seed "
        "on CUDA, cpu without)",
    )
    p.add_argument(
        "--shape", nargs="+", default=[], metavar="MxN", type=_shape,
        help="explicit shapes, e.g. 4096x8192",
    )  # fmt: skip
    p.add_argument(
        "--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16", "fp32"]
    )
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument(
        "--timing",
        nargs="+",
        default=None,
        choices=["device", "host", "check"],
        help="device, host (both need CUDA; default both there) or check (oracle only; the "
        "default and only choice without CUDA); see below",
    )
    p.add_argument(
        "--out",
        type=str,
        default=None,
        metavar="PATH",
        help="results file, or a directory to put it in (an existing one, or a name ending in "
        "/) (default: <gpu>/<date>-<commit>.jsonl "
        f"under {_default_root_text()}); never overwritten: a taken name gets -2, -3, ...",
    )
    p.add_argument(
        "--from",
        dest="from_files",
        type=_from_path,
        nargs="+",
        default=None,
        metavar="PATH",
        help="rank stored results files (or pytest-benchmark JSON) without measuring; a "
        "directory stands for its *.jsonl files; each file is one run and is ranked on its own "
        f"(the H200 ranking: --from {H200_RESULTS})",
    )
    p.add_argument(
        "--resume",
        type=_existing_file,
        default=None,
        metavar="FILE",
        help="continue an interrupted run in its own file: the cases it finished are kept, the "
        "rest measured and appended (its options come from the file; the same commit, versions "
        "and GPU are required). For runs cut by a time limit: repeat until it is complete",
    )
    p.add_argument(
        "--costs",
        nargs="+",
        default=[],
        choices=["host_us", "batch_invariance", "first_call"],
        help="opt-in cost columns (harness.costs): host_us (host us per call, GPU kept busy), "
        "batch_invariance (bitwise, by M), first_call (cold and warm compile caches, first-call "
        "memory, cross-process determinism: two fresh processes per backend and dtype; slow)",
    )
    p.add_argument(
        "--first-call-shapes",
        nargs="+",
        default=None,
        metavar="SHAPE",
        help="the cases --costs first_call covers (default: every case of the run)",
    )
    p.add_argument(
        "--ncu",
        type=Path,
        default=None,
        metavar="FILE",
        help="a harness.ncu_bytes JSON file: print its DRAM-bytes table and add it to --markdown",
    )
    p.add_argument("--per-shape", action="store_true", help="also print GB/s per shape")
    p.add_argument(
        "--plot-n",
        type=Path,
        default=None,
        help="write bandwidth against N per backend (fwd and bwd panels, PNG); with several "
        "--from files, one per file, named as for --plot",
    )
    p.add_argument(
        "--plot-first-call",
        type=Path,
        default=None,
        help="write first-call seconds per backend, cold and warm caches (PNG); one per --from "
        "file, named as for --plot",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a bandwidth plot (PNG); with several --from files, one per file, named "
        "<plot stem>-<file stem>.png",
    )
    p.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="write a results page (provenance, ranked, per-shape and ours-vs-best-peer tables)",
    )
    p.add_argument(
        "--notes",
        type=_existing_file,
        default=None,
        help="a hand-written markdown file appended to the --markdown page (e.g. target status)",
    )
    return p  # fmt: skip


def _default_root_text() -> str:
    from harness import results

    home = str(Path("~").expanduser())
    root = str(results.default_root())
    return "~" + root[len(home) :] if root.startswith(home + os.sep) else root


def _shape(text: str) -> str:
    from harness.shapes import parse_shape

    try:
        parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("shape: ")) from exc
    return text


def _from_path(text: str) -> list[Path]:
    from harness import results

    try:
        return results.result_files(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _existing_file(text: str) -> Path:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return Path(text)


def main(argv: list[str] | None = None) -> int:
    import torch

    on_cuda = torch.cuda.is_available()
    if not on_cuda:
        from harness.interpreter import use_interpreter_without_cuda

        # Before triton is imported by the registry: the kernels then run on CPU tensors.
        use_interpreter_without_cuda(check=False)
    parser = _parser(on_cuda)
    args = parser.parse_args(argv)
    _check_args(parser, args, on_cuda)
    from harness import report, results

    runs = []  # (provenance, ceiling, rows, source): each one run, ranked on its own
    if args.from_files is not None:
        for path in args.from_files:
            try:
                provenance, ceiling, rows = results.load(path)
            except (ValueError, UnicodeDecodeError) as exc:
                parser.error(f"argument --from: {path}: not a results file ({exc})")
            runs.append((provenance, ceiling, rows, str(path)))
    else:
        provenance, ceiling, rows, path, finished = _measure(args, on_cuda)
        if not finished:
            print(f"\nINTERRUPTED: {len(rows)} rows written to {path}, marked incomplete (no "
                  "'complete' record)", file=sys.stderr)  # fmt: skip
            return 130
        runs.append((provenance, ceiling, rows, str(path)))
    checks_only = [not any(r["timing"] != "check" for r in rows) for _, _, rows, _ in runs]
    if args.markdown is not None and any(checks_only):
        named = [s for (*_, s), c in zip(runs, checks_only, strict=True) if c]
        parser.error(f"argument --markdown: a results page ranks timings; {', '.join(named)} "
                     "holds a correctness run (no timings)")  # fmt: skip
    plots = _plot_paths(args.plot, [source for *_, source in runs])
    n_plots = _plot_paths(args.plot_n, [source for *_, source in runs])
    first_plots = _plot_paths(args.plot_first_call, [source for *_, source in runs])
    for (provenance, ceiling, rows, source), plot, n_plot, first_plot, check in zip(
        runs, plots, n_plots, first_plots, checks_only, strict=True
    ):
        print(_header(provenance, ceiling, stored=source if args.from_files else None,
                      timed=not check))  # fmt: skip
        if check:
            for op in report.ops_in(rows):
                print(f"\n## {op}: oracle check, no timing\n")
                print(correctness_table(rows, op, args.modes))
            print(f"\nThe H200 ranking: python -m harness.compare --from {H200_RESULTS}")
            if plot is not None:
                print(f"no plot for {source}: a correctness run has no bandwidth to plot")
            print()
            continue
        for op in report.ops_in(rows):
            for mode in args.modes:
                for timing in report.timings_of(rows, mode):
                    print(f"\n## {op} {mode}, {_timing_name(timing)}\n")
                    print(report.ranking_table(rows, mode, timing, op))
                    if args.per_shape:
                        print()
                        print(report.per_shape_table(rows, mode, timing, op))
                if report.has_costs(rows, op, mode):
                    print(f"\n## {op} {mode}, costs per backend\n")
                    print(report.costs_table(rows, op, mode))
        if plot is not None:
            ops = report.ops_in(rows)
            report.plot(rows, str(plot), title=f"{ops[0] if ops else 'RMSNorm'} on "
                        f"{provenance.get('gpu') or 'CPU'}, {source}", op=ops[0] if ops else "rmsnorm")  # fmt: skip
            print(f"\nplot written to {plot}")
        if n_plot is not None:
            report.plot_vs_n(rows, str(n_plot))
            print(f"plot written to {n_plot}")
        if first_plot is not None:
            report.plot_first_call(rows, str(first_plot))
            print(f"plot written to {first_plot}")
        print()
    ncu_text = None
    if args.ncu is not None:
        import json

        ncu_text = report.ncu_table(json.loads(args.ncu.read_text(encoding="utf-8"))["records"])
        print(f"## DRAM bytes (Nsight Compute) beside the byte model, {args.ncu}\n\n{ncu_text}\n")
    if args.markdown is not None:
        command = "python -m harness.compare " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        notes = args.notes.read_text(encoding="utf-8") if args.notes else None
        rel = [os.path.relpath(p, args.markdown.parent) if p else None for p in plots]
        page = report.markdown_page(
            [(*run, plot) for run, plot in zip(runs, rel, strict=True)], command, notes
        )
        if ncu_text:
            page += ("\n\n## DRAM bytes (Nsight Compute) beside the byte model\n\n"
                     f"From `{args.ncu}` (harness/ncu_bytes.py).\n\n{ncu_text}")  # fmt: skip
        args.markdown.write_text(page + "\n", encoding="utf-8")
        print(f"results page written to {args.markdown}")
    if args.from_files is None:
        print(f"rows written to {runs[0][3]}")
    return 0


def _resume_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """args's measuring options from the interrupted run's file (its provenance's "config")."""
    from harness import results

    try:
        provenance, _ceiling, _rows = results.load(args.resume)
    except (ValueError, UnicodeDecodeError) as exc:
        parser.error(f"argument --resume: {args.resume}: not a results file ({exc})")
    if provenance.get("complete"):
        parser.error(f"argument --resume: {args.resume} is complete: nothing to resume")
    config = provenance.get("config")
    if not config:
        parser.error(f"argument --resume: {args.resume} does not record its options (written "
                     "before --resume existed); measure the missing cases with --shape")  # fmt: skip
    args.shape, args.preset = config["shapes"], None
    args.dtypes, args.modes, args.timing = config["dtypes"], config["modes"], config["timings"]
    args.backends, args.op, args.costs = config["backends"], config["op"], config["costs"]
    args.first_call_shapes = config["first_call_shapes"]


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace, on_cuda: bool) -> None:
    """Errors argparse cannot see alone (exit 2, with the usage line)."""
    if args.from_files is not None:
        args.from_files = [path for paths in args.from_files for path in paths]
        given = [f"--{name}" for name in ("backends", "preset", "out", "timing")
                 if getattr(args, name)] + (["--shape"] if args.shape else [])  # fmt: skip
        if given:
            parser.error(f"argument --from: ranks stored runs; {', '.join(given)} only apply "
                         "when measuring")  # fmt: skip
        _check_plotting(parser, args)
        return
    if args.resume is not None:
        given = [f"--{name}" for name in ("from_files", "backends", "preset", "out", "timing", "costs")
                 if getattr(args, name)] + (["--shape"] if args.shape else [])  # fmt: skip
        if given:
            parser.error(f"argument --resume: the run's options come from its file; "
                         f"{', '.join(g.replace('_files', '') for g in given)} cannot change them")  # fmt: skip
        _resume_options(parser, args)
    if args.out:
        folder = Path(args.out) if args.out.endswith(("/", os.sep)) else Path(args.out).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"argument --out: cannot make the directory {folder} ({exc.strerror})")
    if args.timing is None:
        args.timing = ["device", "host"] if on_cuda else ["check"]
    if "check" in args.timing and len(args.timing) > 1:
        parser.error("argument --timing: check (oracle only) runs alone, not beside a timing")
    if not on_cuda:
        timed = [t for t in args.timing if t != "check"]
        if timed:
            parser.error(f"argument --timing: {' and '.join(timed)} timing needs CUDA; without "
                         "it only 'check' runs (the oracle check through the Triton interpreter; "
                         f"its times would mean nothing). The H200 ranking: --from {H200_RESULTS}")  # fmt: skip
        from harness.interpreter import installed_problem

        problem = installed_problem() if os.environ.get("TRITON_INTERPRET") == "1" else None
        if problem:
            parser.error(problem)
    if args.timing == ["check"] and args.plot is not None:
        parser.error("argument --plot: a correctness run (--timing check) has no bandwidth to plot")
    if args.timing == ["check"] and args.markdown is not None:
        parser.error("argument --markdown: a results page ranks timings; --timing check has none")
    _check_plotting(parser, args)


def _check_plotting(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Plot options need matplotlib: said before measuring (a long run must not end in an
    ImportError at its plot), after the options' other errors."""
    options = [f"--{name.replace('_', '-')}" for name in ("plot", "plot_n", "plot_first_call")
               if getattr(args, name) is not None]  # fmt: skip
    if options:
        from harness.report import plotting_problem

        problem = plotting_problem()
        if problem:
            parser.error(f"argument {options[0]}: {problem}")


def correctness_table(rows: list[dict], op: str, modes: list[str]) -> str:
    """Per backend and mode: the oracle's verdict over the cases checked, the worst error in
    ulps and as a fraction of the backend's bound, and why any case did not run."""
    from tabulate import tabulate

    from harness.report import op_of

    chosen = [r for r in rows if op_of(r) == op and r["mode"] in modes]
    backends = list(dict.fromkeys(r["backend"] for r in chosen))
    body = []
    for name in backends:
        for mode in modes:
            brows = [r for r in chosen if r["backend"] == name and r["mode"] == mode]
            if not brows:
                continue
            judged = [r for r in brows if r.get("oracle_passed") is not None]
            failed = [r for r in judged if not r["oracle_passed"]]
            verdict = ("FAIL" if failed else "pass") if judged else "-"
            ulps = [r["oracle_max_ulps"] for r in judged if r.get("oracle_max_ulps") is not None]
            uses = [r["oracle_bound_use"] for r in judged if r.get("oracle_bound_use") is not None]
            why = sorted({f"{r['status']}: {r['reason']}" for r in brows
                          if r["status"] not in ("checked", "ok")})  # fmt: skip
            detail = "; ".join(f"{r['shape']} {r['dtype']}: {r['oracle_detail']}"
                               for r in failed if r.get("oracle_detail"))  # fmt: skip
            body.append([name, mode, f"{len(judged)}/{len(brows)}", verdict,
                         f"{max(ulps):g}" if ulps else "", f"{max(uses):.2f}" if uses else "",
                         "; ".join(why + ([detail[:160]] if detail else []))[:200]])  # fmt: skip
    return tabulate(body, headers=["backend", "mode", "cases checked", "oracle", "worst ulps",
                                   "err/bound", "not run / failures"], tablefmt="github")  # fmt: skip


def _plot_paths(plot: Path | None, sources: list[str]) -> list[Path | None]:
    if plot is None:
        return [None] * len(sources)
    if len(sources) == 1:
        return [plot]
    return [plot.with_name(f"{plot.stem}-{Path(s).stem}{plot.suffix or '.png'}") for s in sources]


def _timing_name(timing: str) -> str:
    return {"device": "device-only (CUDA graph, rotating inputs)",
            "host": "host-inclusive (do_bench median)",
            "pytest": "pytest-benchmark wall clock"}.get(timing, timing)  # fmt: skip


def estimate(
    shapes: list[tuple[int, int]], dtypes: int, backends: list, timings: list[str], gpu: str | None
) -> str:
    """'N steps (...)' and a rough time where one can be told, for the line before a run."""
    steps = len(shapes) * dtypes * len(backends)
    text = f"{steps} steps ({len(backends)} backends x {len(shapes)} shapes x {dtypes} dtypes)"
    if timings == ["check"] and gpu is None:
        a, b = CPU_CHECK_SECONDS
        runs = sum(b.unavailable() is None for b in backends)
        seconds = dtypes * sum(runs * (a + b * m * n) + (len(backends) - runs) * CPU_SKIP_SECONDS
                               for m, n in shapes)  # fmt: skip
        return f"{text}, roughly {_duration(seconds)} here (the oracle check through the Triton " \
               "interpreter; from a 2-core machine's pace)"  # fmt: skip
    pace = _recorded_pace(gpu)
    if pace is None:
        return f"{text}; no earlier run on this GPU records its pace: the progress lines " \
               "estimate the time left from the second step"  # fmt: skip
    seconds, source = pace
    return f"{text}, roughly {_duration(seconds * steps)} (the pace of {source}; wide shapes " \
           "and torch.compile's first shapes take longer)"  # fmt: skip


def _recorded_pace(gpu: str | None, root: Path | None = None) -> tuple[float, str] | None:
    """Seconds per step of the newest run on this GPU whose rows record when they finished
    (rows' elapsed_s), and that file's name; a complete run first, else an interrupted one (its
    steps so far); None when no run records it (runs committed before rows carried elapsed_s do
    not). The runs: those results/<gpu>/INDEX.md lists and the folder's other *.jsonl (a run
    copied in, not yet indexed); root: the results folder."""
    from harness import results

    root = root or Path(__file__).resolve().parent.parent / "results"
    paced = []
    for path in _pace_sources(root / results.gpu_slug({"gpu": gpu})):
        try:
            provenance, _, rows = results.load(path)
        except (OSError, ValueError):
            continue
        times = [r["elapsed_s"] for r in rows if r.get("elapsed_s") is not None]
        steps = {(r.get("backend"), r.get("shape"), r.get("dtype")) for r in rows}
        if times and steps:
            complete = bool(provenance.get("complete"))
            name = path.name if complete else f"{path.name}, an interrupted run"
            # newest by start time: names sort by day, then by commit hash
            date = str(provenance.get("date") or "")
            paced.append((complete, date, max(times) / len(steps), name))
    if not paced:
        return None
    *_, seconds, name = max(paced)
    return seconds, name


def _pace_sources(folder: Path) -> list[Path]:
    """The .jsonl runs the folder's INDEX.md lists, and the folder's own *.jsonl."""
    from harness import page

    listed: list[Path] = []
    index = folder / "INDEX.md"
    if index.is_file():
        try:
            listed = [row["path"] for row in page.read_index(index)]
        except (OSError, ValueError):  # an index that does not parse still leaves the folder
            listed = []
    found = {p.resolve(): p for p in [*listed, *folder.glob("*.jsonl")]
             if p.suffix == ".jsonl" and p.is_file()}  # fmt: skip
    return sorted(found.values())


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _measure(args, on_cuda: bool):
    from harness import provenance as prov
    from harness import results, shapes
    from harness.calls import DTYPES
    from harness.run import RunConfig, run
    from impls import select_backends

    presets = args.preset or ([] if args.shape else ["seed"] if on_cuda else ["cpu"])
    config_shapes = shapes.resolve(presets, args.shape)
    info = prov.collect()
    info["presets"] = presets
    info["format"] = results.FORMAT
    ceiling = {}
    if on_cuda and args.timing != ["check"]:
        from harness.ceiling import card_ceiling_gbps

        ceiling = card_ceiling_gbps()
    config = RunConfig(
        backends=select_backends(args.backends, None if args.op == "all" else args.op),
        shapes=config_shapes,
        dtypes=[DTYPES[d] for d in args.dtypes],
        modes=args.modes,
        timings=args.timing,
        ceiling_gbps=ceiling.get("ceiling_gbps"),
        costs=args.costs,
        first_call_shapes=None
        if args.first_call_shapes is None
        else [shapes.parse_shape(s) for s in args.first_call_shapes],
    )
    info["config"] = {
        "shapes": [shapes.shape_label(s) for s in config_shapes], "dtypes": list(args.dtypes),
        "modes": list(args.modes), "timings": list(args.timing),
        "backends": [b.name for b in config.backends], "op": args.op, "costs": list(args.costs),
        "first_call_shapes": args.first_call_shapes,
    }  # fmt: skip
    rows: list[dict] = []
    started = time.perf_counter()
    if args.resume is not None:
        writer, info, ceiling, rows, done = _resumed(args.resume, info, config)
        path = args.resume
        config = dataclasses.replace(
            config, done_cases=frozenset(done), ceiling_gbps=ceiling.get("ceiling_gbps")
        )  # the run's own
        started -= max((r.get("elapsed_s") or 0.0 for r in rows), default=0.0)
        left = [s for s in config_shapes for d in args.dtypes
                if (shapes.shape_label(s), d) not in done]  # fmt: skip
        print(f"harness.compare: resuming {path}: {len(done)} cases kept, {len(left)} to "
              "measure", file=sys.stderr, flush=True)  # fmt: skip
    else:
        out = Path(args.out) if args.out else results.default_path(info)
        if args.out and (args.out.endswith(("/", os.sep)) or out.is_dir()):
            out = out / results.default_path(info, root="").name
        path = results.fresh_path(out)
        writer = results.ResultWriter(path)
        writer.write({"kind": "provenance", **info})
        writer.write({"kind": "ceiling", **ceiling})
        print(f"harness.compare: {estimate(config_shapes, len(config.dtypes), config.backends, args.timing, info.get('gpu'))}\n"
              f"  rows go to {path} as they finish", file=sys.stderr, flush=True)  # fmt: skip

    def sink(row: dict) -> None:
        row["ceiling_gbps"] = ceiling.get("ceiling_gbps")
        row["elapsed_s"] = round(time.perf_counter() - started, 2)  # the pace of later estimates
        rows.append(row)
        writer.write({"kind": "row", **row})

    finished = False
    try:
        run(config, sink)
        finished = True
    except KeyboardInterrupt:
        pass
    finally:
        if finished:
            writer.finish()
        else:
            writer.close()
    return info, ceiling, rows, path, finished


def _resumed(path: Path, info: dict, config) -> tuple:
    """(writer appending to path, the run's provenance, its ceiling, the rows kept, the cases
    kept as (shape label, dtype name)) for --resume. A case is kept when every backend of the
    run wrote all its rows for it (a backend's step writes one row per mode and timing); the
    rows of a case cut short are dropped and it is measured again, whole, in this process. The
    file is rewritten (atomically) with the kept rows and its provenance's "resumed" list, the
    dates of the processes that continued it, then appended to."""
    from harness import results

    provenance, ceiling, rows = results.load(path)
    if provenance.pop("cut_line", None) is not None:  # a row written in part: dropped here
        print(f"--resume {path}: its last line was written in part (the run was killed "
              "inside a write); dropped", file=sys.stderr)  # fmt: skip
    from harness.provenance import run_differences

    what = run_differences(provenance, info)
    if what or provenance.get("config") != info["config"]:
        raise SystemExit(f"harness.compare: --resume {path}: not the same run "
                         f"({what or 'its options differ'}); start a new one")  # fmt: skip
    per_case = len(config.backends) * len(config.modes) * len(config.timings)
    counts: dict[tuple, int] = {}
    for r in rows:
        counts[(r["shape"], r["dtype"])] = counts.get((r["shape"], r["dtype"]), 0) + 1
    done = {case for case, count in counts.items() if count == per_case}
    kept = [r for r in rows if (r["shape"], r["dtype"]) in done]
    provenance.pop("complete", None)
    provenance["resumed"] = [*provenance.get("resumed", []), info["date"]]
    records = [{"kind": "provenance", **provenance}, {"kind": "ceiling", **ceiling},
               *({"kind": "row", **r} for r in kept)]  # fmt: skip
    results.rewrite(path, records)
    writer = results.ResultWriter(path, append=True)
    writer.rows = len(kept)
    return writer, provenance, ceiling, kept, done


def _header(provenance: dict, ceiling: dict, stored: str | None, timed: bool = True) -> str:
    lines = []
    if stored and provenance.get("complete") is False:
        lines.append(f"INCOMPLETE: {stored} has no 'complete' record: the run was interrupted "
                     "and some cases are missing; tables below cover only the rows it finished.")  # fmt: skip
    if not provenance.get("gpu") and not timed:
        lines.append("CORRECTNESS RUN (no CUDA device): Triton ran through its CPU interpreter, "
                     "so nothing was timed; below, each backend against the fp32 oracle.")  # fmt: skip
    elif not provenance.get("gpu"):
        lines.append("NOTICE: no CUDA device. Triton ran through its CPU interpreter: these times are "
                     "NOT performance numbers, only a check that every backend runs.")  # fmt: skip
    v = provenance.get("versions", {})
    versions = " | ".join(f"{p} {v[p]}" for p in ("torch", "triton") if v.get(p)) or (
        "versions not recorded"
    )
    lines.append(
        f"GPU: {provenance.get('gpu') or 'none'}"
        + (
            f" ({provenance.get('sm_count')} SMs, driver {provenance.get('driver')})"
            if provenance.get("gpu")
            else ""
        )
        + f" | {versions} | commit {provenance.get('commit') or 'not recorded'}"
        + (f" | {provenance['date']}" if provenance.get("date") else "")
    )
    if ceiling.get("ceiling_gbps"):
        lines.append(f"copy ceiling: {ceiling['ceiling_gbps']:.0f} GB/s "
                     f"(2 GiB device copy, read + write counted)")  # fmt: skip
    if timed:
        lines.append("bandwidth = counted bytes / time; rmsnorm fwd counts 2*M*N elements, bwd "
                     "3*M*N; add_rmsnorm 4*M*N each: a model, not a DRAM counter")  # fmt: skip
    if stored:
        lines.append(f"from {stored}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
