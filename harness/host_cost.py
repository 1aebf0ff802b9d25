"""python -m harness.host_cost: our op's host cost a call against torch.nn.functional.rms_norm's,
over a grid of shapes, as issue 30's item 5 sets its bars.

Two calls per backend and case, each sampled by costs.host_us_busy (calls queued behind a long GPU
sleep, so the host clock measures only the host: Python, checks, autograd, launches), ours and
torch's in turn within each round, so that the ratio is one of samples taken back to back:
- ``nograd``: the forward under torch.no_grad (inference);
- ``fwd_bwd``: the forward with inputs that need grad, then torch.autograd.grad of (x, w) with
  a given dy (a training step's share, without gradient accumulation).
The bars: ours / torch <= NOGRAD_BAR for nograd, <= FWD_BWD_BAR for fwd_bwd. Host speed differs
between machine starts, so only the ratios within one run mean anything: --host-paths times
ours under each host path in the same run (python: Python's replays; cpp: the C++ host path,
impls/triton_rmsnorm/host_path.py, built beforehand with python -m impls.triton_rmsnorm.build_host),
one row per path; by default, the process's own.

    python -m harness.host_cost --out host-cost.json [--dtypes fp16 bf16] [--n ...] [--m ...]
        [--host-paths cpp python]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

NOGRAD_BAR = 1.0
FWD_BWD_BAR = 1.2
DEFAULT_N = (2048, 4096, 8192, 16384)
DEFAULT_M = (1, 64, 512, 2048, 8192)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: The backends compared: ours first, then the reference (registry names).
BACKENDS = ("triton", "torch")
#: The host paths ours can be timed under (impls/triton_rmsnorm/host_path.py). The C++ one is
#: timed first at each case: its first call records the case's replays and registers them,
#: which Python's path then replays.
HOST_PATHS = ("cpp", "python")


def calls(fn, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, eps: float) -> dict:
    """The two timed calls of one backend on one case (see the module docstring)."""
    xd, wd = x.detach(), w.detach()
    xg, wg = xd.clone().requires_grad_(True), wd.clone().requires_grad_(True)

    def nograd():
        with torch.no_grad():
            return fn(xd, wd, eps)

    def fwd_bwd():
        return torch.autograd.grad(fn(xg, wg, eps), (xg, wg), dy)

    return {"nograd": nograd, "fwd_bwd": fwd_bwd}


def verdict(mode: str, ratio: float | None) -> bool | None:
    if ratio is None:
        return None
    return ratio <= (NOGRAD_BAR if mode == "nograd" else FWD_BWD_BAR)


def _sample_rounds(contenders: list, host_us, rounds: int) -> tuple[dict, dict]:
    """Interleaved samples: in each of `rounds` rounds, one host_us(call) sample of every
    contender in turn (label, call, context to take it in), so that host speed drifting during
    a case falls on all of them alike. (label -> samples, label -> error text); a contender that
    fails is left out of the later rounds (the run goes on)."""
    from harness.calls import error_text

    samples = {label: [] for label, _call, _context in contenders}
    errors = {}
    for _ in range(rounds):
        for label, call, context in contenders:
            if label in errors:
                continue
            try:
                with context():
                    samples[label].append(host_us(call))
            except Exception as exc:  # one failing backend never ends the run
                errors[label] = error_text(exc)
    return samples, errors


def measure(ns, ms, dtypes, host_us=None, device: str = "cuda", on_case=None,
            host_paths: tuple | None = None, rounds: int | None = None) -> list[dict]:  # fmt: skip
    """One row per (dtype, N, M, host path, mode): ours' host µs under that host path, torch's
    (medians of `rounds` samples, default costs.REPEATS), ours / torch (the median of the
    rounds' ratios: each round samples ours and torch back to back) and the verdict. A backend
    that fails at a case leaves its figure None with the error (the run goes on).
    host_us(call) -> µs of one sample (default: costs.host_us_busy with one repeat); tests pass
    a fake and the CPU. on_case(rows): called after each case with the rows so far (main saves
    them). host_paths: of HOST_PATHS (default: the process's own); "cpp" needs the C++ host path
    on (host_path.turn_on); in each round it is sampled first (see HOST_PATHS)."""
    from harness import costs
    from impls import get_backend
    from impls.triton_rmsnorm import host_path

    host_us = host_us or (lambda call: costs.host_us_busy(call, repeats=1)["host_us"])
    rounds = rounds or costs.REPEATS
    host_paths = tuple(p for p in HOST_PATHS if p in (host_paths or (host_path.current(),)))
    if "cpp" in host_paths and host_path.current() != "cpp":
        raise RuntimeError("host_cost: the C++ host path is not on (host_path.turn_on())")
    ours, reference = (get_backend(name).build() for name in BACKENDS)
    ours_name, torch_name = BACKENDS
    rows = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for n in ns:
            for m in ms:
                gen = torch.Generator().manual_seed(n * 131 + m)
                x = torch.randn(m, n, generator=gen).to(device, dtype)
                w = (1 + 0.1 * torch.randn(n, generator=gen)).to(device, dtype)
                dy = torch.randn(m, n, generator=gen).to(device, dtype)
                ours_calls = calls(ours, x, w, dy, 1e-6)
                torch_calls = calls(reference, x, w, dy, 1e-6)
                per_path = {path: [] for path in host_paths}
                for mode in ("nograd", "fwd_bwd"):
                    contenders = [(path, ours_calls[mode], contextlib.nullcontext if path == "cpp"
                                   else host_path.set_aside) for path in host_paths]  # fmt: skip
                    contenders.append(("torch", torch_calls[mode], contextlib.nullcontext))
                    samples, failed = _sample_rounds(contenders, host_us, rounds)
                    for path in host_paths:
                        errors = {name: failed[label] for name, label in
                                  ((ours_name, path), (torch_name, "torch")) if label in failed}  # fmt: skip
                        mine = None if path in failed else statistics.median(samples[path])
                        ref = None if "torch" in failed else statistics.median(samples["torch"])
                        ratios = ([a / b for a, b in zip(samples[path], samples["torch"],
                                                         strict=True)]
                                  if mine and ref else [])  # fmt: skip
                        ratio = statistics.median(ratios) if ratios else None
                        per_path[path].append({
                            "dtype": dtype_name, "n": n, "m": m, "mode": mode, "host_path": path,
                            "ours_us": mine, "torch_us": ref, "ratio": ratio,
                            "round_ratios": [round(r, 3) for r in ratios],
                            "met": verdict(mode, ratio), "errors": errors})  # fmt: skip
                for path in host_paths:
                    for row in per_path[path]:
                        rows.append(row)
                        print(_line(row), flush=True)
                if on_case is not None:
                    on_case(rows)
    return rows


def _line(row: dict) -> str:
    def us(v):
        return "   n/a" if v is None else f"{v:6.1f}"

    ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}"
    return (f"{row['dtype']} {row['m']:>5}x{row['n']:<6} {row['mode']:8s} "
            f"ours ({row.get('host_path', 'python')}) {us(row['ours_us'])} "
            f"torch {us(row['torch_us'])} us  ratio {ratio}  met {row['met']}")  # fmt: skip


def summary(rows: list[dict]) -> str:
    """Markdown: per host path and mode, how many cases meet the bar, the ratios' range and the
    worst case."""
    out = [
        "| host path | call | bar | cases met | ours / torch (min-max) | worst case |",
        "|---|---|---|---|---|---|",
    ]
    paths = [p for p in HOST_PATHS if any(r.get("host_path", "python") == p for r in rows)]
    for path in paths:
        for mode, bar in (("nograd", NOGRAD_BAR), ("fwd_bwd", FWD_BWD_BAR)):
            done = [r for r in rows if r["mode"] == mode and r["ratio"] is not None
                    and r.get("host_path", "python") == path]  # fmt: skip
            if not done:
                continue
            worst = max(done, key=lambda r: r["ratio"])
            met = sum(bool(r["met"]) for r in done)
            out.append(f"| {path} | {mode} | <= {bar} | {met} of {len(done)} | "
                       f"{min(r['ratio'] for r in done):.2f}-{worst['ratio']:.2f} | "
                       f"{worst['dtype']} {worst['m']}x{worst['n']} |")  # fmt: skip
    return "\n".join(out)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.host_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp16", "bf16"])
    parser.add_argument("--n", nargs="+", type=_positive, default=list(DEFAULT_N))
    parser.add_argument("--m", nargs="+", type=_positive, default=list(DEFAULT_M))
    parser.add_argument("--host-paths", nargs="+", choices=HOST_PATHS, default=None,
                        help="time ours under each (default: the process's own; cpp turns the "
                        "built C++ host path on)")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("harness.host_cost: error: needs a CUDA GPU (host time is measured against the "
              "GPU's queue); none is visible here", file=sys.stderr)  # fmt: skip
        return 2
    from harness import provenance
    from impls.triton_rmsnorm import host_path

    wants_cpp = "cpp" in (args.host_paths or ()) and host_path.current() != "cpp"
    if wants_cpp and not host_path.turn_on():
        print(f"harness.host_cost: error: --host-paths cpp: the C++ host path is off "
              f"({host_path.unavailable_reason()})", file=sys.stderr)  # fmt: skip
        return 2
    info = provenance.collect()

    def save(rows):  # after every case: a run cut short keeps what it measured
        record = {"provenance": info, "bars": {"nograd": NOGRAD_BAR, "fwd_bwd": FWD_BWD_BAR},
                  "rows": rows, "summary": summary(rows)}  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1))

    rows = measure(args.n, args.m, args.dtypes, on_case=save, host_paths=args.host_paths)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
