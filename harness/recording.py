"""One measured run written to its results file as its rows finish (harness.results' JSON
lines): a fresh file, or the file an interrupted run left (--resume: the cases it finished are
kept, the rest measured in this process and appended). A run stopped by Ctrl-C keeps what it
wrote and has no 'complete' record."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from harness import results, run
from harness.pace import estimate
from harness.provenance import run_differences


@dataclasses.dataclass
class Recorded:
    """What record() measured: the run's provenance, its copy ceiling, its rows (a resumed
    run's kept rows first), its file, and whether it finished (False: interrupted)."""

    provenance: dict
    ceiling: dict
    rows: list[dict]
    path: Path
    finished: bool


def record(
    config: run.RunConfig,
    info: dict,
    ceiling: dict,
    out: str | None = None,
    resume: Path | None = None,
) -> Recorded:
    """Run config, each row written as it finishes. info: this process's provenance, with the
    run's options under "config" (harness.compare writes them, and --resume reads them back);
    ceiling: the copy ceiling measured here. out: a file, or a folder to put the run's default
    name in (an existing one, or a name ending in /); None: results.default_path. A taken name
    is never overwritten. resume: an interrupted run's file to continue instead (its
    provenance and ceiling stay the run's)."""
    rows: list[dict] = []
    started = time.perf_counter()
    if resume is not None:
        writer, info, ceiling, rows, done = _resumed(resume, info, config)
        path = resume
        config = dataclasses.replace(
            config, done_cases=frozenset(done), ceiling_gbps=ceiling.get("ceiling_gbps")
        )  # the run's own
        started -= max((r.get("elapsed_s") or 0.0 for r in rows), default=0.0)
        left = [(s, d) for s in info["config"]["shapes"] for d in info["config"]["dtypes"]
                if (s, d) not in done]  # fmt: skip
        print(f"harness.compare: resuming {path}: {len(done)} cases kept, {len(left)} to "
              "measure", file=sys.stderr, flush=True)  # fmt: skip
    else:
        path = results.fresh_path(_named(out, info))
        writer = results.ResultWriter(path)
        writer.write({"kind": "provenance", **info})
        writer.write({"kind": "ceiling", **ceiling})
        steps = estimate(config.shapes, len(config.dtypes), config.backends, config.timings,
                         info.get("gpu"))  # fmt: skip
        print(f"harness.compare: {steps}\n  rows go to {path} as they finish", file=sys.stderr,
              flush=True)  # fmt: skip

    def sink(row: dict) -> None:
        row["ceiling_gbps"] = ceiling.get("ceiling_gbps")
        row["elapsed_s"] = round(time.perf_counter() - started, 2)  # the pace of later estimates
        rows.append(row)
        writer.write({"kind": "row", **row})

    finished = False
    try:
        run.run(config, sink)  # looked up at the call: tests stand in for it
        finished = True
    except KeyboardInterrupt:
        pass
    finally:
        if finished:
            writer.finish()
        else:
            writer.close()
    return Recorded(info, ceiling, rows, path, finished)


def _named(out: str | None, info: dict) -> Path:
    """The results file out names (see record)."""
    if not out:
        return results.default_path(info)
    path = Path(out)
    if out.endswith(("/", os.sep)) or path.is_dir():
        return path / results.default_path(info, root="").name
    return path


def _resumed(path: Path, info: dict, config: run.RunConfig) -> tuple:
    """(writer appending to path, the run's provenance, its ceiling, the rows kept, the cases
    kept as (shape label, dtype name)) for --resume. A case is kept when every backend of the
    run wrote all its rows for it (a backend's step writes one row per mode and timing); the
    rows of a case cut short are dropped and it is measured again, whole, in this process. The
    file is rewritten (atomically) with the kept rows and its provenance's "resumed" list, the
    dates of the processes that continued it, then appended to."""
    provenance, ceiling, rows = results.load(path)
    if provenance.pop("cut_line", None) is not None:  # a row written in part: dropped here
        print(f"--resume {path}: its last line was written in part (the run was killed "
              "inside a write); dropped", file=sys.stderr)  # fmt: skip
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
