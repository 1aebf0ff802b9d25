"""python -m harness.compare: measure every backend the same way and rank them.

The command line only: it parses and checks the arguments, then hands over to
harness.recording (measure, rows written as they finish), harness.report (tables and the
markdown page), harness.cost_tables (the cost columns) and harness.plots.
Without CUDA there is nothing to time (Triton runs through its CPU interpreter), so the run is
a correctness run: each backend against the fp32 oracle, no timings, no ranking; the H200
ranking is read from the committed results with --from.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

#: Where the committed H200 results of the current ranking live (one run per .jsonl file).
H200_RESULTS = "results/nvidia-h200/"


def _backend_epilog() -> str:
    from impls import all_backends

    return "\n".join(f"  {b.name:<14} {b.op:<12} {b.label}" for b in all_backends(None))


def _parser(on_cuda: bool) -> argparse.ArgumentParser:
    from harness.shapes import PRESETS

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
    _measuring_options(p.add_argument_group("what to measure"), on_cuda)
    _file_options(p.add_argument_group("results files"))
    _view_options(p.add_argument_group("tables, plots and pages"))
    return p


def _measuring_options(group: argparse._ArgumentGroup, on_cuda: bool) -> None:
    from harness.shapes import PRESETS
    from impls import all_backends

    group.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        choices=[b.name for b in all_backends(None)],  # rmsnorm_fp8's have harness.fp8_bench
        help="backends to measure (default: all registered backends of --op; listed below)",
    )
    group.add_argument(
        "--op",
        default="rmsnorm",
        choices=["rmsnorm", "add_rmsnorm", "all"],
        help="whose backends to measure by default: rmsnorm, add_rmsnorm (pre-norm residual "
        "add, byte model fwd 4MN, bwd 4MN) or all",
    )
    group.add_argument(
        "--preset",
        nargs="+",
        default=None,
        metavar="NAME",
        choices=list(PRESETS),
        help=f"shape presets, listed below (default: {'seed' if on_cuda else 'cpu'} here: seed "
        "on CUDA, cpu without)",
    )
    group.add_argument(
        "--shape", nargs="+", default=[], metavar="MxN", type=_shape,
        help="explicit shapes, e.g. 4096x8192",
    )  # fmt: skip
    group.add_argument(
        "--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16", "fp32"]
    )
    group.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    group.add_argument(
        "--timing",
        nargs="+",
        default=None,
        choices=["device", "host", "check"],
        help="device, host (both need CUDA; default both there) or check (oracle only; the "
        "default and only choice without CUDA); see below",
    )
    group.add_argument(
        "--costs",
        nargs="+",
        default=[],
        choices=["host_us", "batch_invariance", "first_call"],
        help="opt-in cost columns (harness.costs): host_us (host us per call, GPU kept busy), "
        "batch_invariance (bitwise, by M), first_call (cold and warm compile caches, first-call "
        "memory, cross-process determinism: two fresh processes per backend and dtype; slow)",
    )
    group.add_argument(
        "--first-call-shapes",
        nargs="+",
        default=None,
        metavar="SHAPE",
        help="the cases --costs first_call covers (default: every case of the run)",
    )


def _file_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--out",
        type=str,
        default=None,
        metavar="PATH",
        help="results file, or a directory to put it in (an existing one, or a name ending in "
        "/) (default: <gpu>/<date>-<commit>.jsonl "
        f"under {_default_root_text()}); never overwritten: a taken name gets -2, -3, ...",
    )
    group.add_argument(
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
    group.add_argument(
        "--resume",
        type=_existing_file,
        default=None,
        metavar="FILE",
        help="continue an interrupted run in its own file: the cases it finished are kept, the "
        "rest measured and appended (its options come from the file; the same commit, versions "
        "and GPU are required). For runs cut by a time limit: repeat until it is complete",
    )


def _view_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--ncu",
        type=Path,
        default=None,
        metavar="FILE",
        help="a harness.ncu_bytes JSON file: print its DRAM-bytes table and add it to --markdown",
    )
    group.add_argument("--per-shape", action="store_true", help="also print GB/s per shape")
    group.add_argument(
        "--plot-n",
        type=Path,
        default=None,
        metavar="PNG",
        help="write bandwidth against N per backend (fwd and bwd panels, PNG); with several "
        "--from files, one per file, named as for --plot",
    )
    group.add_argument(
        "--plot-first-call",
        type=Path,
        default=None,
        metavar="PNG",
        help="write first-call seconds per backend, cold and warm caches (PNG); one per --from "
        "file, named as for --plot",
    )
    group.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="write a bandwidth plot (PNG); with several --from files, one per file, named "
        "<plot stem>-<file stem>.png",
    )
    group.add_argument(
        "--markdown",
        type=Path,
        default=None,
        metavar="FILE",
        help="write a results page (provenance, ranked, per-shape and ours-vs-best-peer tables)",
    )
    group.add_argument(
        "--notes",
        type=_existing_file,
        default=None,
        metavar="FILE",
        help="a hand-written markdown file appended to the --markdown page (e.g. target status)",
    )


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
    """The results files a --from argument names; a folder with an INDEX.md (results/<gpu>/)
    gives the .jsonl runs it lists first (those under probes/ too), in its order (the results
    page's run numbers), then any other *.jsonl in it."""
    from harness import results
    from harness.index import folder_runs

    try:
        files = results.result_files(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return folder_runs(Path(text)) if Path(text).is_dir() else files


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
    from harness.index import run_numbers

    runs = []  # (provenance, ceiling, rows, source): each one run, ranked on its own
    if args.from_files is not None:
        for path in args.from_files:
            try:
                provenance, ceiling, rows = results.load(path)
            except (ValueError, UnicodeDecodeError) as exc:
                parser.error(f"argument --from: {path}: not a results file ({exc})")
            runs.append((provenance, ceiling, rows, str(path)))
    else:
        measured = _measure(args, on_cuda)
        if not measured.finished:
            print(f"\nINTERRUPTED: {len(measured.rows)} rows written to {measured.path}, marked "
                  "incomplete (no 'complete' record)", file=sys.stderr)  # fmt: skip
            return 130
        runs.append((measured.provenance, measured.ceiling, measured.rows, str(measured.path)))
    checks_only = [not any(r["timing"] != "check" for r in rows) for _, _, rows, _ in runs]
    if args.markdown is not None and any(checks_only):
        named = [s for (*_, s), c in zip(runs, checks_only, strict=True) if c]
        parser.error(f"argument --markdown: a results page ranks timings; {', '.join(named)} "
                     "holds a correctness run (no timings)")  # fmt: skip
    sources = [source for *_, source in runs]
    numbers = run_numbers([Path(source) for source in sources]) if args.from_files else {}
    labels = {source: f"Run {numbers[key][0]}: {numbers[key][1]}" for source in sources
              if (key := Path(source).resolve()) in numbers}  # fmt: skip
    plots = _plot_paths(args.plot, sources)
    for run, plot, n_plot, first_plot, check in zip(
        runs, plots, _plot_paths(args.plot_n, sources),
        _plot_paths(args.plot_first_call, sources), checks_only, strict=True,
    ):  # fmt: skip
        provenance, ceiling, rows, source = run
        if source in labels:
            print(f"# {labels[source]}\n")
        print(report.run_header(provenance, ceiling, stored=source if args.from_files else None,
                                timed=not check))  # fmt: skip
        if check:
            _print_checks(rows, args.modes)
            if plot is not None:
                print(f"no plot for {source}: a correctness run has no bandwidth to plot")
        else:
            _print_tables(rows, args.modes, args.per_shape)
            _write_plots(run, plot, n_plot, first_plot)
        print()
    if len(runs) > 1:
        print(report.runs_summary(runs, checks_only, labels))
    ncu_text = None
    if args.ncu is not None:
        import json

        from harness.cost_tables import ncu_table

        ncu_text = ncu_table(json.loads(args.ncu.read_text(encoding="utf-8"))["records"])
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


def _print_checks(rows: list[dict], modes: list[str]) -> None:
    """A correctness run: each op's oracle verdicts per backend."""
    from harness import report
    from harness.rows import ops_in

    for op in ops_in(rows):
        print(f"\n## {op}: oracle check, no timing\n")
        print(report.correctness_table(rows, op, modes))
    print(f"\nThe H200 ranking: python -m harness.compare --from {H200_RESULTS}")


def _print_tables(rows: list[dict], modes: list[str], per_shape: bool) -> None:
    """A timed run: the ranked table per (op, mode, timing), per shape if asked, the costs."""
    from harness import report
    from harness.cost_tables import costs_table, has_costs
    from harness.rows import ops_in, timings_of

    for op in ops_in(rows):
        for mode in modes:
            for timing in timings_of(rows, mode):
                print(f"\n## {op} {mode}, {report.timing_name(timing)}\n")
                print(report.ranking_table(rows, mode, timing, op))
                if per_shape:
                    print()
                    print(report.per_shape_table(rows, mode, timing, op))
            if has_costs(rows, op, mode):
                print(f"\n## {op} {mode}, costs per backend\n")
                print(costs_table(rows, op, mode))


def _write_plots(
    run: tuple, plot: Path | None, n_plot: Path | None, first_plot: Path | None
) -> None:
    """The PNGs asked for, of one timed run (provenance, ceiling, rows, source)."""
    if plot is None and n_plot is None and first_plot is None:
        return
    from harness import plots
    from harness.rows import ops_in

    provenance, _ceiling, rows, source = run
    if plot is not None:
        ops = ops_in(rows)
        plots.plot(rows, str(plot), title=f"{ops[0] if ops else 'RMSNorm'} on "
                   f"{provenance.get('gpu') or 'CPU'}, {source}", op=ops[0] if ops else "rmsnorm")  # fmt: skip
        print(f"\nplot written to {plot}")
    if n_plot is not None:
        plots.plot_vs_n(rows, str(n_plot))
        print(f"plot written to {n_plot}")
    if first_plot is not None:
        plots.plot_first_call(rows, str(first_plot))
        print(f"plot written to {first_plot}")


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
        from harness.plots import plotting_problem

        problem = plotting_problem()
        if problem:
            parser.error(f"argument {options[0]}: {problem}")


def _plot_paths(plot: Path | None, sources: list[str]) -> list[Path | None]:
    if plot is None:
        return [None] * len(sources)
    if len(sources) == 1:
        return [plot]
    return [plot.with_name(f"{plot.stem}-{Path(s).stem}{plot.suffix or '.png'}") for s in sources]


def _measure(args, on_cuda: bool):
    """Measure what args select, written to its results file as rows finish (harness.recording)."""
    from harness import provenance as prov
    from harness import results, shapes
    from harness.calls import DTYPES
    from harness.recording import record
    from harness.run import RunConfig
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
    return record(config, info, ceiling, out=args.out, resume=args.resume)


if __name__ == "__main__":
    sys.exit(main())
