"""Offline tuning: sweep a grid of (direction, dtype, residual, N, M) on this GPU with the
runtime tuner forced on (every offered path measured, every kernel's configuration tuned:
dispatch.tuning, tuning.py), and write the choices as a dispatch table (dispatch_table.py).

    python -m impls.triton_rmsnorm.tune --out impls/triton_rmsnorm/tables/nvidia-h200.json

The grid: N = every power of two from 64 to 262144 and real-model hidden sizes, M's classes
1, 8, 64, 512, 4096, 16384 (M x N at most --max-elements), plus the harness presets' shapes;
bf16 and fp16 by default. --budget-s stops between points and writes what it has; --merge adds
to an existing table and skips the points it holds, so a sweep can run over several calls. The
grouped (held_group) paths are left out unless --allow-group. --merge --retune measures points
the table holds again (a path newly offered there). --repick and --repick-jointly
re-pick the forward entries of an existing table instead of sweeping (batch_invariance.py). Progress goes to stdout, one
line a point; the table is saved after every point (atomically).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

from . import (
    dispatch,
    dispatch_table,
    launch,
)
from .batch_invariance import (
    batch_invariance,
    repick_jointly,
    repick_same_bits,
    unify_by_largest_class,
)
from .dispatch_table import Table

POWERS_OF_TWO = tuple(2**k for k in range(6, 19))  # 64 .. 262144
#: Hidden sizes of current model families (Qwen2.5 0.5B-72B, Llama 3 1B-405B, Gemma, Mistral,
#: DeepSeek V3's 7168, Llama 3 405B's 16384 and 18432 of wide MLPs), between the powers of two.
MODEL_WIDTHS = (896, 1536, 2560, 3072, 3584, 5120, 6144, 7168, 12288, 18432)
M_CLASSES = (1, 8, 64, 512, 4096, 16384)
DEFAULT_MAX_ELEMENTS = 1 << 27
DTYPE_ALIASES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                 "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}  # fmt: skip
EPS = 1e-6


def _int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name}: expected integers separated by commas, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{name}: expected positive integers, got {text!r}")
    return values


def _choices(text: str, allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise argparse.ArgumentTypeError(
            f"{name}: expected some of {', '.join(allowed)}, got {text!r}"
        )
    return values


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m impls.triton_rmsnorm.tune",
        description="Sweep shapes on this GPU, measuring paths and tuning configurations, and "
        "write the choices as a dispatch table (see impls/triton_rmsnorm/dispatch_table.py).",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="the table to write (default: the committed table of this GPU, "
                        "impls/triton_rmsnorm/tables/<gpu-slug>.json)")  # fmt: skip
    parser.add_argument("--merge", action="store_true",
                        help="add to --out's entries and skip the points it holds (a sweep over "
                        "several calls); without it --out is replaced")  # fmt: skip
    parser.add_argument("--retune", action="store_true",
                        help="with --merge: measure the grid's points again where --out holds "
                        "them (a path newly offered there, say), replacing their entries; "
                        "the table's other entries are kept")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting new points after this many seconds (the table "
                        "holds every point finished)")  # fmt: skip
    parser.add_argument("--dtypes", default="bf16,fp16",
                        type=lambda t: _choices(t, tuple(DTYPE_ALIASES), "--dtypes"),
                        help="x's dtypes (weight and y take the same): bf16,fp16,fp32")  # fmt: skip
    parser.add_argument("--directions", default="fwd,bwd",
                        type=lambda t: _choices(t, dispatch_table.DIRECTIONS, "--directions"))  # fmt: skip
    parser.add_argument("--residual", default="no", choices=("no", "yes", "both"),
                        help="points with a residual add (forward) / a dh_out (backward)")  # fmt: skip
    parser.add_argument("--n", default=None, type=lambda t: _int_list(t, "--n"),
                        help="hidden sizes (default: powers of two 64..262144 and model widths)")  # fmt: skip
    parser.add_argument("--m", default=None, type=lambda t: _int_list(t, "--m"),
                        help=f"row counts (default: {','.join(map(str, M_CLASSES))})")  # fmt: skip
    parser.add_argument("--fp32-n", default="1024,2048,4096,8192",
                        type=lambda t: _int_list(t, "--fp32-n"),
                        help="the hidden sizes fp32 points take (fewer: fp32 is rarer)")  # fmt: skip
    parser.add_argument("--max-elements", type=int, default=DEFAULT_MAX_ELEMENTS,
                        help="skip grid points with M x N above this (presets' shapes are kept)")  # fmt: skip
    parser.add_argument("--no-presets", action="store_true",
                        help="leave out the harness presets' shapes")  # fmt: skip
    parser.add_argument("--allow-group", action="store_true",
                        help="measure the grouped (held_group) paths too")  # fmt: skip
    parser.add_argument("--no-batch-invariance", action="store_true",
                        help="skip the check that y's rows keep their bits across the M "
                        "classes of each forward width (batch_invariance)")  # fmt: skip
    parser.add_argument("--unify-without-gpu", action="store_true",
                        help="no measuring: in --out's table, give every forward entry of the "
                        "--dtypes and --residual chosen the path and configurations of its "
                        "width's largest M class wherever the width's entries differ (for "
                        "families the GPU check did not reach; see unify_by_largest_class)")  # fmt: skip
    parser.add_argument("--repick", action="store_true",
                        help="no sweep: in --out's table, give each forward entry of the --n "
                        "widths and --m classes (default all) below its width's largest M class "
                        "the fastest single-tile configuration that keeps that class's bits, "
                        "measured now (repick_same_bits)")  # fmt: skip
    parser.add_argument("--repick-jointly", action="store_true",
                        help="no sweep: in --out's table, give each forward width of the --n "
                        "widths (default all) whose classes all take the single tile the "
                        "reduction tree of least worst ratio to each M class's fastest time, "
                        "measured now, and each class that tree's fastest configuration "
                        "(repick_jointly)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="print the points and exit")
    return parser.parse_args(argv)


def _preset_shapes() -> list[tuple[int, int]]:
    try:
        from harness.shapes import PRESETS
    except ImportError:  # an installed package without the harness
        return []
    return [shape for name, (_, shapes) in PRESETS.items() if name != "cpu" for shape in shapes]


def grid(args: argparse.Namespace) -> list[tuple]:
    """The points (direction, dtype, residual, n, m), M at its class, in sweep order: every
    dtype and direction of one (N, M) together, N by N (model widths and presets first), so a
    budget that runs out leaves whole (N, M) pairs."""
    widths = args.n or (*MODEL_WIDTHS, *POWERS_OF_TWO)
    rows = args.m or M_CLASSES
    pairs = [] if args.no_presets or args.n or args.m else _preset_shapes()
    pairs = [(n, dispatch_table.m_class(m)) for m, n in pairs]
    pairs += [(n, m) for n in widths for m in rows if m * n <= args.max_elements]
    residuals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.residual]
    points = []
    for n, m in dict.fromkeys(pairs):
        if n > launch.MAX_N:
            continue
        for dtype in args.dtypes:
            if DTYPE_ALIASES[dtype] == torch.float32 and n not in args.fp32_n:
                continue
            for direction in args.directions:
                for residual in residuals:
                    points.append((direction, DTYPE_ALIASES[dtype], residual, n, m))
    return list(dict.fromkeys(points))


def _point_key(point: tuple) -> tuple:
    direction, dtype, residual, n, m = point
    dtypes = (dtype,) * (3 if direction == "fwd" else 4)
    return (dispatch.entry_key(direction, dtypes, residual), n, m)


def run_point(point: tuple, device: torch.device) -> None:
    """One call of the point's direction on fresh inputs, inside the tuning session (so the
    call measures and tunes, and adds its entry)."""
    direction, dtype, residual, n, m = point
    generator = torch.Generator(device=device).manual_seed(n * 131 + m)
    x = torch.randn((m, n), dtype=dtype, device=device, generator=generator)
    weight = torch.randn((n,), dtype=dtype, device=device, generator=generator)
    if direction == "fwd":
        r = torch.randn_like(x) if residual else None
        launch.rmsnorm_forward(x, weight, EPS, 0.0, None, r)
        return
    dy = torch.randn_like(x)
    dh = torch.randn_like(x) if residual else None
    rstd = torch.rsqrt(x.float().square().mean(dim=1) + EPS)
    launch.rmsnorm_backward(dy, x, weight, rstd, 0.0, dh)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.budget_s is not None and args.budget_s <= 0:
        print(
            f"--budget-s: expected a positive number of seconds, got {args.budget_s}",
            file=sys.stderr,
        )
        return 2
    if args.retune and not args.merge:
        print("--retune: re-measures points of an existing table, so it needs --merge (without "
              "it --out is replaced anyway)", file=sys.stderr)  # fmt: skip
        return 2
    if args.repick_jointly and (args.m or args.repick):
        print("--repick-jointly: re-picks every M class of a width (no --m), and not with "
              "--repick", file=sys.stderr)  # fmt: skip
        return 2
    points = grid(args)
    if args.list:
        for point in points:
            print(*_describe(point))
        print(f"{len(points)} points")
        return 0
    if args.unify_without_gpu:
        return _unify_main(args)
    if not torch.cuda.is_available():
        print("tune: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if dispatch.heuristic_only():
        print("tune: RMSNORM_TRITON_AUTOTUNE=0 is set (heuristic only); unset it", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)
    out = args.out or dispatch_table.committed_table_path(name)
    if args.repick or args.repick_jointly:
        return _repick_main(args, device, out)
    table = Table.load(out) if args.merge and out.exists() else Table()
    if args.retune:  # the session measures only calls whose class it holds no entry for
        held = {_point_key(p) for p in points}
        table = Table([e for e in table.entries() if (e.key, e.n, e.m) not in held], table.meta)
        # the table keeps its made_with; this re-tune gets a record of its own
        table.meta["retuned"] = [*table.meta.get("retuned", ()),
                                 {**_points_record(args, name), "directions": list(args.directions)}]  # fmt: skip
    else:
        table.meta = {**table.meta, "gpu": name, "made_with": _provenance(args, name)}
    todo = [p for p in points if _point_key(p) not in table]
    print(f"tune: {name}: {len(points)} points, {len(points) - len(todo)} already in {out}, "
          f"{len(todo)} to tune; budget {args.budget_s or 'none'} s", flush=True)  # fmt: skip
    table.save(out)
    start, done, failed = time.perf_counter(), 0, []
    with dispatch.tuning(out, allow_group=args.allow_group, into=table):
        for i, point in enumerate(todo):
            elapsed = time.perf_counter() - start
            if args.budget_s is not None and elapsed >= args.budget_s:
                print(f"tune: budget spent after {done} points ({elapsed:.0f} s); "
                      f"{len(todo) - i} left: run again with --merge", flush=True)  # fmt: skip
                break
            t0 = time.perf_counter()
            try:
                run_point(point, device)
                torch.cuda.synchronize()
            except Exception as error:  # one point's failure (OOM, say) never ends the sweep
                failed.append(point)
                print(f"[{i + 1}/{len(todo)}]", *_describe(point),
                      f"FAILED {type(error).__name__}: {str(error)[:300]}", flush=True)  # fmt: skip
                torch.cuda.empty_cache()
                continue
            entry = table.lookup(*_point_key(point))
            done += 1
            print(f"[{i + 1}/{len(todo)}]", *_describe(point), "->",
                  entry.path if entry else "?", (entry.configs_text() if entry else ""), f"{time.perf_counter() - t0:.2f} s",
                  flush=True)  # fmt: skip
            if done % 20 == 0:
                torch.cuda.empty_cache()
        if not args.no_batch_invariance:
            batch_invariance(table, device)
    print(f"tune: wrote {len(table)} entries to {out} ({done} new, {len(failed)} failed) in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return 1 if failed and not done else 0


def _repick_main(args: argparse.Namespace, device: torch.device, out: Path) -> int:
    if not out.exists():
        print(f"--out: expected an existing table to re-pick in, got {out}", file=sys.stderr)
        return 2
    table = Table.load(out)
    table.meta = {**table.meta, "repicked": [*table.meta.get("repicked", ()), {
        **_points_record(args, torch.cuda.get_device_name(device)),
        "jointly": bool(args.repick_jointly),
    }]}  # fmt: skip
    start = time.perf_counter()
    residuals = {"no": {False}, "yes": {True}, "both": {False, True}}[args.residual]
    dtypes = {dispatch_table.dtype_name(DTYPE_ALIASES[d]) for d in args.dtypes}
    if args.repick_jointly:
        with dispatch.tuning(out, allow_group=args.allow_group, into=table):
            changed = repick_jointly(
                table, device, set(args.n) if args.n else None, dtypes, residuals
            )
        print(f"tune: {changed} forward widths in {out} took another reduction tree "
              f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        return 0
    with dispatch.tuning(out, allow_group=args.allow_group, into=table):
        picked = repick_same_bits(
            table,
            device,
            set(args.n) if args.n else None,
            set(args.m) if args.m else None,
            dtypes,
            residuals,
        )
    print(f"tune: re-picked {picked} forward entries in {out} in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return 0


def _unify_main(args: argparse.Namespace) -> int:
    if args.out is None or not args.out.exists():
        print(f"--out: expected an existing table to unify, got {args.out}", file=sys.stderr)
        return 2
    table = Table.load(args.out)
    dtypes = {dispatch_table.dtype_name(DTYPE_ALIASES[d]) for d in args.dtypes}
    residuals = {"no": {False}, "yes": {True}, "both": {False, True}}[args.residual]
    replaced = unify_by_largest_class(table, dtypes, residuals)
    for entry in replaced:
        print(f"unified: fwd {entry.key.dtypes[0]} {'res' if entry.key.residual else '-'} "
              f"n={entry.n} m={entry.m} -> {entry.path}", flush=True)  # fmt: skip
    table.meta = {**table.meta, "unified_without_gpu": sorted(
        {*table.meta.get("unified_without_gpu", ()),
         *(f"{d}{'+res' if r else ''}" for d in dtypes for r in residuals)})}  # fmt: skip
    table.save(args.out)
    print(f"tune: {len(replaced)} forward entries of {sorted(dtypes)} unified in {args.out}")
    return 0


def _describe(point: tuple) -> tuple:
    direction, dtype, residual, n, m = point
    return (
        direction,
        dispatch_table.dtype_name(dtype),
        "res" if residual else "-",
        f"n={n}",
        f"m={m}",
    )


def _points_record(args: argparse.Namespace, name: str) -> dict:
    """A re-pick's or re-tune's record in the table's meta: the session's provenance and the
    points it chose (dtypes, residual, n and m as given, "all" where not)."""
    return {**_provenance(args, name), "dtypes": list(args.dtypes), "residual": args.residual,
            "n": list(args.n) if args.n else "all", "m": list(args.m) if args.m else "all"}  # fmt: skip


def _provenance(args: argparse.Namespace, name: str) -> dict:
    import triton

    return {
        "gpu": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "allow_group": bool(args.allow_group),
    }


if __name__ == "__main__":
    sys.exit(main())
