"""Views of result rows: the ranked table per (op, mode, timing), a per-shape table, plots.

Rows are long format (harness.run); everything here is a pivot of them. Ranking: backends that
pass the oracle on every case they ran and were never flagged suspect come first, ordered by
geomean bandwidth over the cases all of them ran (so skipping hard shapes lifts no one); then
the rest, marked. "% ceiling" and "x eager" are geomeans over each backend's own cases.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from tabulate import tabulate

from impls import OPS


def _geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


#: The baseline of each op's "x eager" column.
def baseline(op: str) -> str:
    """The backend the "x eager" speedups of op divide by (Backend.role "baseline"). Read from
    the registry when called: loading it imports triton, which must not happen before
    harness.compare has set TRITON_INTERPRET."""
    from impls import backend_with_role

    return backend_with_role(op, "baseline")


def op_of(row: dict) -> str:
    return row.get("op", "rmsnorm")  # files from before add_rmsnorm have no op field


def ops_in(rows: list[dict]) -> list[str]:
    return sorted({op_of(r) for r in rows}, key=OPS.index)


def _select(rows: list[dict], mode: str, timing: str, op: str) -> list[dict]:
    return [r for r in rows if r["mode"] == mode and r["timing"] == timing and op_of(r) == op]


def ranking(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> list[dict]:
    """One entry per backend of ``op`` for this (mode, timing), best first."""
    chosen = _select(rows, mode, timing, op)
    cases = sorted({(r["shape"], r["dtype"]) for r in chosen})
    eager = baseline(op)
    eager_ms = {(r["shape"], r["dtype"]): r["ms"] for r in chosen
                if r["backend"] == eager and r["status"] == "ok"}  # fmt: skip
    by_backend: dict[str, list[dict]] = defaultdict(list)
    for r in chosen:
        by_backend[r["backend"]].append(r)
    entries = []
    for name, brows in by_backend.items():
        ok = [r for r in brows if r["status"] == "ok"]
        others = sorted({f"{r['status']}: {r['reason']}" for r in brows if r["status"] != "ok"})
        speedups = [eager_ms[(r["shape"], r["dtype"])] / r["ms"] for r in ok
                    if (r["shape"], r["dtype"]) in eager_ms]  # fmt: skip
        checked = [r for r in brows if r.get("oracle_passed") is not None]
        passed = bool(checked) and all(r["oracle_passed"] for r in checked)
        suspect = any(r.get("suspect") for r in ok)
        ulps = [r["oracle_max_ulps"] for r in checked if r.get("oracle_max_ulps") is not None]
        uses = [r["oracle_bound_use"] for r in checked if r.get("oracle_bound_use") is not None]
        entries.append({
            "backend": name,
            "label": brows[0]["label"],
            "cases": f"{len(ok)}/{len(cases)}",
            "gbps_by_case": {(r["shape"], r["dtype"]): r["gbps"] for r in ok},
            "median_gbps": _median([r["gbps"] for r in ok]),
            "geomean_gbps": _geomean(r["gbps"] for r in ok),
            "geomean_pct_ceiling": _geomean(r.get("pct_ceiling") for r in ok),
            "speedup_vs_eager": _geomean(speedups),
            "worst_ulps": max(ulps) if ulps else None,
            "worst_bound_use": max(uses) if uses else None,
            "oracle": ("pass" if passed else ("FAIL" if checked else "-")),
            "suspect": suspect,
            "not_run": others,
        })  # fmt: skip
    ranked = [
        e for e in entries if e["oracle"] == "pass" and not e["suspect"] and e["geomean_gbps"]
    ]
    rest = [e for e in entries if e not in ranked]
    # Rank on the cases every ranked backend ran, so skipping hard shapes cannot lift a backend.
    common = set.intersection(*(set(e["gbps_by_case"]) for e in ranked)) if ranked else set()
    for e in entries:
        e["common_cases"] = len(common)
        e["common_geomean_gbps"] = _geomean(e["gbps_by_case"].get(c) for c in common)
    key = "common_geomean_gbps" if common else "geomean_gbps"
    ranked.sort(key=lambda e: -e[key])
    rest.sort(key=lambda e: -(e["geomean_gbps"] or 0))
    for i, e in enumerate(ranked, 1):
        e["rank"] = i
    for e in rest:
        e["rank"] = "-"
    return ranked + rest


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def ranking_table(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> str:
    entries = ranking(rows, mode, timing, op)
    table = [
        [e["rank"], e["backend"], e["cases"], _fmt(e["common_geomean_gbps"], ".0f"),
         _fmt(e["median_gbps"], ".0f"), _fmt(e["geomean_gbps"], ".0f"),
         _fmt(e["geomean_pct_ceiling"], ".1f"), _fmt(e["speedup_vs_eager"], ".2f"),
         _fmt(e["worst_ulps"], ".1f"), _fmt(e["worst_bound_use"], ".2f"),
         e["oracle"] + (" SUSPECT" if e["suspect"] else "")]
        for e in entries
    ]  # fmt: skip
    common = entries[0]["common_cases"] if entries else 0
    headers = ["rank", "backend", "cases", f"geomean GB/s, {common} common cases", "median GB/s",
               "geomean GB/s, own cases", "% ceiling", "x eager", "worst ulps", "err/bound",
               "oracle"]  # fmt: skip
    notes = [f"  {e['backend']}: {n}" for e in entries for n in e["not_run"]]
    text = tabulate(table, headers=headers, tablefmt="github")
    return text + ("\nnot measured:\n" + "\n".join(notes) if notes else "")


def per_shape_table(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> str:
    """GB/s of every backend at every (shape, dtype); the status where it did not run."""
    chosen = _select(rows, mode, timing, op)
    backends = list(dict.fromkeys(r["backend"] for r in chosen))
    cases = sorted({(r["m"], r["n"], r["dtype"]) for r in chosen}, key=lambda c: (c[2], c[1], c[0]))
    cell = {(r["backend"], r["m"], r["n"], r["dtype"]): r for r in chosen}
    table = []
    for m, n, dtype in cases:
        line = [f"{m}x{n}", dtype]
        for b in backends:
            r = cell.get((b, m, n, dtype))
            if r is None:
                line.append("")
            elif r["status"] == "ok":
                mark = "" if r.get("oracle_passed") is not False else " FAIL"
                line.append(f"{r['gbps']:.0f}{mark}")
            else:
                line.append(r["status"])
        floor = next((r.get("floor_gbps") for r in chosen
                      if (r["m"], r["n"], r["dtype"]) == (m, n, dtype) and r.get("floor_gbps")), None)  # fmt: skip
        line.append(_fmt(floor, ".0f"))
        table.append(line)
    return tabulate(table, headers=["shape", "dtype", *backends, "copy floor"], tablefmt="github")


def x_axis(rows: list[dict]) -> tuple[str, str]:
    """The plot's x: M*N elements, or the hidden size N when the rows' shapes have more distinct
    N than M*N, so that fewer shapes share a point (the wide preset holds M*N at 2**26 and
    varies N). Returns (row key, label)."""
    sizes = {r["m"] * r["n"] for r in rows}
    widths = {r["n"] for r in rows}
    return ("n", "N (hidden size)") if len(widths) > len(sizes) else ("mn", "M*N elements")


def plotting_problem() -> str | None:
    """Why plots cannot be drawn here (matplotlib missing), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "plots need matplotlib, which is not installed: pip install -e '.[plots]'"
    return None


def plot(rows: list[dict], path: str, title: str = "", op: str = "rmsnorm") -> None:
    """Bandwidth of ``op`` per backend against M*N (or N, see x_axis): one panel per
    (mode, timing) the run measured (a forward-only run gets no empty backward panels). Rows
    that failed the oracle are left out (a wrong result's speed is no point on a bandwidth
    curve; the tables show them, ranked last)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis, axis_label = x_axis([r for r in rows if op_of(r) == op])
    panels = {}
    for mode in ("fwd", "bwd"):
        for timing in ("device", "host"):
            chosen = [r for r in _select(rows, mode, timing, op)
                      if r["status"] == "ok" and r.get("oracle_passed") is not False]  # fmt: skip
            if chosen:
                panels[mode, timing] = chosen
    panels = panels or {("fwd", "device"): []}
    columns = 2 if len(panels) > 1 else 1
    lines = -(-len(panels) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(max(9.0, 6.5 * columns), 4.5 * lines), sharex=True,
                             squeeze=False)  # fmt: skip
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    # one colour per backend on every panel (a panel without some backend keeps the others')
    backends = dict.fromkeys(r["backend"] for chosen in panels.values() for r in chosen)
    # ten colours, then the same ten dashed, then dotted: up to 30 backends stay distinguishable
    colours = {backend: f"C{i % 10}" for i, backend in enumerate(backends)}
    styles = {backend: ("-", "--", ":")[(i // 10) % 3] for i, backend in enumerate(backends)}
    for ax, ((mode, timing), chosen) in zip(axes.flat, panels.items(), strict=False):
        for backend in dict.fromkeys(r["backend"] for r in chosen):
            points = defaultdict(list)
            for r in chosen:
                if r["backend"] == backend:
                    points[r["n"] if axis == "n" else r["m"] * r["n"]].append(r["gbps"])
            xs = sorted(points)
            ax.plot(xs, [_geomean(points[x]) for x in xs], marker="o", ms=3, label=backend,
                    color=colours[backend], ls=styles[backend])  # fmt: skip
        ceilings = {r.get("ceiling_gbps") for r in chosen if r.get("ceiling_gbps")}
        for c in ceilings:
            ax.axhline(c, color="k", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(
            f"{mode}, {'device-only (CUDA graph)' if timing == 'device' else 'host-inclusive (do_bench)'}"
        )
        ax.set_ylabel("GB/s (byte model)")
        ax.grid(alpha=0.3)
    for ax in axes.flat:
        ax.set_xlabel(axis_label)
        ax.xaxis.set_tick_params(labelbottom=True)
    if backends:
        # every backend of the run, whichever panels it appears on
        handles = [plt.Line2D([], [], color=colours[b], ls=styles[b], marker="o", ms=3)
                   for b in backends]  # fmt: skip
        axes.flat[0].legend(handles, list(backends), fontsize=8)
    fig.suptitle(title or "RMSNorm bandwidth (dashed: measured copy ceiling)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ours(op: str) -> str:
    """Our backend for op (Backend.role "ours"): what the ours-vs-best-peer tables compare."""
    from impls import backend_with_role

    return backend_with_role(op, "ours")


#: Within this fraction of the fastest peer counts as a tie (issue 5's 2%).
TIE = 0.02


def versus(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> list[dict]:
    """Per (shape, dtype): our GB/s, the fastest peer that passed the oracle there, the ratio."""
    chosen = [r for r in _select(rows, mode, timing, op) if r["status"] == "ok"]
    by_case: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in chosen:
        by_case[(r["m"], r["n"], r["dtype"])][r["backend"]] = r
    out = []
    our_name, baseline_name = ours(op), baseline(op)
    for (m, n, dtype), cell in sorted(
        by_case.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])
    ):
        our_row = cell.get(our_name)
        peers = {b: r for b, r in cell.items()
                 if b not in (our_name, baseline_name) and r.get("oracle_passed")}  # fmt: skip
        if our_row is None or not peers:
            continue
        best = max(peers, key=lambda b: peers[b]["gbps"])
        out.append({"m": m, "n": n, "dtype": dtype, "ours_gbps": our_row["gbps"],
                    "ours_pct_ceiling": our_row.get("pct_ceiling"),
                    "ours_passed": our_row.get("oracle_passed"),
                    "peer": best, "peer_gbps": peers[best]["gbps"],
                    "ratio": our_row["gbps"] / peers[best]["gbps"]})  # fmt: skip
    return out


def versus_table(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> str:
    entries = versus(rows, mode, timing, op)
    if not entries:
        return "(no case with both our backend and a peer)"
    table = [[f"{e['m']}x{e['n']}", e["dtype"], f"{e['ours_gbps']:.0f}", _fmt(e["ours_pct_ceiling"], ".1f"),
              e["peer"], f"{e['peer_gbps']:.0f}", f"{e['ratio']:.2f}",
              "ahead" if e["ratio"] > 1 + TIE else ("tie" if e["ratio"] >= 1 - TIE else "behind")]
             for e in entries]  # fmt: skip
    ratios = [e["ratio"] for e in entries]
    summary = (f"geomean ratio {_geomean(ratios):.2f}, worst {min(ratios):.2f}; ahead or tied "
               f"(within {TIE:.0%}) at {sum(r >= 1 - TIE for r in ratios)} of {len(ratios)} cases")  # fmt: skip
    headers = ["shape", "dtype", f"{ours(op)} GB/s", "% ceiling", "fastest peer", "peer GB/s",
               "ratio", ""]  # fmt: skip
    return tabulate(table, headers=headers, tablefmt="github") + "\n\n" + summary


def _provenance_table(provenance: dict, ceiling: dict) -> list[str]:
    v = provenance.get("versions", {})
    peers = ", ".join(f"{k} {val}" for k, val in v.items() if val and k not in ("torch", "triton"))
    lines = [
        "| provenance | |",
        "|---|---|",
        f"| GPU | {provenance.get('gpu')} ({provenance.get('sm_count')} SMs, "
        f"{(provenance.get('memory_bytes') or 0) / 2**30:.0f} GiB), driver {provenance.get('driver')} |",
        f"| software | torch {v.get('torch')}, triton {v.get('triton')}, CUDA {provenance.get('cuda')}, "
        f"Python {provenance.get('python')} |",
        f"| peers | {peers or '-'} |",
        f"| commit, date | {provenance.get('commit')}, {provenance.get('date')} |",
        f"| presets | {', '.join(provenance.get('presets') or []) or 'explicit shapes'} |",
        f"| our launch configs | {'autotuned' if provenance.get('triton_autotune', True) else 'heuristic'} |",
    ]
    dispatch = provenance.get("torch_rms_norm")
    if dispatch:
        lines.append(
            f"| F.rms_norm ran | fwd: {dispatch.get('route_fwd', '-')}, bwd: "
            f"{dispatch.get('route_bwd', '-')} (torch._native: {dispatch.get('torch_native')}, "
            f"TORCH_DISABLE_NATIVE_JIT={dispatch.get('TORCH_DISABLE_NATIVE_JIT')}) |"
        )
    if provenance.get("provenance_note"):
        lines.append(f"| note | {provenance['provenance_note']} |")
    if ceiling.get("ceiling_gbps"):
        lines.append(
            f"| copy ceiling | {ceiling['ceiling_gbps']:.0f} GB/s: 2 GiB device copy, read + write "
            f"(torch copy_ {ceiling.get('torch_copy_gbps', 0):.0f}, Triton copy kernel "
            f"{ceiling.get('triton_copy_gbps', 0):.0f}) |"
        )
    return lines


def markdown_page(runs: list[tuple], command: str, notes: str | None = None) -> str:
    """A results page: for each run (provenance, ceiling, rows, source, plot path), its
    provenance, ranked tables, ours-vs-fastest-peer tables and per-shape tables; then notes."""
    gpu = next((p.get("gpu") for p, *_ in runs if p.get("gpu")), None)
    lines = [
        f"# RMSNorm on {gpu or 'CPU'}",
        "",
        f"Generated by `{command}`; do not edit by hand (the notes at the end come from the file "
        "named by --notes). Each section is one run: backends ranked side by side in it.",
        "",
        "GB/s = counted bytes / time, where rmsnorm fwd counts 2·M·N elements and bwd 3·M·N "
        "(add_rmsnorm: 4·M·N each): a model of the traffic the op must move, not a DRAM counter. `device` = CUDA-graph replay over "
        "rotating inputs (> 3x L2); `host` = triton do_bench median (host overhead included). "
        "`% ceiling` is the geomean of per-shape bandwidth over the copy ceiling; `x eager` the "
        "geomean speedup over eager PyTorch on the same shapes. `worst ulps` is the largest error "
        "against the correctly rounded oracle in ulps of max(|ref|, max|ref|/1024); `err/bound` the "
        "largest error as a fraction of the backend's written bound (harness/oracle.py), judged "
        "element by element: at most 1 passes. A backend that fails the oracle is listed below "
        "those that pass, never ranked among them.",
        "",
        "Runs: "
        + ", ".join(f"[{source}](#run-{i})" for i, (_, _, _, source, _) in enumerate(runs, 1)),
        "",
    ]
    for i, (provenance, ceiling, rows, source, plot_path) in enumerate(runs, 1):
        lines += [f'<a id="run-{i}"></a>', "", f"## Run {i}: `{source}`", ""]
        lines += _provenance_table(provenance, ceiling) + [""]
        if plot_path:
            lines += [f"![bandwidth]({plot_path})", ""]
        sections = [(op, mode, timing) for op in ops_in(rows) for mode in ("fwd", "bwd")
                    for timing in timings_of(rows, mode)]  # fmt: skip
        for op, mode, timing in sections:
            lines += [
                f"### {op} {mode}, {timing} timing",
                "",
                ranking_table(rows, mode, timing, op),
                "",
            ]
        for op, mode, timing in sections:
            lines += [f"### {op} {mode}, {timing}: ours against the fastest peer", "",
                      versus_table(rows, mode, timing, op), ""]  # fmt: skip
        lines += ["<details><summary>Per shape (GB/s), every backend</summary>", ""]
        for op, mode, timing in sections:
            lines += [
                f"#### {op} {mode}, {timing}",
                "",
                per_shape_table(rows, mode, timing, op),
                "",
            ]
        lines += ["</details>", ""]
        cost_sections = [(op, mode) for op in ops_in(rows) for mode in ("fwd", "bwd")
                         if has_costs(rows, op, mode)]  # fmt: skip
        for op, mode in cost_sections:
            lines += [f"### {op} {mode}: costs per backend", "", COSTS_NOTE, "",
                      costs_table(rows, op, mode), ""]  # fmt: skip
        launches = launch_table(rows)
        if launches:
            lines += ["<details><summary>Our launch configurations, per case (as timed)</summary>",
                      "", launches, "", "</details>", ""]  # fmt: skip
    if notes:
        lines += [notes.rstrip(), ""]
    return "\n".join(lines)


def launch_table(rows: list[dict]) -> str:
    """Per case of ours (device timing where there is one), the kernels it launched and their
    configurations, from the rows' `launch` field (runs before it was recorded: empty)."""
    chosen = {}
    for r in rows:
        if r.get("launch") and r.get("status") == "ok":
            key = (op_of(r), r["dtype"], r["n"], r["m"], r["mode"])
            if key not in chosen or r["timing"] == "device":
                chosen[key] = r
    body = []
    for (op, dtype, n, m, mode), r in sorted(chosen.items()):
        configs = "; ".join(
            f"{kernel.removeprefix('rmsnorm_').removesuffix('_kernel')}: "
            + (", ".join(f"{k}={v}" for k, v in config.items()) if isinstance(config, dict)
               else str(config))
            for kernel, config in r["launch"].items()
        )  # fmt: skip
        body.append([f"{m}x{n}", dtype, op, mode, configs])
    if not body:
        return ""
    return tabulate(body, headers=["shape", "dtype", "op", "mode", "kernel: configuration"],
                    tablefmt="github")  # fmt: skip


def timings_of(rows: list[dict], mode: str) -> list[str]:
    order = ["device", "host", "pytest"]
    return sorted({r["timing"] for r in rows if r["mode"] == mode}, key=order.index)


# ---- cost columns (harness.costs) and the DRAM byte check (harness.ncu_bytes) ---------------

COSTS_NOTE = (
    "Host µs: host time per call with the GPU kept busy (calls queued behind a GPU sleep); a "
    "backend with a backward is timed forward with inputs that need grad (an autograd node "
    "recorded, as in training; the no-grad forward: harness.overhead). "
    "First call: seconds from building the backend (its import included) to the end of its "
    "first call at the case, in a fresh process with empty compile caches (cold) and again with "
    "the caches the first left (warm); extra MiB: the first call's peak allocation above a "
    "steady call's. Batch-invariant: rows of a smaller batch bitwise equal to the same rows of "
    "the whole (y in fwd, dx in bwd). Deterministic: y, dx, dw bitwise equal in the two "
    "processes. See harness/costs.py."
)

#: Row fields harness.costs writes; a row without any of them has no cost columns.
COST_FIELDS = ("host_us", "batch_invariant", "first_call_cold_s", "first_call_warm_s",
               "first_extra_mem_bytes", "deterministic", "first_call_error")  # fmt: skip


def has_costs(rows: list[dict], op: str, mode: str) -> bool:
    return any(
        op_of(r) == op and r["mode"] == mode and any(r.get(f) is not None for f in COST_FIELDS)
        for r in rows
    )


def _yes_no(values: list, diffs: list) -> str:
    """'yes' when every case was bitwise equal, 'no (k elements in c cases)' otherwise."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if all(known):
        return f"yes ({len(known)} cases)"
    bad = [d for v, d in zip(values, diffs, strict=True) if v is False]
    return f"no ({sum(bad)} elements differ in {len(bad)} of {len(known)} cases)"


def _diff_total(d) -> int:
    return sum(d.values()) if isinstance(d, dict) else int(d or 0)


def cost_entries(rows: list[dict], op: str, mode: str) -> list[dict]:
    """Per backend, over its cases (one row per case: device timing where there is one): median
    host µs per call, median first-call seconds cold and warm, largest first-call extra memory,
    batch invariance and cross-process determinism, each as yes/no with the differing count."""
    per_case: dict[tuple, dict] = {}
    for r in rows:
        if op_of(r) != op or r["mode"] != mode:
            continue
        key = (r["backend"], r["shape"], r["dtype"])
        if key not in per_case or r.get("timing") == "device":
            per_case[key] = r
    by_backend: dict[str, list[dict]] = defaultdict(list)
    for (backend, *_), r in per_case.items():
        by_backend[backend].append(r)
    entries = []
    for backend, brows in by_backend.items():

        def values(field, brows=brows):
            return [r.get(field) for r in brows if r.get(field) is not None]

        mems = values("first_extra_mem_bytes")
        errors = sorted({r["first_call_error"] for r in brows if r.get("first_call_error")})
        entries.append({
            "backend": backend,
            "host_us": _median(values("host_us")),
            "host_cases": len(values("host_us")),
            "first_cold_s": _median(values("first_call_cold_s")),
            "first_warm_s": _median(values("first_call_warm_s")),
            "first_cases": len(values("first_call_cold_s")),
            "extra_mem_mib": max(mems) / 2**20 if mems else None,
            "batch": _yes_no([r.get("batch_invariant") for r in brows],
                             [r.get("batch_diff") or 0 for r in brows]),
            "deterministic": _yes_no([r.get("deterministic") for r in brows],
                                     [_diff_total(r.get("determinism_diff")) for r in brows]),
            "errors": errors,
        })  # fmt: skip
    entries.sort(key=lambda e: (e["host_us"] is None, e["host_us"] or 0))
    return entries


def costs_table(rows: list[dict], op: str = "rmsnorm", mode: str = "fwd") -> str:
    entries = cost_entries(rows, op, mode)
    table = [[e["backend"], _fmt(e["host_us"], ".1f"), e["host_cases"], _fmt(e["first_cold_s"], ".2f"),
              _fmt(e["first_warm_s"], ".2f"), e["first_cases"], _fmt(e["extra_mem_mib"], ".1f"),
              e["batch"], e["deterministic"]] for e in entries]  # fmt: skip
    headers = ["backend", "host us/call (median)", "cases", "first call s, cold caches",
               "first call s, warm caches", "cases", "first-call extra MiB (max)",
               "batch-invariant (bitwise)", "deterministic across processes"]  # fmt: skip
    notes = [f"  {e['backend']}: {n}" for e in entries for n in e["errors"]]
    text = tabulate(table, headers=headers, tablefmt="github")
    return text + ("\nfirst-call errors:\n" + "\n".join(notes) if notes else "")


def plot_vs_n(rows: list[dict], path: str, timing: str = "device") -> None:
    """Bandwidth against N per backend: one panel per (op, mode), geomean over M and dtypes at
    each N (rows that failed the oracle left out). Qk-norm views plot at their head_dim."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(op, mode) for op in ops_in(rows) for mode in ("fwd", "bwd")
              if _plottable(rows, op, mode, timing)]  # fmt: skip
    panels = panels or [("rmsnorm", "fwd")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9.0, 4.2 * len(panels)), squeeze=False)
    backends = dict.fromkeys(r["backend"] for r in rows)
    colours = {b: f"C{i % 10}" for i, b in enumerate(backends)}
    styles = {b: ("-", "--", ":")[(i // 10) % 3] for i, b in enumerate(backends)}
    for ax, (op, mode) in zip(axes.flat, panels, strict=True):
        chosen = _plottable(rows, op, mode, timing)
        for backend in dict.fromkeys(r["backend"] for r in chosen):
            points = defaultdict(list)
            for r in chosen:
                if r["backend"] == backend:
                    points[r["n"]].append(r["gbps"])
            xs = sorted(points)
            ax.plot(xs, [_geomean(points[x]) for x in xs], marker="o", ms=3, label=backend,
                    color=colours[backend], ls=styles[backend])  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {mode}, {timing} timing: GB/s against N (geomean over M, dtypes)")
        ax.set_xlabel("N (hidden size; head_dim for qk-norm views)")
        ax.set_ylabel("GB/s (byte model)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plottable(rows, op, mode, timing):
    return [r for r in rows if op_of(r) == op and r["mode"] == mode and r["timing"] == timing
            and r["status"] == "ok" and r.get("oracle_passed") is not False]  # fmt: skip


def plot_first_call(rows: list[dict], path: str) -> None:
    """First-call seconds per backend (median over its cases), cold and warm caches, fwd."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [e for op in ops_in(rows) for e in cost_entries(rows, op, "fwd")
               if e["first_cold_s"] is not None]  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(entries) + 2), 4.5))
    xs = range(len(entries))
    ax.bar([x - 0.2 for x in xs], [e["first_cold_s"] for e in entries], 0.4, label="cold caches")
    ax.bar([x + 0.2 for x in xs], [e["first_warm_s"] or 0 for e in entries], 0.4,
           label="warm caches")  # fmt: skip
    ax.set_xticks(list(xs), [e["backend"] for e in entries], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("seconds, first forward call (median over cases)")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: What the DRAM-bytes table's columns mean (harness.ncu_bytes has the reasons).
NCU_NOTE = ("DRAM bytes by Nsight Compute (`python -m harness.ncu_bytes`), caches flushed "
            "before each kernel. Reads are the check: DRAM reads / the model's reads near 1 "
            "means the inputs are read once. Writes are a floor: lines still in L2 when the "
            "call's last kernel ends reach DRAM later, uncounted.")  # fmt: skip


def _model_read_bytes(record: dict) -> int:
    """The model's reads of a harness.ncu_bytes record (computed for records written before
    they were stored)."""
    if record.get("model_read_bytes") is not None:
        return record["model_read_bytes"]
    from harness.traffic import model_bytes

    return model_bytes(record["shape"], record["mode"], record["dtype"],
                       record.get("op", "rmsnorm"))[1]  # fmt: skip


#: The DRAM-bytes table's columns (ncu_rows).
NCU_HEADERS = ["backend", "shape", "dtype", "mode", "kernels", "DRAM read MB", "model read MB",
               "read / model", "DRAM write MB (floor)", "model write MB", "DRAM / model (all)",
               ""]  # fmt: skip


def ncu_rows(records: list[dict]) -> list[list[str]]:
    """harness.ncu_bytes records as NCU_HEADERS rows: DRAM bytes read and written beside the
    byte model's."""

    def mb(value) -> str:
        return _fmt(None if value is None else value / 1e6, ".2f")

    body = []
    for r in records:
        model_read = _model_read_bytes(r)
        read = r.get("dram_read_bytes")
        body.append([r["backend"], r["shape"], r["dtype"], r["mode"], str(r.get("kernels", "-")),
                     mb(read), mb(model_read),
                     _fmt(None if read is None else read / model_read, ".2f"),
                     mb(r.get("dram_write_bytes")), mb(r["model_bytes"] - model_read),
                     _fmt(r.get("ratio"), ".2f"), r.get("error") or ""])  # fmt: skip
    return body


def ncu_table(records: list[dict]) -> str:
    """ncu_rows as a table."""
    return tabulate(ncu_rows(records), headers=NCU_HEADERS, tablefmt="github",
                    disable_numparse=True)  # fmt: skip
