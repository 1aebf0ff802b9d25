"""What harness.run frees after each backend: nothing for a step that built nothing, the
allocator's cache for a step that ran, and a full gc.collect() only where a cycle may hold
device memory (a raise, or memory left allocated); the rows stay as they were."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.run import COLLECT_LEFT_BEHIND_BYTES, RunConfig, run
from impls import Backend, get_backend

EAGER = get_backend("eager")
SHAPE = (8, 256)


def _never_built():
    raise AssertionError("a backend that cannot run this case was built")


def _backend(name: str, build=_never_built, **kwargs) -> Backend:
    return Backend(name=name, label=name, build=build, numerics=EAGER.numerics,
                   own_backward=False, **kwargs)  # fmt: skip


def _raises(x, w, eps):
    raise RuntimeError("kernel exploded")


@pytest.fixture
def counted(monkeypatch):
    """Counts of gc.collect() and torch.cuda.empty_cache() calls; torch.cuda.memory_allocated()
    reads counts["allocated"], which a test's backends raise to leave memory behind."""
    counts = {"collect": 0, "empty_cache": 0, "allocated": 0}
    real_collect = gc.collect

    def collect(*args, **kwargs):
        counts["collect"] += 1
        return real_collect(*args, **kwargs)

    def empty_cache():
        counts["empty_cache"] += 1

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: counts["allocated"])
    return counts


def _run_steps(backends, counts) -> tuple[list[dict], dict[str, dict]]:
    """(rows, {backend: the gc.collect and empty_cache calls made during its step}); the end
    of the case (one full free) is the last entry, "case end"."""
    marks: list[tuple[str, int, int]] = []

    def progress(msg: str) -> None:
        if msg.startswith("["):  # one line as each step starts: "[k/total ...] name dtype shape"
            marks.append((msg.split("] ")[1].split()[0], counts["collect"], counts["empty_cache"]))

    rows: list[dict] = []
    config = RunConfig(backends=backends, shapes=[SHAPE], dtypes=[torch.bfloat16],
                       timings=["host"])  # fmt: skip
    run(config, rows.append, progress=progress)
    marks.append(("case end", counts["collect"], counts["empty_cache"]))
    steps = {name: {"collect": marks[i + 1][1] - c, "empty_cache": marks[i + 1][2] - e}
             for i, (name, c, e) in enumerate(marks[:-1])}  # fmt: skip
    return rows, steps


def test_a_step_that_builds_nothing_frees_nothing_and_a_step_that_ran_frees_the_cache(counted):
    gone = _backend("gone", unavailable=lambda: "not installed here")
    narrow = _backend("narrow", unsupported=lambda shape, dtype, device: "N=256 too wide")
    last = _backend("gone-last", unavailable=lambda: "not installed here")
    rows, steps = _run_steps([gone, narrow, EAGER, last], counted)
    assert steps["gone"] == {"collect": 0, "empty_cache": 0}
    assert steps["narrow"] == {"collect": 0, "empty_cache": 0}
    # eager ran cleanly and left nothing allocated: the cache goes back, no full collect
    assert steps["eager"] == {"collect": 0, "empty_cache": 1}
    # the last step's count includes the end of the case, which still frees everything
    assert steps["gone-last"]["collect"] >= 1

    base = {"label": "gone", "op": "rmsnorm", "m": 8, "n": 256, "shape": "8x256", "dtype": "bf16",
            "timing": "host", "floor_ms": None, "oracle_passed": None, "oracle_bound_use": None,
            "oracle_max_ulps": None, "oracle_detail": None}  # fmt: skip
    skipped = [
        {**base, "backend": name, "label": name, "mode": mode, "status": status, "reason": why,
         "bytes": (2 if mode == "fwd" else 3) * 8 * 256 * 2}
        for name, status, why in (("gone", "unavailable", "not installed here"),
                                  ("narrow", "unsupported", "N=256 too wide"),
                                  ("gone-last", "unavailable", "not installed here"))
        for mode in ("fwd", "bwd")
    ]  # fmt: skip
    assert [r for r in rows if r["backend"] != "eager"] == skipped
    ran = [r for r in rows if r["backend"] == "eager"]
    assert [(r["mode"], r["status"], r["reason"], r["oracle_passed"]) for r in ran] == [
        ("fwd", "ok", None, True), ("bwd", "ok", None, True)]  # fmt: skip
    assert all(set(r) == set(base) | {"backend", "mode", "status", "reason", "bytes", "ms", "p20",
                                      "p80", "launch", "gbps"} for r in ran)  # fmt: skip


def test_a_step_that_raised_or_left_memory_allocated_gets_a_full_collect(counted):
    def leaking(nbytes: int):
        def build():
            counted["allocated"] += nbytes  # as if the build kept device memory alive
            return EAGER.build()

        return build

    backends = [
        _backend("raises", build=lambda: _raises),
        _backend("bad-build", build=lambda: (_ for _ in ()).throw(ImportError("vanished"))),
        _backend("leaks-little", build=leaking(COLLECT_LEFT_BEHIND_BYTES // 256)),
        _backend("leaks-much", build=leaking(COLLECT_LEFT_BEHIND_BYTES)),
        EAGER,
    ]
    rows, steps = _run_steps(backends, counted)
    assert steps["raises"] == {"collect": 1, "empty_cache": 1}
    assert steps["bad-build"] == {"collect": 1, "empty_cache": 1}
    assert steps["leaks-little"] == {"collect": 0, "empty_cache": 1}
    assert steps["leaks-much"] == {"collect": 1, "empty_cache": 1}
    by = {(r["backend"], r["mode"]): r for r in rows}
    assert by[("raises", "fwd")]["status"] == "error"
    assert "vanished" in by[("bad-build", "bwd")]["reason"]
    assert by[("leaks-much", "fwd")]["status"] == "ok"
