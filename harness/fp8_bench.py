"""python -m harness.fp8_bench: rmsnorm_fp8 beside its peers, device-only, each checked by the
fp8 oracle, with the plain bf16 forward (ours) at the same shape for the 1.1x target.

One JSON line per (case, shape, backend, mode) in --out; a table on stdout. Cases: scaling x
residual ("per_token", "per_tensor", "block", "per_tensor+res", "block+res"). Bandwidth counts
harness.traffic.fp8_counted_bytes; "copy" is a same-shape copy of x (read + write, x's dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from harness import fp8_ranking, results, traffic
from harness.inputs import DEFAULT_EPS, make_inputs
from harness.oracle_fp8 import check_fp8
from harness.shapes import PRESETS, parse_shape
from impls import all_backends, get_backend
from impls.fp8_common import Fp8Unsupported

#: Shapes for the fp8 op where harness.shapes has no preset of that name.
FP8_PRESETS = {
    "models": [(4096, n) for n in (2048, 3584, 4096, 5120, 7168, 8192)],
    "decode": [(m, n) for m in (1, 8, 32, 128) for n in (4096, 7168, 8192)],
}
CASES = ("per_token", "per_tensor", "block", "per_tensor+res", "block+res")
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _shapes(presets, explicit):
    shapes = []
    for name in presets:
        shapes += PRESETS[name][1] if name in PRESETS else FP8_PRESETS[name]
    shapes += [parse_shape(s) for s in explicit]
    return list(dict.fromkeys(shapes))


def _static_scale(x, weight, eps, fp8_dtype):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()
    return (y.abs().amax() / torch.finfo(fp8_dtype).max).reshape(1).float()


def _time(calls, stream=None):
    """Device-only time per call: the calls captured in one CUDA graph on ``stream`` (a new one
    by default; backward calls need the stream their forwards ran on)."""
    from harness import timing

    stream = stream or torch.cuda.Stream()
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream)


def _sets(shape, dtype, eps, residual, fp8_dtype):
    m, n = shape
    count = 1
    if torch.cuda.is_available():
        from harness.timing import rotating_sets

        count = rotating_sets(traffic.counted_bytes("fwd", m, n, dtype.itemsize))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sets = [make_inputs(shape, dtype, device, eps=eps, seed=1000 + i, with_residual=residual)
            for i in range(count)]  # fmt: skip
    return sets, _static_scale(sets[0].x, sets[0].weight, eps, fp8_dtype)


def _case_rows(backend, fn, case, shape, dtype, fp8_dtype, sets, scale, modes, eps):
    scaling, _, res = case.partition("+")
    residual = res == "res"
    m, n = shape

    def call(s, r=None):
        return fn(s.x, s.weight, eps, scaling=scaling, scale=scale if scaling == "per_tensor"
                  else None, residual=r, fp8_dtype=fp8_dtype)  # fmt: skip

    base = {"backend": backend.name, "case": case, "shape": f"{m}x{n}", "m": m, "n": n,
            "dtype": str(dtype).removeprefix("torch."), "fp8": str(fp8_dtype).removeprefix(
                "torch.")}  # fmt: skip
    s0 = sets[0]
    try:
        r0 = s0.residual.clone() if residual else None  # in-place peers update it: h
        q, scales, h, _port = call(s0, r0)
        reports = check_fp8(q, scales, s0.x, s0.weight, eps, scaling=scaling,
                            fp8_dtype=fp8_dtype, numerics=backend.numerics,
                            static_scale=scale if scaling == "per_tensor" else None,
                            normalized=h)  # fmt: skip
        verdict = {"oracle_passed": all(r.passed for r in reports),
                   "oracle": "; ".join(r.summary() for r in reports)}  # fmt: skip
    except Fp8Unsupported as exc:
        yield {**base, "mode": "fwd", "status": "unsupported", "reason": str(exc)}
        return
    except Exception as exc:
        yield {**base, "mode": "fwd", "status": "error", "reason": f"{type(exc).__name__}: "
               f"{str(exc).splitlines()[0][:300] if str(exc) else ''}"}  # fmt: skip
        return
    if not torch.cuda.is_available():
        yield {**base, "mode": "fwd", "status": "checked", **verdict}
        return
    for mode in modes:
        row = {**base, "mode": mode, **verdict}
        try:
            if mode == "fwd":
                rs = [s.residual.clone() if residual else None for s in sets]
                calls = [lambda s=s, r=r: call(s, r) for s, r in zip(sets, rs, strict=True)]
            else:
                if not backend.has_backward:
                    yield {**row, "status": "forward-only", "reason": "no backward"}
                    continue
                calls, stream = [], torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                for s in sets:
                    x = s.x.detach().requires_grad_(True)
                    w = s.weight.detach().requires_grad_(True)
                    r = s.residual.detach().requires_grad_(True) if residual else None
                    with torch.cuda.stream(stream):  # autograd replays on the forward's stream
                        _q, _s, h, port = fn(
                            x,
                            w,
                            eps,
                            scaling=scaling,
                            scale=scale if scaling == "per_tensor" else None,
                            residual=r,
                            fp8_dtype=fp8_dtype,
                        )
                    outs, grads = ((port, h), (s.dy, s.dh)) if residual else ((port,), (s.dy,))
                    leaves = (x, w, r) if residual else (x, w)
                    calls.append(lambda o=outs, lv=leaves, g=grads: torch.autograd.grad(
                        o, lv, g, retain_graph=True))  # fmt: skip
            t = _time(calls, stream if mode == "bwd" else None)
        except Exception as exc:
            torch.cuda.synchronize()
            yield {**row, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        nbytes = traffic.fp8_counted_bytes(mode, m, n, dtype.itemsize, scaling=scaling,
                                           residual=residual)  # fmt: skip
        yield {**row, "status": "ok", "ms": t.ms, "p20": t.p20, "p80": t.p80, "bytes": nbytes,
               "gbps": traffic.gbps(nbytes, t.ms)}  # fmt: skip


def _plain_rows(shape, dtype, sets, eps):
    """Our plain forward (y in x's dtype; with the residual add too where the sets have one)
    and a same-shape copy: the 1.1x bar and the ceiling."""
    from harness.ceiling import triton_copy
    from impls.triton_rmsnorm import rmsnorm

    m, n = shape
    base = {"case": "plain", "shape": f"{m}x{n}", "m": m, "n": n, "mode": "fwd",
            "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip
    t = _time([lambda s=s: rmsnorm(s.x, s.weight, eps) for s in sets])
    nbytes = traffic.counted_bytes("fwd", m, n, dtype.itemsize)
    yield {**base, "backend": "triton", "status": "ok", "ms": t.ms, "bytes": nbytes,
           "gbps": traffic.gbps(nbytes, t.ms)}  # fmt: skip
    if sets[0].residual is not None:  # the +res cases' bar: the plain forward with the add
        t = _time([lambda s=s: rmsnorm(s.x, s.weight, eps, residual=s.residual) for s in sets])
        nbytes = traffic.counted_bytes("fwd", m, n, dtype.itemsize, "add_rmsnorm")
        yield {**base, "backend": "triton-add", "status": "ok", "ms": t.ms, "bytes": nbytes,
               "gbps": traffic.gbps(nbytes, t.ms)}  # fmt: skip
    outs = [torch.empty_like(s.x) for s in sets]
    t = _time([lambda s=s, o=o: triton_copy(s.x, o) for s, o in zip(sets, outs, strict=True)])
    nbytes = traffic.copy_bytes(m, n, dtype.itemsize)
    yield {**base, "backend": "copy", "status": "ok", "ms": t.ms, "bytes": nbytes,
           "gbps": traffic.gbps(nbytes, t.ms)}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.fp8_bench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--preset", nargs="*", default=["seed", "models", "decode"])
    p.add_argument("--shape", nargs="+", default=[])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--fp8", default="e4m3", choices=list(FP8))
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument("--backends", nargs="+", default=None)
    p.add_argument(
        "--compile-cases",
        nargs="*",
        default=None,
        choices=list(CASES),
        help="cases torch.compile runs (default: all; each shape and case compiles)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no new shape after this many seconds (rows say so)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON-lines results file")
    p.add_argument("--from", dest="from_file", type=Path, default=None, metavar="FILE",
                   help="rank a stored run (harness.fp8_ranking's table) without measuring")  # fmt: skip
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="FILE",
        help="continue a run cut short (a time budget, a call's limit) in its own file: the "
        "shapes it finished are kept, the rest measured with its options (same commit and "
        "versions required)",
    )
    args = p.parse_args(argv)
    if args.from_file is not None:
        return _rank_stored(p, args.from_file)
    kept, done = [], set()
    if args.resume is not None:
        if args.out is not None or _argv_sets_options(argv):
            p.error("argument --resume: the run's options come from its file; give it alone "
                    "(or with --budget-s, this call's own budget)")  # fmt: skip
        budget = args.budget_s
        kept, done, args = _resume(p, args)
        if budget is not None:
            args.budget_s = budget
    elif args.out is None:
        p.error("argument --out is required (or --resume FILE)")
    started = time.perf_counter()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    fp8_dtype = FP8[args.fp8]
    backends = ([get_backend(b) for b in args.backends] if args.backends
                else all_backends("rmsnorm_fp8"))  # fmt: skip
    eps = DEFAULT_EPS
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    from harness import provenance

    info = {"case": "provenance", "status": "info", **provenance.collect(),
            "flashinfer": provenance._version("flashinfer-python"), "fp8_table": _fp8_table(),
            "config": _config(args)}  # fmt: skip
    if args.resume is not None:
        _check_same_run(p, kept[0], info)
        kept[0] = {**kept[0], "resumed": [*kept[0].get("resumed", []), info["date"]]}
    if kept:  # the kept rows first, atomically; then the rest is appended
        results.rewrite(args.out, kept)
        rows.extend(kept)
    with args.out.open("a" if kept else "w") as sink:

        def emit(row):
            rows.append(row)
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        if not kept:
            emit(info)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        for b in backends if not kept else ():
            reason = b.skip_reason((1, 1), dtype, device)
            if reason:
                emit({"backend": b.name, "case": "all", "status": "not-run", "reason": reason})
        runnable = [b for b in backends if b.skip_reason((1, 1), dtype, device) is None]
        built = {}
        for shape in _shapes(args.preset, args.shape):
            if f"{shape[0]}x{shape[1]}" in done:
                continue
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                emit(
                    {
                        "backend": "all",
                        "case": "all",
                        "shape": f"{shape[0]}x{shape[1]}",
                        "status": "not-run",
                        "reason": f"time budget ({args.budget_s:g} s)",
                    }
                )
                continue
            needs_res = any(c.endswith("+res") for c in args.cases)
            sets, scale = _sets(shape, dtype, eps, needs_res, fp8_dtype)
            if torch.cuda.is_available():
                try:
                    for row in _plain_rows(shape, dtype, sets, eps):
                        emit(row)
                except Exception as exc:
                    print(f"plain forward / copy failed: {exc}", file=sys.stderr)
            for case in args.cases:
                for b in runnable:
                    if (
                        b.name == "compile-fp8"
                        and args.compile_cases is not None
                        and (case not in args.compile_cases)
                    ):
                        continue
                    elapsed = time.perf_counter() - started
                    print(f"[{elapsed:5.0f}s] {shape} {case} {b.name}", file=sys.stderr, flush=True)
                    fn = built.get(b.name) if b.name != "compile-fp8" else None
                    if fn is None:
                        try:
                            fn = built[b.name] = b.build()
                        except Exception as exc:  # a reason in the rows, never a crash
                            emit(
                                {
                                    "backend": b.name,
                                    "case": case,
                                    "shape": f"{shape[0]}x{shape[1]}",
                                    "mode": "fwd",
                                    "status": "error",
                                    "reason": f"build: {type(exc).__name__}: {exc}"[:300],
                                }
                            )
                            continue
                    for row in _case_rows(b, fn, case, shape, dtype, fp8_dtype, sets, scale,
                                          args.modes, eps):  # fmt: skip
                        emit(row)
            del sets
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
            emit({"case": "shape-done", "status": "info", "shape": f"{shape[0]}x{shape[1]}"})
    _print_table(rows)
    print()
    print(fp8_ranking.table(rows))
    return 0


def _rank_stored(parser, path: Path) -> int:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"argument --from: {path}: not a fp8_bench results file ({exc})")
    if not rows or rows[0].get("case") != "provenance":
        parser.error(f"argument --from: {path}: not a fp8_bench results file (no provenance)")
    head = rows[0]
    print(f"{path}: commit {head.get('commit')}, {head.get('gpu')}, {head.get('date')}")
    print(fp8_ranking.table(rows))
    return 0


def _fp8_table() -> dict | None:
    """The fp8 launch table our op read in this run: its file and sha256 (None: no table)."""
    if not torch.cuda.is_available():
        return None
    from harness.provenance import table_record
    from impls.triton_rmsnorm import common, fp8_table

    return table_record(fp8_table.committed_path(common.gpu_name(torch.cuda.current_device())))


#: The options a run records ("config" in its provenance) and --resume takes back.
_OPTIONS = ("preset", "shape", "dtype", "fp8", "cases", "modes", "backends", "compile_cases",
            "budget_s")  # fmt: skip


def _config(args) -> dict:
    return {name: getattr(args, name) for name in _OPTIONS}


def _argv_sets_options(argv) -> bool:
    """Whether the command line gives an option beside --resume."""
    argv = sys.argv[1:] if argv is None else argv
    return any(a.startswith("--") and a.split("=")[0] not in ("--resume", "--budget-s")
               for a in argv)  # fmt: skip


def _resume(parser, args):
    """(rows to keep, shapes done, args with the file's options): a shape is done when its
    "shape-done" record is in; rows of shapes cut short, and "not run" budget rows, go."""
    from harness import results

    path = args.resume
    try:
        records, cut_line = results.json_lines(path.read_text(), path)
    except (OSError, ValueError) as exc:
        parser.error(f"argument --resume: {path}: not a fp8_bench results file ({exc})")
    if cut_line is not None:  # the shape it belonged to has no "shape-done" record: redone
        print(f"--resume {path}: line {cut_line} was written in part (the run was killed "
              "inside a write); dropped", file=sys.stderr)  # fmt: skip
    if not records or records[0].get("case") != "provenance" or "config" not in records[0]:
        parser.error(f"argument --resume: {path} does not record its options (written before "
                     "--resume existed, or not a fp8_bench file)")  # fmt: skip
    done = {r["shape"] for r in records if r.get("case") == "shape-done"}
    kept = [r for r in records if r.get("case") == "provenance"
            or (r.get("case") == "all" and r.get("shape") is None)
            or r.get("shape") in done]  # fmt: skip
    for name, value in records[0]["config"].items():
        setattr(args, name, value)
    args.out = path
    return kept, done, args


def _check_same_run(parser, stored: dict, info: dict) -> None:
    from harness.provenance import run_differences

    what = run_differences(stored, info, ("fp8_table",))  # flashinfer's among the versions
    if what:
        parser.error(f"argument --resume: not the same run ({what}); start a new one")


def _print_table(rows):
    plain = {(r["shape"], r["backend"]): r for r in rows if r.get("case") == "plain"}
    print("| case | shape | mode | backend | µs | GB/s | % copy | x plain fwd | oracle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("case") in ("plain", "all", "provenance", "shape-done"):
            continue
        if r["status"] != "ok":
            print(f"| {r['case']} | {r['shape']} | {r['mode']} | {r['backend']} | "
                  f"{r['status']}: {r.get('reason') or r.get('oracle', '')} | | | | |")  # fmt: skip
            continue
        copy = plain.get((r["shape"], "copy"))
        fwd, _without_residual = fp8_ranking.plain_forward(plain, r["shape"], r["case"])
        pct = f"{100 * r['gbps'] / copy['gbps']:.0f}" if copy else ""
        ratio = f"{r['ms'] / fwd['ms']:.2f}" if fwd and r["mode"] == "fwd" else ""
        verdict = "ok" if r.get("oracle_passed") else f"FAIL {r.get('oracle', '')}"
        print(
            f"| {r['case']} | {r['shape']} | {r['mode']} | {r['backend']} | "
            f"{1e3 * r['ms']:.1f} | {r['gbps']:.0f} | {pct} | {ratio} | {verdict} |"
        )
    for r in rows:
        if r.get("case") == "all":
            print(f"not run: {r['backend']} {r.get('shape', '')}: {r['reason']}")


if __name__ == "__main__":
    raise SystemExit(main())
