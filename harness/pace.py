"""How long a run of harness.compare will take, said on the line before it starts: from the
pace of the newest earlier run on this GPU (its rows record when they finished), or on a CPU
from a fixed pace of the interpreter."""

from __future__ import annotations

from pathlib import Path

from harness.index import folder_runs

#: Rough seconds per step (one backend, shape and dtype) of a correctness run on a CPU, through
#: the Triton interpreter: a fixed part and a part per element of the input for a backend that
#: runs here, and the time to skip one that cannot. From a 2-core x86 machine shared with other
#: work (every rmsnorm backend, fwd and bwd checked): the cpu preset's 36 steps took 37 s;
#: 512x2048 bf16's 9 steps 17 s; 2048x4096 bf16 with triton, eager and compile 63 s.
CPU_CHECK_SECONDS = (1.0, 2.0e-6)
CPU_SKIP_SECONDS = 0.2


def estimate(
    shapes: list[tuple[int, int]], dtypes: int, backends: list, timings: list[str], gpu: str | None
) -> str:
    """'N steps (...)' and a rough time where one can be told, for the line before a run."""
    steps = len(shapes) * dtypes * len(backends)
    text = f"{steps} steps ({len(backends)} backends x {len(shapes)} shapes x {dtypes} dtypes)"
    if timings == ["check"] and gpu is None:
        fixed, per_element = CPU_CHECK_SECONDS
        runs = sum(b.unavailable() is None for b in backends)
        seconds = dtypes * sum(runs * (fixed + per_element * m * n)
                               + (len(backends) - runs) * CPU_SKIP_SECONDS
                               for m, n in shapes)  # fmt: skip
        return f"{text}, roughly {duration(seconds)} here (the oracle check through the Triton " \
               "interpreter; from a 2-core machine's pace)"  # fmt: skip
    pace = recorded_pace(gpu)
    if pace is None:
        return f"{text}; no earlier run on this GPU records its pace: the progress lines " \
               "estimate the time left from the second step"  # fmt: skip
    seconds, source = pace
    return f"{text}, roughly {duration(seconds * steps)} (the pace of {source}; wide shapes " \
           "and torch.compile's first shapes take longer)"  # fmt: skip


def recorded_pace(gpu: str | None, root: Path | None = None) -> tuple[float, str] | None:
    """Seconds per step of the newest run on this GPU whose rows record when they finished
    (rows' elapsed_s), and that file's name; a complete run first, else an interrupted one (its
    steps so far); None when no run records it (runs committed before rows carried elapsed_s do
    not). The runs: those results/<gpu>/INDEX.md lists and the folder's other *.jsonl (a run
    copied in, not yet indexed); root: the results folder."""
    from harness import results

    root = root or Path(__file__).resolve().parent.parent / "results"
    paced = []
    for path in folder_runs(root / results.gpu_slug({"gpu": gpu})):
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


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
