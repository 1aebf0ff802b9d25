"""python -m harness.host_cost: our op's host cost a call against torch.nn.functional.rms_norm's,
over a grid of shapes, as issue 30's item 5 sets its bars.

Two calls per backend and case, each timed by costs.host_us_busy (calls queued behind a long GPU
sleep, so the host clock measures only the host: Python, checks, autograd, launches):
- ``nograd``: the forward under torch.no_grad (inference);
- ``fwd_bwd``: the forward with inputs that need grad, then torch.autograd.grad of (x, w) with
  a given dy (a training step's share, without gradient accumulation).
The bars: ours / torch <= NOGRAD_BAR for nograd, <= FWD_BWD_BAR for fwd_bwd. Host speed differs
between machine starts, so only the ratios within one run mean anything.

    python -m harness.host_cost --out host-cost.json [--dtypes fp16 bf16] [--n ...] [--m ...]
"""

from __future__ import annotations

import argparse
import json
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


def measure(ns, ms, dtypes, host_us=None, device: str = "cuda", on_case=None) -> list[dict]:
    """One row per (dtype, N, M, mode): each backend's host µs, ours / torch and the verdict.
    A backend that fails at a case leaves its figure None with the error (the run goes on).
    host_us(call) -> µs (default costs.host_us_busy's median); tests pass a fake and the CPU.
    on_case(rows): called after each case with the rows so far (main saves them)."""
    from harness.calls import error_text
    from harness.costs import host_us_busy
    from impls import get_backend

    host_us = host_us or (lambda call: host_us_busy(call)["host_us"])
    built = {name: get_backend(name).build() for name in BACKENDS}
    rows = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for n in ns:
            for m in ms:
                gen = torch.Generator().manual_seed(n * 131 + m)
                x = torch.randn(m, n, generator=gen).to(device, dtype)
                w = (1 + 0.1 * torch.randn(n, generator=gen)).to(device, dtype)
                dy = torch.randn(m, n, generator=gen).to(device, dtype)
                figures: dict[str, dict] = {}
                for name, fn in built.items():
                    try:
                        figures[name] = {mode: host_us(call)
                                         for mode, call in calls(fn, x, w, dy, 1e-6).items()}  # fmt: skip
                    except Exception as exc:  # one failing backend never ends the run
                        figures[name] = {"error": error_text(exc)}
                for mode in ("nograd", "fwd_bwd"):
                    ours, ref = (figures[b].get(mode) for b in BACKENDS)
                    ratio = ours / ref if ours and ref else None
                    rows.append({"dtype": dtype_name, "n": n, "m": m, "mode": mode,
                                 "ours_us": ours, "torch_us": ref, "ratio": ratio,
                                 "met": verdict(mode, ratio),
                                 "errors": {b: f["error"] for b, f in figures.items()
                                            if "error" in f}})  # fmt: skip
                print(_line(rows[-2]), _line(rows[-1]), sep="\n", flush=True)
                if on_case is not None:
                    on_case(rows)
    return rows


def _line(row: dict) -> str:
    def us(v):
        return "   n/a" if v is None else f"{v:6.1f}"

    ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}"
    return (f"{row['dtype']} {row['m']:>5}x{row['n']:<6} {row['mode']:8s} ours {us(row['ours_us'])} "
            f"torch {us(row['torch_us'])} us  ratio {ratio}  met {row['met']}")  # fmt: skip


def summary(rows: list[dict]) -> str:
    """Markdown: per mode, how many cases meet the bar, the ratios' range and the worst case."""
    out = [
        "| call | bar | cases met | ours / torch (min-max) | worst case |",
        "|---|---|---|---|---|",
    ]
    for mode, bar in (("nograd", NOGRAD_BAR), ("fwd_bwd", FWD_BWD_BAR)):
        done = [r for r in rows if r["mode"] == mode and r["ratio"] is not None]
        if not done:
            continue
        worst = max(done, key=lambda r: r["ratio"])
        met = sum(bool(r["met"]) for r in done)
        out.append(f"| {mode} | <= {bar} | {met} of {len(done)} | "
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
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("harness.host_cost: error: needs a CUDA GPU (host time is measured against the "
              "GPU's queue); none is visible here", file=sys.stderr)  # fmt: skip
        return 2
    from harness import provenance

    info = provenance.collect()

    def save(rows):  # after every case: a run cut short keeps what it measured
        record = {"provenance": info, "bars": {"nograd": NOGRAD_BAR, "fwd_bwd": FWD_BWD_BAR},
                  "rows": rows, "summary": summary(rows)}  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1))

    rows = measure(args.n, args.m, args.dtypes, on_case=save)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
