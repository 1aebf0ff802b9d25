"""Batch invariance of the tuned table: a row's y bits the same at every M class of a forward
width. The offline tuner (tune.py) runs these inside its tuning session: batch_invariance
checks each width's entries on the GPU and mends those whose rows differ; repick_same_bits
re-picks entries of an existing table within the largest class's reduction tree; repick_jointly
chooses a width's tree over all its M classes at once; unify_by_largest_class is the blunt
rule without a GPU.
An entry that must keep its width's bits takes the fastest single-tile configuration whose rows
are bitwise the largest class's (same_bits_configs: every candidate forced and compared, then
timed by the tuner's own timer).
"""

from __future__ import annotations

import json
import time

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

#: The eps of every probe call (the rows compared are of one eps, whatever its value).
PROBE_EPS = 1e-6


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
                  f"m={entry.m}: was {entry.configs_text()}; takes {taken} "
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
    return [config for config, y in _forced_rows(n, m, x, w, r, rows, also) if torch.equal(y, want)]


def _forced_rows(n: int, m: int, x, w, r, rows: int, also=()):
    """(config, y rows) for each of the plain single-tile forward's configurations tried at m
    rows (launch._candidates, and those of `also` not among them), the rows computed in calls
    of m rows forced at the configuration; every candidate compiled first, at once, as a tuning
    does."""
    path = _path_args(x, w, r, m)
    xm, y, rstd, strides = path[0], path[2], path[3], path[6]
    args = forward_launch._single_tile_forward_args(*path[:9])
    switches = forward_launch.plain_forward_launch_switches(xm, y, rstd, path[9], strides)
    candidates = launch._candidates(SINGLE_TILE_FORWARD, args, switches)
    candidates += [c for c in also if c not in candidates]
    if not common.interpreting():

        def grid(meta):
            return (configs._tile_programs(m, meta, x.device),)

        kernel_launch._compile_in_parallel(getattr(kernels, SINGLE_TILE_FORWARD), args, [
            configs._kernel_grid_and_meta(SINGLE_TILE_FORWARD, grid, {**switches, **config})
            for config in candidates
        ])  # fmt: skip
    for config in candidates:
        launched = _as_launched(config, path)
        try:
            with dispatch.override(forward="single_tile",
                                   forward_configs={SINGLE_TILE_FORWARD: launched}):  # fmt: skip
                y_rows = _y_rows(x, w, r, rows, m)
        except tuning.UNRUNNABLE:  # does not compile or launch on this GPU: not a candidate
            continue
        yield config, y_rows


def _as_launched(config: dict, path_args: tuple) -> dict:
    """The configuration a default call on path_args (_path_args) launches for the table's
    config: the path adjusts it to the call's rows (forward_launch._one_row_tiles: one row a
    tile where config's tiles would leave SMs idle), and a forced configuration runs as given,
    so the re-picks force the adjusted one. Called outside any override."""
    x, _w, y, _rstd, r_arg, h_arg = path_args[:6]
    m, n = y.shape
    return forward_launch._one_row_tiles(m, n, (x, y, r_arg, h_arg), x.device)(config)


def fastest_same_bits(n: int, m: int, ref, x, w, r, rows: int, want) -> dict | None:
    """The fastest of same_bits_configs at m rows by the tuner's own timer (tuning.fastest, two
    passes), ref's configuration tried with the candidates; None where ref is another path
    (its bits come from another kernel) or no configuration keeps the bits."""
    if ref.path != "single_tile" or set(ref.configs) != {SINGLE_TILE_FORWARD}:
        return None
    candidates = same_bits_configs(n, m, x, w, r, rows, want, [ref.configs[SINGLE_TILE_FORWARD]])
    if not candidates:
        return None

    return tuning.fastest(candidates, _forced_call, _path_args(x, w, r, m), passes=2)


def _path_args(x, w, r, m: int) -> tuple:
    """The single-tile forward path's arguments for x's (and r's) first m rows, its outputs
    allocated here, so that a timing graph's capture allocates nothing: the joint re-pick's
    first run, whose timed calls allocated their outputs inside the captures, ran out of GPU
    memory (134 GiB held in the graphs' private pools) after six widths; with this it holds
    under 2 GiB (docs/perf-log.md, thirtieth session)."""
    xm = x[:m]
    rm = None if r is None else r[:m]
    y = torch.empty_like(xm)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    r_arg, h_arg = (xm, xm) if rm is None else (rm, torch.empty_like(xm))
    strides = (xm.stride(0), y.stride(0), r_arg.stride(0), h_arg.stride(0))
    return (xm, w, y, rstd, r_arg, h_arg, strides, PROBE_EPS, 0.0, rm is not None)


def _forced_call(config: dict, args: tuple) -> None:
    """The single-tile forward path on args (_path_args) at the table configuration config,
    launched as a default call of args' rows would launch it (_as_launched), through the
    runtime's dispatch."""
    x, w, y = args[:3]
    m, n = y.shape
    launched = {SINGLE_TILE_FORWARD: _as_launched(config, args)}
    with launch._on_device(x), dispatch.override(forward="single_tile", forward_configs=launched):
        launch._dispatch("fwd", (x.dtype, w.dtype, y.dtype), args[9], n, m,
                         [launch._forward_single_tile], x.device, args)  # fmt: skip


# ---- choosing a width's reduction tree over all its M classes at once ------------------------


#: Another tree replaces a width's current one only where its worst ratio is lower by more than
#: this (the timer's spread between passes is about 1%: a smaller lead is not one).
JOINT_MARGIN = 0.01


def least_regret_tree(best_ms: dict[int, dict[int, float]], margin: float = JOINT_MARGIN):
    """The tree to give every M class of a width: best_ms[m][tree] is the least ms of the
    tree's configurations at class m (trees numbered, 0 the width's current one). Of the trees
    timed at every class, the one whose worst ratio to its class's fastest time (over every
    tree timed there, those missing at some class included: worst_ratio) is least; the current
    tree stays unless another's is lower by at least margin (a gap between the two ratios:
    0.01 is one percentage point; ties: the lower number). None where no tree is timed at
    every class."""
    if not best_ms:
        return None
    everywhere = sorted(set.intersection(*(set(times) for times in best_ms.values())))
    if not everywhere:
        return None
    best = min(everywhere, key=lambda tree: worst_ratio(best_ms, tree))
    if 0 in everywhere and worst_ratio(best_ms, best) > worst_ratio(best_ms, 0) - margin:
        return 0
    return best


def worst_ratio(best_ms: dict[int, dict[int, float]], tree: int) -> float:
    """tree's worst ratio to the fastest time of a class (over every tree timed there), over
    the classes; inf where tree is not timed at some class."""
    if any(tree not in times for times in best_ms.values()):
        return float("inf")
    return max(times[tree] / min(times.values()) for times in best_ms.values())


@torch.no_grad()
def repick_jointly(table: Table, device: torch.device, widths=None, dtypes=None,
                   residuals=None) -> int:  # fmt: skip
    """Each forward width (of these widths, dtypes by name and residual flags; None: all)
    whose entries all take the plain single tile gets one reduction tree chosen over all its M
    classes at once: at each class every candidate configuration is run (_forced_rows) and
    grouped by the bits of its y rows (one group a tree), each group's configurations timed by
    the tuner's timer (tuning.times, two passes); the tree of least worst ratio to each class's
    fastest time (least_regret_tree) then gives each class its fastest configuration (on the
    current tree, a class keeps its configuration unless another is faster by JOINT_MARGIN).
    The batch-invariance rule (one tree per width) kept, the width's largest class no longer
    decides the tree alone: the re-pick the 2048-row forward asked for (forward_mid_m_gap:
    another tree 5.6% faster at 2048 x 4096, 2.7% slower at 16384 x 4096). The width's entries
    are then checked through the runtime's dispatch to give the chosen tree's rows at every
    class (_write_checked); where they do not, or the check fails, the width gets its entries
    back. Run inside the tuning session. Returns how many widths took another tree."""
    changed = 0
    for (key, n), entries in forward_families(table, widths, dtypes, residuals).items():
        if any(e.path != "single_tile" or set(e.configs) != {SINGLE_TILE_FORWARD} for e in entries):
            print(f"joint re-pick: fwd {_family_name(key, n)}: skipped (not the single tile at "
                  f"every class)", flush=True)  # fmt: skip
            continue
        t0 = time.perf_counter()
        entries = sorted(entries, key=lambda e: e.m)
        x, w, r, rows, want = _family_probe(key, n, entries[-1], device)
        trees, timed = (
            [want],
            {},
        )  # timed[m][tree]: (ms, config) of each runnable one, fastest first
        for entry in entries:
            timed[entry.m] = _timed_by_tree(n, entry, x, w, r, rows, trees)
        best_ms = {
            m: {t: runs[0][0] for t, runs in by_tree.items()} for m, by_tree in timed.items()
        }
        tree = least_regret_tree(best_ms)
        if tree is None:
            print(f"joint re-pick: fwd {_family_name(key, n)}: no tree runs at every class; "
                  f"kept", flush=True)  # fmt: skip
            continue
        picked = [
            Entry(key, n, e.m, "single_tile", {SINGLE_TILE_FORWARD: _pick(timed[e.m][tree], e, tree)})
            for e in entries
        ]  # fmt: skip
        if [p.configs for p in picked] == [e.configs for e in entries]:
            verdict = "entries unchanged"
        else:
            verdict = _write_checked(entries, picked, x, w, r, rows, trees[tree], want)
            changed += int(tree != 0 and verdict == "written")
        print(f"joint re-pick: fwd {_family_name(key, n)}: {len(trees)} trees; takes tree "
              f"{tree}, worst {worst_ratio(best_ms, tree):.3f} of a class's fastest (tree 0, "
              f"the current: {worst_ratio(best_ms, 0):.3f}); {verdict} "
              f"({time.perf_counter() - t0:.1f} s, {_allocated_gib(device):.1f} GiB allocated)",
              flush=True)  # fmt: skip
        for m, by_tree in timed.items():
            print(f"    m={m}: " + ", ".join(f"tree {t} {runs[0][0] * 1000:.2f} us"
                                          for t, runs in sorted(by_tree.items())), flush=True)  # fmt: skip
    return changed


def _timed_by_tree(n: int, entry: Entry, x, w, r, rows: int, trees: list) -> dict:
    """{tree: [(ms, config), ...] fastest first} at entry's class: each candidate configuration
    (and entry's own) put in the tree its y rows match bit for bit (a new tree, appended to
    trees, where none does), each tree's configurations timed by tuning.times (those that
    cannot run left out)."""
    groups: dict[int, list[dict]] = {}
    for config, y in _forced_rows(n, entry.m, x, w, r, rows, [entry.configs[SINGLE_TILE_FORWARD]]):
        tree = next((i for i, rows_of in enumerate(trees) if torch.equal(y, rows_of)), None)
        if tree is None:
            tree = len(trees)
            trees.append(y)
        groups.setdefault(tree, []).append(config)
    args = _path_args(x, w, r, entry.m)
    timed = {}
    for tree, group in groups.items():
        try:
            ms = tuning.times(group, _forced_call, args, passes=2)
        except tuning.UNRUNNABLE:  # no configuration of this tree runs on this GPU
            continue
        runs = sorted(((t, c) for t, c in zip(ms, group, strict=True) if t != float("inf")),
                      key=lambda run: run[0])  # fmt: skip
        if runs:
            timed[tree] = runs
    return timed


def _pick(runs: list, entry: Entry, tree: int) -> dict:
    """The configuration a class takes from its tree's timed runs (fastest first): the fastest,
    but on the current tree (0) the entry's own unless the fastest beats it by JOINT_MARGIN
    (timing noise alone does not rewrite an entry)."""
    fastest_ms, fastest = runs[0]
    own = entry.configs[SINGLE_TILE_FORWARD]
    own_ms = next((t for t, c in runs if c == own), None)
    if tree == 0 and own_ms is not None and fastest_ms > own_ms * (1 - JOINT_MARGIN):
        return own
    return fastest


def _write_checked(old: list, new: list, x, w, r, rows: int, want_new, want_old) -> str:
    """Put a width's new entries in the session's table (one save), then check through the
    runtime's dispatch that every class gives want_new's rows; where one does not, or anything
    raises (an interrupt included), the old entries go back, so the table never keeps a width
    whose classes run different trees. Says what it did."""
    try:
        dispatch.add_entry(*new)
        if all(torch.equal(_y_rows(x, w, r, rows, e.m), want_new) for e in new):
            return "written"
        dispatch.add_entry(*old)
    except BaseException:
        dispatch.add_entry(*old)
        raise
    same = all(torch.equal(_y_rows(x, w, r, rows, e.m), want_old) for e in old)
    return "its bits did not hold through the dispatch: entries kept" + (
        "" if same else " (and they now give other rows too: STILL DIFFERENT)"
    )


def _allocated_gib(device: torch.device) -> float:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def _family_name(key, n: int) -> str:
    return f"{key.dtypes[0]} {'res' if key.residual else '-'} n={n}"


def _y_rows(x, w, r, rows: int, m: int) -> torch.Tensor:
    """y of x's first `rows` rows, computed in calls of m rows each (the last may be short)."""
    chunks = []
    for start in range(0, rows, m):
        stop = min(start + m, x.shape[0])
        part = None if r is None else r[start:stop]
        chunks.append(launch.rmsnorm_forward(x[start:stop], w, PROBE_EPS, 0.0, None, part)[0])
    return torch.cat(chunks)[:rows]
