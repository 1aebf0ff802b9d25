"""Offline tuning: sweep a grid of (direction, dtype, residual, N, M) on this GPU with the
runtime tuner forced on (every offered path measured, every kernel's configuration tuned:
dispatch.tuning, tuning.py), and write the choices as a dispatch table (dispatch_table.py).

    python -m impls.triton_rmsnorm.tune --out impls/triton_rmsnorm/tables/nvidia-h200.json

The grid: N = every power of two from 64 to 262144 and real-model hidden sizes, M's classes
1, 8, 64, 512, 4096, 16384 (M x N at most --max-elements), plus the harness presets' shapes;
bf16 and fp16 by default. --budget-s stops between points and writes what it has; --merge adds
to an existing table and skips the points it holds, so a sweep can run over several calls. The
grouped (cooperative) paths are left out unless --allow-group. Progress goes to stdout, one
line a point; the table is saved after every point (atomically).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from . import (
    common,
    configs,
    dispatch,
    dispatch_table,
    forward_launch,
    kernel_launch,
    kernels,
    launch,
    tuning,
)
from .dispatch_table import Entry, Table

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
                        help="measure the grouped (cooperative-launch) paths too")  # fmt: skip
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
    if args.repick:
        return _repick_main(args, device, out)
    table = Table.load(out) if args.merge and out.exists() else Table()
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
                  entry.path if entry else "?", _short(entry), f"{time.perf_counter() - t0:.2f} s",
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
        **_provenance(args, torch.cuda.get_device_name(device)),
        "dtypes": list(args.dtypes), "residual": args.residual,
        "n": list(args.n) if args.n else "all", "m": list(args.m) if args.m else "all",
    }]}  # fmt: skip
    start = time.perf_counter()
    with dispatch.tuning(out, allow_group=args.allow_group, into=table):
        picked = repick_same_bits(
            table,
            device,
            set(args.n) if args.n else None,
            set(args.m) if args.m else None,
            {dispatch_table.dtype_name(DTYPE_ALIASES[d]) for d in args.dtypes},
            {"no": {False}, "yes": {True}, "both": {False, True}}[args.residual],
        )
    print(f"tune: re-picked {picked} forward entries in {out} in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return 0


def unify_by_largest_class(table: Table, dtypes: set[str], residuals: set[bool]) -> list[Entry]:
    """Without a GPU: each forward width (of the dtypes and residual flags given) whose entries
    pick more than one (path, configurations) gets its largest M class's pick at every M class,
    so every M runs the same code on a row: the reduction order, hence y's bits, then no longer
    depend on M. batch_invariance does this only where a GPU saw the bits differ (keeping a
    faster pick where they agree); this rule is the blunt form, for families that check did
    not reach. Returns the entries replaced (already added to table)."""
    replaced = []
    for (key, n), entries in forward_families(table, None, dtypes, residuals).items():
        ref = max(entries, key=lambda e: e.m)
        for entry in entries:
            if (entry.path, entry.configs) != (ref.path, ref.configs):
                unified = Entry(key, n, entry.m, ref.path, ref.configs)
                table.add(unified)
                replaced.append(unified)
    return replaced


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


#: Rows of y compared across M classes per forward width (batch_invariance).
INVARIANCE_ROWS = 1024


@torch.no_grad()
def batch_invariance(table: Table, device: torch.device) -> None:
    """Make each forward width's entries give a row the same y bits at every M class. For each
    (dtypes, residual, N) whose entries pick more than one (path, configurations): y of
    INVARIANCE_ROWS probe rows from the entry of the largest M class (one call of its M rows)
    against y of the same rows from each other entry (calls of its M rows, chunk after chunk),
    through the runtime's dispatch (inside the tuning session, which serves the entries). An
    entry whose rows differ takes the fastest single-tile configuration that keeps the largest
    class's bits, else that class's path and configurations (_take_same_bits), and the check
    runs again. Run inside the tuning session."""
    families = forward_families(table)
    replaced = checked = 0
    for (key, n), entries in families.items():
        choices = {(e.path, json.dumps(e.configs, sort_keys=True)) for e in entries}
        if len(choices) == 1:
            continue  # one path and configuration at every M: the same code for every row
        ref = max(entries, key=lambda e: e.m)
        x, w, r, rows, want = _family_probe(key, n, ref, device)
        for entry in entries:
            if entry is ref:
                continue
            checked += 1
            if torch.equal(_y_rows(x, w, r, rows, entry.m), want):
                continue
            replaced += 1
            taken = _take_same_bits(key, n, entry.m, ref, x, w, r, rows, want)
            print(f"batch invariance: fwd {key.dtypes[0]} {'res' if key.residual else '-'} "
                  f"n={n} m={entry.m}: {entry.path} gave other bits than m={ref.m}'s "
                  f"{ref.path}; takes {taken}", flush=True)  # fmt: skip
    print(f"batch invariance: {checked} entries checked, {replaced} replaced", flush=True)
    varying = []
    for entry in table.entries():
        if entry.key.direction == "bwd":
            families.setdefault((entry.key, entry.n), []).append(entry)
    for (key, n), entries in families.items():
        if (
            key.direction == "bwd"
            and len({(e.path, json.dumps(e.configs, sort_keys=True)) for e in entries}) > 1
        ):
            varying.append(f"{key.dtypes[0]}{'+dh' if key.residual else ''} n={n}")
    print(f"backward widths whose path or configurations change with M (dx rows may differ "
          f"between M classes there): {', '.join(varying) or 'none'}", flush=True)  # fmt: skip


def forward_families(table: Table, widths=None, dtypes=None, residuals=None) -> dict:
    """The table's forward entries by family, (key, N) -> entries, of these widths, dtypes
    (names) and residual flags (each None: all)."""
    families: dict[tuple, list[Entry]] = {}
    for entry in table.entries():
        key = entry.key
        if (
            key.direction == "fwd"
            and (widths is None or entry.n in widths)
            and (dtypes is None or key.dtypes[0] in dtypes)
            and (residuals is None or key.residual in residuals)
        ):
            families.setdefault((key, entry.n), []).append(entry)
    return families


def _family_probe(key, n: int, ref, device: torch.device) -> tuple:
    """A forward family's probe: x of ref.m rows (its largest class), w, r (with a residual),
    the rows compared, and y of those rows from one call of ref.m rows (what every class of the
    width must give)."""
    rows = min(ref.m, INVARIANCE_ROWS)
    dtype = dispatch_table.parse_dtype(key.dtypes[0])
    generator = torch.Generator(device=device).manual_seed(n)
    x = torch.randn((ref.m, n), dtype=dtype, device=device, generator=generator)
    w = torch.randn((n,), dtype=dtype, device=device, generator=generator)
    r = torch.randn_like(x) if key.residual else None
    return x, w, r, rows, _y_rows(x, w, r, rows, ref.m)


@torch.no_grad()
def repick_same_bits(
    table: Table, device: torch.device, widths, row_classes, dtypes=None, residuals=None
) -> int:
    """Each forward entry at these widths and M classes, of these dtypes (names) and residual
    flags (each None: all), below its family's largest
    class takes the fastest single-tile configuration that gives a row the largest class's
    bits, measured now (_take_same_bits): for a table tuned before a change to the kernel or its
    launch (programmatic dependent launch, say) made other configurations faster. Families
    whose largest class is another path keep their entries. Run inside the tuning session.
    Returns the entries re-picked."""
    picked = 0
    for (key, n), entries in forward_families(table, widths, dtypes, residuals).items():
        ref = max(entries, key=lambda e: e.m)
        todo = [e for e in entries if e is not ref and (row_classes is None or e.m in row_classes)]
        if not todo or ref.path != "single_tile":
            continue
        x, w, r, rows, want = _family_probe(key, n, ref, device)
        for entry in todo:
            t0 = time.perf_counter()
            taken = _take_same_bits(key, n, entry.m, ref, x, w, r, rows, want)
            picked += 1
            print(f"repick: fwd {key.dtypes[0]} {'res' if key.residual else '-'} n={n} "
                  f"m={entry.m}: was {_short(entry)}; takes {taken} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    return picked


#: The kernel whose configurations same_bits_configs re-picks (the plain single-tile forward).
SINGLE_TILE_FORWARD = "rmsnorm_fwd_kernel"


def _take_same_bits(key, n: int, m: int, ref, x, w, r, rows: int, want) -> str:
    """Give the entry at m the fastest single-tile configuration whose rows keep want's bits
    (same_bits_configs), else ref's path and configurations; add it to the session's table and
    check through the runtime's dispatch that a default call now gives want. Says what it took."""
    picked = fastest_same_bits(n, m, ref, x, w, r, rows, want)
    if picked is not None:
        dispatch.add_entry(
            dispatch_table.Entry(key, n, m, "single_tile", {SINGLE_TILE_FORWARD: picked})
        )
        if torch.equal(_y_rows(x, w, r, rows, m), want):
            return f"single_tile {picked} (the fastest with m={ref.m}'s bits)"
    dispatch.add_entry(dispatch_table.Entry(key, n, m, ref.path, ref.configs))
    same = torch.equal(_y_rows(x, w, r, rows, m), want)
    return f"m={ref.m}'s choice ({'same bits now' if same else 'STILL DIFFERENT'})"


def same_bits_configs(n: int, m: int, x, w, r, rows: int, want, also=()) -> list[dict]:
    """The plain single-tile forward's configurations tried at m rows (the runtime tuner's
    candidates, launch._candidates, and those of `also` not among them) whose y rows, computed
    in calls of m rows forced at each (dispatch.override), are bitwise want: the same reduction
    tree as want's, whatever their grid, pipelining or rows a tile."""
    xm = x[:m]
    rm = None if r is None else r[:m]
    y = torch.empty_like(xm)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    strides = (n, n, n, n)
    args = forward_launch._single_tile_forward_args(
        xm, w, y, rstd, xm if rm is None else rm, xm if rm is None else torch.empty_like(xm),
        strides, EPS, 0.0,
    )  # fmt: skip
    switches = forward_launch.plain_forward_launch_switches(xm, y, rstd, rm is not None, strides)
    candidates = launch._candidates(SINGLE_TILE_FORWARD, args, switches)
    candidates += [c for c in also if c not in candidates]
    if not common.interpreting():  # every candidate compiled at once, as a tuning does

        def grid(meta):
            return (configs._tile_programs(m, meta, x.device),)

        kernel_launch._compile_in_parallel(getattr(kernels, SINGLE_TILE_FORWARD), args, [
            configs._kernel_grid_and_meta(SINGLE_TILE_FORWARD, grid, {**switches, **config})
            for config in candidates
        ])  # fmt: skip
    kept = []
    for config in candidates:
        with dispatch.override(forward="single_tile",
                               forward_configs={SINGLE_TILE_FORWARD: config}):  # fmt: skip
            if torch.equal(_y_rows(x, w, r, rows, m), want):
                kept.append(config)
    return kept


def fastest_same_bits(n: int, m: int, ref, x, w, r, rows: int, want) -> dict | None:
    """The fastest of same_bits_configs at m rows by the tuner's own timer (tuning.fastest, two
    passes), ref's configuration tried with the candidates; None where ref is another path
    (its bits come from another kernel) or no configuration keeps the bits."""
    if ref.path != "single_tile" or set(ref.configs) != {SINGLE_TILE_FORWARD}:
        return None
    candidates = same_bits_configs(n, m, x, w, r, rows, want, [ref.configs[SINGLE_TILE_FORWARD]])
    if not candidates:
        return None

    def run(config, a):
        with dispatch.override(forward="single_tile",
                               forward_configs={SINGLE_TILE_FORWARD: config}):  # fmt: skip
            launch.rmsnorm_forward(a[0], a[1], EPS, 0.0, None, a[2])

    return tuning.fastest(candidates, run, (x[:m], w, None if r is None else r[:m]), passes=2)


def _y_rows(x, w, r, rows: int, m: int) -> torch.Tensor:
    """y of x's first `rows` rows, computed in calls of m rows each (the last may be short)."""
    chunks = []
    for start in range(0, rows, m):
        stop = min(start + m, x.shape[0])
        part = None if r is None else r[start:stop]
        chunks.append(launch.rmsnorm_forward(x[start:stop], w, EPS, 0.0, None, part)[0])
    return torch.cat(chunks)[:rows]


def _describe(point: tuple) -> tuple:
    direction, dtype, residual, n, m = point
    return (
        direction,
        dispatch_table.dtype_name(dtype),
        "res" if residual else "-",
        f"n={n}",
        f"m={m}",
    )


def _short(entry) -> str:
    if entry is None:
        return ""
    parts = []
    for kernel, config in entry.configs.items():
        kernel = kernel.removeprefix("rmsnorm_").removesuffix("_kernel")
        parts.append(kernel + ":" + ",".join(f"{k}={v}" for k, v in config.items()))
    return " ".join(parts)


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
