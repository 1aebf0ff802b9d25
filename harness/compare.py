"""python -m harness.compare: measure every backend the same way and rank them.

Parses arguments, then hands over to harness.run (measure) and harness.report (tables, plots).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    from harness.shapes import PRESETS

    presets = "\n".join(f"  {name}: {desc}" for name, (desc, _) in PRESETS.items())
    p = argparse.ArgumentParser(
        prog="python -m harness.compare",
        description="Rank RMSNorm backends by bandwidth (byte model: fwd 2MN, bwd 3MN elements; "
        "a model, not a DRAM counter), each row checked against the fp32 oracle.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"presets:\n{presets}",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        help="backends to measure (default: all registered backends of --op)",
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
        help="shape presets (default: seed on CUDA, cpu without)",
    )
    p.add_argument(
        "--shape", nargs="+", default=[], metavar="MxN", help="explicit shapes, e.g. 4096x8192"
    )
    p.add_argument(
        "--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16", "fp32"]
    )
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument(
        "--timing",
        nargs="+",
        default=["device", "host"],
        choices=["device", "host"],
        help="device: CUDA-graph replay over rotating inputs; host: do_bench (default both)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default results/<gpu>/<date>-<commit>.jsonl; never overwritten)",
    )
    p.add_argument(
        "--from",
        dest="from_files",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="rank stored results files (or pytest-benchmark JSON) without measuring; each file "
        "is one run and is ranked on its own",
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
        type=Path,
        default=None,
        help="a hand-written markdown file appended to the --markdown page (e.g. target status)",
    )
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.from_files is None:
        import torch

        if not torch.cuda.is_available():
            # Before triton is imported by any backend: the kernels then run on CPU tensors.
            os.environ.setdefault("TRITON_INTERPRET", "1")
    from harness import report, results

    runs = []  # (provenance, ceiling, rows, source): each one run, ranked on its own
    if args.from_files is not None:
        for path in args.from_files:
            provenance, ceiling, rows = results.load(path)
            runs.append((provenance, ceiling, rows, str(path)))
    else:
        provenance, ceiling, rows, path = _measure(args)
        print(f"rows written to {path}")
        runs.append((provenance, ceiling, rows, str(path)))
    plots = _plot_paths(args.plot, [source for *_, source in runs])
    n_plots = _plot_paths(args.plot_n, [source for *_, source in runs])
    first_plots = _plot_paths(args.plot_first_call, [source for *_, source in runs])
    for (provenance, ceiling, rows, source), plot, n_plot, first_plot in zip(
        runs, plots, n_plots, first_plots, strict=True
    ):
        print(_header(provenance, ceiling, stored=source if args.from_files else None))
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
    return 0


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


def _measure(args):
    import torch

    from harness import provenance as prov
    from harness import results, shapes
    from harness.run import DTYPES, RunConfig, run
    from impls import select_backends

    on_cuda = torch.cuda.is_available()
    presets = args.preset or ([] if args.shape else ["seed"] if on_cuda else ["cpu"])
    config_shapes = shapes.resolve(presets, args.shape)
    info = prov.collect()
    info["presets"] = presets
    ceiling = {}
    if on_cuda:
        from harness.ceiling import card_ceiling_gbps

        ceiling = card_ceiling_gbps()
    timings = args.timing if on_cuda else ["host"]
    config = RunConfig(
        backends=select_backends(args.backends, None if args.op == "all" else args.op),
        shapes=config_shapes,
        dtypes=[DTYPES[d] for d in args.dtypes],
        modes=args.modes,
        timings=timings,
        ceiling_gbps=ceiling.get("ceiling_gbps"),
        costs=args.costs,
        first_call_shapes=None
        if args.first_call_shapes is None
        else [shapes.parse_shape(s) for s in args.first_call_shapes],
    )
    path = results.fresh_path(args.out or results.default_path(info))
    writer = results.ResultWriter(path)
    writer.write({"kind": "provenance", **info})
    writer.write({"kind": "ceiling", **ceiling})
    rows: list[dict] = []

    def sink(row: dict) -> None:
        row["ceiling_gbps"] = ceiling.get("ceiling_gbps")
        rows.append(row)
        writer.write({"kind": "row", **row})

    try:
        run(config, sink)
    finally:
        writer.close()
    return info, ceiling, rows, path


def _header(provenance: dict, ceiling: dict, stored: str | None) -> str:
    lines = []
    if not provenance.get("gpu"):
        lines.append("NOTICE: no CUDA device. Triton ran through its CPU interpreter: these times are "
                     "NOT performance numbers, only a check that every backend runs.")  # fmt: skip
    v = provenance.get("versions", {})
    lines.append(
        f"GPU: {provenance.get('gpu') or 'none'}"
        + (
            f" ({provenance.get('sm_count')} SMs, driver {provenance.get('driver')})"
            if provenance.get("gpu")
            else ""
        )
        + f" | torch {v.get('torch')} | triton {v.get('triton')} | commit {provenance.get('commit')}"
        + f" | {provenance.get('date')}"
    )
    if ceiling.get("ceiling_gbps"):
        lines.append(f"copy ceiling: {ceiling['ceiling_gbps']:.0f} GB/s "
                     f"(2 GiB device copy, read + write counted)")  # fmt: skip
    lines.append("bandwidth = counted bytes / time; rmsnorm fwd counts 2*M*N elements, bwd 3*M*N; "
                 "add_rmsnorm 4*M*N each: a model, not a DRAM counter")  # fmt: skip
    if stored:
        lines.append(f"from {stored}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
