"""Views of result rows: the ranked table per (op, mode, timing), ours against the fastest peer,
a per-shape table, the launch configurations, a correctness run's verdicts, and the markdown
page of them all (plots: harness.plots; the cost columns: harness.cost_tables).

Rows are long format (harness.run); everything here is a pivot of them. Ranking: backends that
pass the oracle on every case they ran and were never flagged suspect come first, ordered by
geomean bandwidth over the cases all of them ran (so skipping hard shapes lifts no one); then
the rest, marked. "% ceiling" and "x eager" are geomeans over each backend's own cases.
"""

from __future__ import annotations

from collections import defaultdict

from tabulate import tabulate

from harness.cost_tables import COSTS_NOTE, costs_table, has_costs
from harness.rows import first_line, fmt, geomean, median, op_of, ops_in, select, timings_of


def baseline(op: str) -> str:
    """The backend the "x eager" speedups of op divide by (Backend.role "baseline"). Read from
    the registry when called: loading it imports triton, which must not happen before
    harness.compare has set TRITON_INTERPRET."""
    from impls import backend_with_role

    return backend_with_role(op, "baseline")


def ranking(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> list[dict]:
    """One entry per backend of ``op`` for this (mode, timing), best first."""
    chosen = select(rows, mode, timing, op)
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
        failures = [f"oracle FAIL at {r['shape']} {r['dtype']}: {first_line(r.get('oracle_detail')) or '(no detail recorded)'}"
                    for r in brows if r.get("oracle_passed") is False]  # fmt: skip
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
            "median_gbps": median([r["gbps"] for r in ok]),
            "geomean_gbps": geomean(r["gbps"] for r in ok),
            "geomean_pct_ceiling": geomean(r.get("pct_ceiling") for r in ok),
            "speedup_vs_eager": geomean(speedups),
            "worst_ulps": max(ulps) if ulps else None,
            "worst_bound_use": max(uses) if uses else None,
            "oracle": ("pass" if passed else ("FAIL" if checked else "-")),
            "suspect": suspect,
            "not_run": others,
            "failures": failures,
        })  # fmt: skip
    ranked = [
        e for e in entries if e["oracle"] == "pass" and not e["suspect"] and e["geomean_gbps"]
    ]
    rest = [e for e in entries if e not in ranked]
    # Rank on the cases every ranked backend ran, so skipping hard shapes cannot lift a backend.
    common = set.intersection(*(set(e["gbps_by_case"]) for e in ranked)) if ranked else set()
    for e in entries:
        e["common_cases"] = len(common)
        e["common_geomean_gbps"] = geomean(e["gbps_by_case"].get(c) for c in common)
    key = "common_geomean_gbps" if common else "geomean_gbps"
    ranked.sort(key=lambda e: -e[key])
    rest.sort(key=lambda e: -(e["geomean_gbps"] or 0))
    for i, e in enumerate(ranked, 1):
        e["rank"] = i
    for e in rest:
        e["rank"] = "-"
    return ranked + rest


def ranking_table(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> str:
    entries = ranking(rows, mode, timing, op)
    table = [
        [e["rank"], e["backend"], e["cases"], fmt(e["common_geomean_gbps"], ".0f"),
         fmt(e["median_gbps"], ".0f"), fmt(e["geomean_gbps"], ".0f"),
         fmt(e["geomean_pct_ceiling"], ".1f"), fmt(e["speedup_vs_eager"], ".2f"),
         fmt(e["worst_ulps"], ".1f"), fmt(e["worst_bound_use"], ".2f"),
         e["oracle"] + (" SUSPECT" if e["suspect"] else "")]
        for e in entries
    ]  # fmt: skip
    common = entries[0]["common_cases"] if entries else 0
    headers = ["rank", "backend", "cases", f"geomean GB/s, {common} common cases", "median GB/s",
               "geomean GB/s, own cases", "% ceiling", "x eager", "worst ulps", "err/bound",
               "oracle"]  # fmt: skip
    notes = [f"  {e['backend']}: {n}" for e in entries for n in e["not_run"]]
    failed = [f"  {e['backend']}: {n}" for e in entries for n in shown_failures(e)]
    text = tabulate(table, headers=headers, tablefmt="github")
    text += "\nnot measured:\n" + "\n".join(notes) if notes else ""
    return text + ("\nwhy FAIL:\n" + "\n".join(failed) if failed else "")


#: Failing cases named per backend under a ranked table (the rest counted).
SHOWN_FAILURES = 3


def shown_failures(entry: dict) -> list[str]:
    """A ranking entry's first SHOWN_FAILURES oracle failures, and how many more there were."""
    failures = entry["failures"]
    more = len(failures) - SHOWN_FAILURES
    return failures[:SHOWN_FAILURES] + ([f"and {more} more failing cases"] if more > 0 else [])


def per_shape_table(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> str:
    """GB/s of every backend at every (shape, dtype); the status where it did not run."""
    chosen = select(rows, mode, timing, op)
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
        line.append(fmt(floor, ".0f"))
        table.append(line)
    return tabulate(table, headers=["shape", "dtype", *backends, "copy floor"], tablefmt="github")


def ours(op: str) -> str:
    """Our backend for op (Backend.role "ours"): what the ours-vs-best-peer tables compare."""
    from impls import backend_with_role

    return backend_with_role(op, "ours")


#: Within this fraction of the fastest peer counts as a tie (issue 5's 2%).
TIE = 0.02


def versus(rows: list[dict], mode: str, timing: str, op: str = "rmsnorm") -> list[dict]:
    """Per (shape, dtype): our GB/s, the fastest peer that passed the oracle there, the ratio."""
    chosen = [r for r in select(rows, mode, timing, op) if r["status"] == "ok"]
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
    table = [[f"{e['m']}x{e['n']}", e["dtype"], f"{e['ours_gbps']:.0f}", fmt(e["ours_pct_ceiling"], ".1f"),
              e["peer"], f"{e['peer_gbps']:.0f}", f"{e['ratio']:.2f}",
              "ahead" if e["ratio"] > 1 + TIE else ("tie" if e["ratio"] >= 1 - TIE else "behind")]
             for e in entries]  # fmt: skip
    ratios = [e["ratio"] for e in entries]
    summary = (f"geomean ratio {geomean(ratios):.2f}, worst {min(ratios):.2f}; ahead or tied "
               f"(within {TIE:.0%}) at {sum(r >= 1 - TIE for r in ratios)} of {len(ratios)} cases")  # fmt: skip
    headers = ["shape", "dtype", f"{ours(op)} GB/s", "% ceiling", "fastest peer", "peer GB/s",
               "ratio", ""]  # fmt: skip
    return tabulate(table, headers=headers, tablefmt="github") + "\n\n" + summary


def versus_line(rows: list[dict], mode: str, timing: str, op: str) -> str:
    """Ours against the fastest peer that passed the oracle, per case, in one line."""
    entries = versus(rows, mode, timing, op)
    if not entries:
        return ""
    ratios = [e["ratio"] for e in entries]
    worst = min(entries, key=lambda e: e["ratio"])
    ahead = sum(r >= 1 - TIE for r in ratios)
    mean = geomean(ratios)
    return (f"{mode}, {timing}: {mean:.3f} of the fastest peer (geomean), ahead or tied at "
            f"{ahead}/{len(ratios)}; worst {worst['ratio']:.2f}, {worst['m']}x{worst['n']} "
            f"{worst['dtype']} ({worst['peer']})")  # fmt: skip


def runs_summary(runs: list[tuple], checks_only: list[bool], labels: dict[str, str]) -> str:
    """Several runs: one line a run and (op, mode, timing), ours against the fastest peer."""
    lines = ["## Ours against the fastest oracle-passing peer, per run (geomean of per-case "
             "ratios, our GB/s / the peer's; above 1 ours is faster)", ""]  # fmt: skip
    for (_, _, rows, source), check in zip(runs, checks_only, strict=True):
        said = [] if check else [
            f"  {op} {line}" for op in ops_in(rows) for mode in ("fwd", "bwd")
            for timing in timings_of(rows, mode) if (line := versus_line(rows, mode, timing, op))
        ]  # fmt: skip
        lines += [
            f"{labels.get(source, source)} ({source})",
            *(said or ["  (no case with ours and a peer)"]),
        ]
    return "\n".join(lines) + "\n"


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


def correctness_table(rows: list[dict], op: str, modes: list[str]) -> str:
    """Per backend and mode: the oracle's verdict over the cases checked, the worst error in
    ulps and as a fraction of the backend's bound, and why any case did not run."""
    chosen = [r for r in rows if op_of(r) == op and r["mode"] in modes]
    backends = list(dict.fromkeys(r["backend"] for r in chosen))
    body = []
    for name in backends:
        for mode in modes:
            brows = [r for r in chosen if r["backend"] == name and r["mode"] == mode]
            if not brows:
                continue
            judged = [r for r in brows if r.get("oracle_passed") is not None]
            failed = [r for r in judged if not r["oracle_passed"]]
            verdict = ("FAIL" if failed else "pass") if judged else "-"
            ulps = [r["oracle_max_ulps"] for r in judged if r.get("oracle_max_ulps") is not None]
            uses = [r["oracle_bound_use"] for r in judged if r.get("oracle_bound_use") is not None]
            why = sorted({f"{r['status']}: {r['reason']}" for r in brows
                          if r["status"] not in ("checked", "ok")})  # fmt: skip
            detail = "; ".join(f"{r['shape']} {r['dtype']}: {r['oracle_detail']}"
                               for r in failed if r.get("oracle_detail"))  # fmt: skip
            body.append([name, mode, f"{len(judged)}/{len(brows)}", verdict,
                         f"{max(ulps):g}" if ulps else "", f"{max(uses):.2f}" if uses else "",
                         "; ".join(why + ([detail[:160]] if detail else []))[:200]])  # fmt: skip
    return tabulate(body, headers=["backend", "mode", "cases checked", "oracle", "worst ulps",
                                   "err/bound", "not run / failures"], tablefmt="github")  # fmt: skip


def timing_name(timing: str) -> str:
    """A timing's name as a heading says it."""
    return {"device": "device-only (CUDA graph, rotating inputs)",
            "host": "host-inclusive (do_bench median)",
            "pytest": "pytest-benchmark wall clock"}.get(timing, timing)  # fmt: skip


def run_header(provenance: dict, ceiling: dict, stored: str | None, timed: bool = True) -> str:
    """The lines above a run's tables: what ran where (GPU, versions, commit), the copy ceiling,
    the byte model, and a warning where the run is incomplete or was not timed. stored: the
    file it was read from (--from), else None."""
    lines = []
    if stored and provenance.get("complete") is False:
        lines.append(f"INCOMPLETE: {stored} has no 'complete' record: the run was interrupted "
                     "and some cases are missing; tables below cover only the rows it finished.")  # fmt: skip
    if not provenance.get("gpu") and not timed:
        lines.append("CORRECTNESS RUN (no CUDA device): Triton ran through its CPU interpreter, "
                     "so nothing was timed; below, each backend against the fp32 oracle.")  # fmt: skip
    elif not provenance.get("gpu"):
        lines.append("NOTICE: no CUDA device. Triton ran through its CPU interpreter: these times are "
                     "NOT performance numbers, only a check that every backend runs.")  # fmt: skip
    v = provenance.get("versions", {})
    versions = " | ".join(f"{p} {v[p]}" for p in ("torch", "triton") if v.get(p)) or (
        "versions not recorded"
    )
    lines.append(
        f"GPU: {provenance.get('gpu') or 'none'}"
        + (
            f" ({provenance.get('sm_count')} SMs, driver {provenance.get('driver')})"
            if provenance.get("gpu")
            else ""
        )
        + f" | {versions} | commit {provenance.get('commit') or 'not recorded'}"
        + (f" | {provenance['date']}" if provenance.get("date") else "")
    )
    if ceiling.get("ceiling_gbps"):
        lines.append(f"copy ceiling: {ceiling['ceiling_gbps']:.0f} GB/s "
                     f"(2 GiB device copy, read + write counted)")  # fmt: skip
    if timed:
        lines.append("bandwidth = counted bytes / time; rmsnorm fwd counts 2*M*N elements, bwd "
                     "3*M*N; add_rmsnorm 4*M*N each: a model, not a DRAM counter")  # fmt: skip
    lines.append("worst ulps: the largest error against the fp32 oracle, in ulps of "
                 "max(|ref|, max|ref|/1024); err/bound: the largest error over the backend's "
                 "written bound (harness/oracle.py), element by element: at most 1 passes")  # fmt: skip
    if stored:
        lines.append(f"from {stored}")
    return "\n".join(lines)
