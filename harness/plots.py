"""Plots of result rows (PNG, through matplotlib, an optional dependency: plotting_problem says
when it is missing): bandwidth per backend against M*N or N, and first-call seconds."""

from __future__ import annotations

from collections import defaultdict

from harness.cost_tables import cost_entries
from harness.rows import geomean, op_of, ops_in, select


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
            chosen = [r for r in select(rows, mode, timing, op)
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
            ax.plot(xs, [geomean(points[x]) for x in xs], marker="o", ms=3, label=backend,
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
            ax.plot(xs, [geomean(points[x]) for x in xs], marker="o", ms=3, label=backend,
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
