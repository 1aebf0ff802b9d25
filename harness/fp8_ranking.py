"""rmsnorm_fp8 ranked beside its peers from harness.fp8_bench's rows: one line per (case, mode)
against issue 34's targets.

- ahead: shapes where ours is faster than every peer that ran the case and passed the fp8
  oracle (a peer failing the oracle is not a rival; its failures are listed);
- fastest passing peer / ours: geomean and the worst shape (< 1: a peer is faster);
- x plain forward (fwd): ours over our plain 16-bit forward at the shape (the same residual
  add where the case has one; rows written before the bench timed the plain forward with a
  residual compare against the one without, and say so);
- of copy: shapes of at least COPY_TARGET_BYTES counted bytes at or above 90% of a same-shape
  copy's bandwidth.

    python -m harness.fp8_bench --from FILE.jsonl    (this table, and no measuring)
"""

from __future__ import annotations

import math
from collections import defaultdict

OURS = "triton-fp8"
#: Our plain forward without and with a residual add (fp8_bench's "plain" rows).
PLAIN, PLAIN_RESIDUAL = "triton", "triton-add"
COPY_TARGET_BYTES = 64 << 20
COPY_TARGET = 0.90
PLAIN_TARGET = 1.1


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _shape_key(shape: str) -> tuple[int, int]:
    m, n = shape.split("x")
    return int(m), int(n)


def plain_forward(plain: dict, shape: str, case: str) -> tuple[dict | None, bool]:
    """(our plain forward's row that a case's forward is held against, whether it lacks the
    case's residual add): the plain forward with the add for a +res case, falling back to the
    one without (rows written before the bench timed the add); plain: (shape, backend) -> row."""
    if not case.endswith("+res"):
        return plain.get((shape, PLAIN)), False
    with_add = plain.get((shape, PLAIN_RESIDUAL))
    if with_add is not None:
        return with_add, False
    base = plain.get((shape, PLAIN))
    return base, base is not None


def rank(rows: list[dict]) -> list[dict]:
    """One dict per (case, mode) ours ran: the figures above. Where the rows mark finished
    shapes ("shape-done"), a shape cut short is left out."""
    finished = {r["shape"] for r in rows if r.get("case") == "shape-done"}
    if finished:
        rows = [r for r in rows if r.get("shape") in finished or "shape" not in r]
    plain = {(r["shape"], r["backend"]): r for r in rows
             if r.get("case") == "plain" and r.get("status") == "ok"}  # fmt: skip
    timed = [r for r in rows if r.get("status") == "ok" and r.get("case") not in ("plain", None)
             and "ms" in r]  # fmt: skip
    by_case = defaultdict(list)
    for r in timed:
        by_case[(r["case"], r["mode"], r["shape"])].append(r)
    lines: dict[tuple, dict] = {}
    for (case, mode, shape), group in by_case.items():
        ours = next((r for r in group if r["backend"] == OURS), None)
        if ours is None:
            continue
        line = lines.setdefault((case, mode), {
            "case": case, "mode": mode, "shapes": 0, "ahead": 0, "peer_ratios": [],
            "plain_ratios": [], "plain_without_residual": False, "big": 0, "big_met": 0,
            "ours_failed": 0, "failing_peers": defaultdict(int)})  # fmt: skip
        line["shapes"] += 1
        if not ours.get("oracle_passed", False):
            line["ours_failed"] += 1
        rivals = [r for r in group if r["backend"] != OURS and r.get("oracle_passed")]
        for r in group:
            if r["backend"] != OURS and not r.get("oracle_passed"):
                line["failing_peers"][r["backend"]] += 1
        if rivals:
            best = min(rivals, key=lambda r: r["ms"])
            ratio = best["ms"] / ours["ms"]
            line["peer_ratios"].append((ratio, shape, best["backend"]))
            line["ahead"] += ratio > 1.0
        else:
            line["ahead"] += 1  # no passing peer ran the case here
        if mode == "fwd":
            base, without_residual = plain_forward(plain, shape, case)
            line["plain_without_residual"] |= without_residual
            if base is not None:
                line["plain_ratios"].append((ours["ms"] / base["ms"], shape))
        copy = plain.get((shape, "copy"))
        if copy is not None and ours["bytes"] >= COPY_TARGET_BYTES:
            line["big"] += 1
            line["big_met"] += ours["gbps"] >= COPY_TARGET * copy["gbps"]
    order = {c: i for i, c in enumerate(("per_token", "per_tensor", "block", "per_tensor+res",
                                         "block+res"))}  # fmt: skip
    return sorted(lines.values(), key=lambda d: (order.get(d["case"], 99), d["mode"]))


def table(rows: list[dict]) -> str:
    """The ranking as a Markdown table, then the peers that failed the oracle."""
    out = [
        "| case | mode | shapes | ahead of every passing peer | fastest passing peer / ours: "
        "geomean, worst (shape, peer) | x plain forward: geomean, worst; within 1.1x | "
        ">= 90% of copy, shapes >= 64 MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    failing = []
    for d in rank(rows):
        peers = "-"
        if d["peer_ratios"]:
            worst = min(d["peer_ratios"])
            peers = (f"{_geomean([r for r, _s, _b in d['peer_ratios']]):.3f}, "
                     f"{worst[0]:.3f} ({worst[1]}, {worst[2]})")  # fmt: skip
        plain = "-"
        if d["plain_ratios"]:
            ratios = [r for r, _s in d["plain_ratios"]]
            worst = max(d["plain_ratios"])
            within = sum(r <= PLAIN_TARGET for r in ratios)
            plain = (f"{_geomean(ratios):.2f}, {worst[0]:.2f} ({worst[1]}); "
                     f"{within} of {len(ratios)}")  # fmt: skip
            if d["plain_without_residual"]:
                plain += " (against the plain forward without a residual)"
        copy = f"{d['big_met']} of {d['big']}" if d["big"] else "-"
        ahead = f"{d['ahead']} of {d['shapes']}"
        if d["ours_failed"]:
            ahead += f" (ours FAILED the oracle at {d['ours_failed']})"
        out.append(f"| {d['case']} | {d['mode']} | {d['shapes']} | {ahead} | {peers} | {plain} "
                   f"| {copy} |")  # fmt: skip
        for backend, count in sorted(d["failing_peers"].items()):
            failing.append(f"- {backend}, {d['case']} {d['mode']}: failed the oracle at {count} "
                           f"of {d['shapes']} shapes (not ranked there)")  # fmt: skip
    return "\n".join(out + ([""] + failing if failing else []))
