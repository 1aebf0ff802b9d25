"""The opt-in cost columns (harness.costs writes them into rows: host µs a call, first-call
seconds and memory, batch invariance, cross-process determinism) and the DRAM-bytes check
(harness.ncu_bytes records) as tables, for harness.compare's output and the results pages."""

from __future__ import annotations

from collections import defaultdict

from tabulate import tabulate

from harness.rows import fmt, median, op_of

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
            "host_us": median(values("host_us")),
            "host_cases": len(values("host_us")),
            "first_cold_s": median(values("first_call_cold_s")),
            "first_warm_s": median(values("first_call_warm_s")),
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
    table = [[e["backend"], fmt(e["host_us"], ".1f"), e["host_cases"], fmt(e["first_cold_s"], ".2f"),
              fmt(e["first_warm_s"], ".2f"), e["first_cases"], fmt(e["extra_mem_mib"], ".1f"),
              e["batch"], e["deterministic"]] for e in entries]  # fmt: skip
    headers = ["backend", "host us/call (median)", "cases", "first call s, cold caches",
               "first call s, warm caches", "cases", "first-call extra MiB (max)",
               "batch-invariant (bitwise)", "deterministic across processes"]  # fmt: skip
    notes = [f"  {e['backend']}: {n}" for e in entries for n in e["errors"]]
    text = tabulate(table, headers=headers, tablefmt="github")
    return text + ("\nfirst-call errors:\n" + "\n".join(notes) if notes else "")


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
        return fmt(None if value is None else value / 1e6, ".2f")

    body = []
    for r in records:
        model_read = _model_read_bytes(r)
        read = r.get("dram_read_bytes")
        body.append([r["backend"], r["shape"], r["dtype"], r["mode"], str(r.get("kernels", "-")),
                     mb(read), mb(model_read),
                     fmt(None if read is None else read / model_read, ".2f"),
                     mb(r.get("dram_write_bytes")), mb(r["model_bytes"] - model_read),
                     fmt(r.get("ratio"), ".2f"), r.get("error") or ""])  # fmt: skip
    return body


def ncu_table(records: list[dict]) -> str:
    """ncu_rows as a table."""
    return tabulate(ncu_rows(records), headers=NCU_HEADERS, tablefmt="github",
                    disable_numparse=True)  # fmt: skip
