"""The harness survives failing backends and keeps what it measured."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import results
from harness.run import RunConfig, _add_bandwidth, run
from impls import Backend, get_backend


def _backend(name: str, fn=None, build=None) -> Backend:
    return Backend(name=name, label=name, build=build or (lambda: fn), numerics="fused_fp32",
                   own_backward=False)  # fmt: skip


def _raises(x, w, eps):
    raise RuntimeError("kernel exploded")


def _out_of_memory(x, w, eps):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 TiB")


def _nan(x, w, eps):
    return torch.full_like(x, float("nan")) + 0 * x + 0 * w


def _bad_build():
    raise ImportError("peer package vanished")


def _run(backends, **kwargs) -> list[dict]:
    rows: list[dict] = []
    config = RunConfig(backends=backends, shapes=[(8, 256)], dtypes=[torch.bfloat16],
                       timings=["host"], **kwargs)  # fmt: skip
    run(config, rows.append, progress=lambda msg: None)
    return rows


def test_failing_backends_are_recorded_and_the_run_goes_on():
    backends = [
        _backend("raises", _raises),
        _backend("oom", _out_of_memory),
        _backend("nan", _nan),
        _backend("bad-build", build=_bad_build),
        get_backend("eager"),
    ]
    rows = _run(backends)
    by = {(r["backend"], r["mode"]): r for r in rows}
    assert len(rows) == 2 * len(backends)
    assert by[("raises", "fwd")]["oracle_passed"] is False
    assert "kernel exploded" in by[("raises", "fwd")]["oracle_detail"]
    assert by[("raises", "fwd")]["status"] == "error"
    assert (
        by[("oom", "bwd")]["status"] == "error" and "out of memory" in by[("oom", "bwd")]["reason"]
    )
    assert by[("nan", "fwd")]["oracle_passed"] is False
    assert by[("bad-build", "fwd")]["status"] == "error"
    assert "peer package vanished" in by[("bad-build", "fwd")]["reason"]
    assert by[("eager", "fwd")]["status"] == "ok" and by[("eager", "bwd")]["oracle_passed"]


def test_an_interrupted_run_keeps_the_rows_it_finished(tmp_path):
    path = tmp_path / "partial.jsonl"
    writer = results.ResultWriter(path)
    writer.write({"kind": "provenance", "gpu": None, "date": "2026-11-29"})
    written = 0

    def sink(row):
        nonlocal written
        if written == 3:
            raise KeyboardInterrupt
        writer.write({"kind": "row", **row})
        written += 1

    config = RunConfig(backends=[get_backend("eager"), get_backend("triton")], shapes=[(8, 256)],
                       dtypes=[torch.bfloat16], timings=["host"])  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        run(config, sink, progress=lambda msg: None)
    writer.close()
    _, _, rows = results.load(path)
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)


def test_faster_than_the_copy_ceiling_is_flagged_suspect():
    row = {"status": "ok", "bytes": 4 * 10**9, "ms": 1.0, "floor_ms": None}
    _add_bandwidth(row, ceiling=3000.0, m=1, n=1, es=2)
    assert row["gbps"] == pytest.approx(4000.0) and row["suspect"] is True
    row = {"status": "ok", "bytes": 3 * 10**9, "ms": 1.0, "floor_ms": None}
    _add_bandwidth(row, ceiling=3000.0, m=1, n=1, es=2)
    assert row["suspect"] is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator is CUDA's")
@pytest.mark.parametrize("numel", [1 << 12, 1 << 18, 3 << 20], ids=["8KiB", "512KiB", "6MiB"])
def test_poisoned_memory_reaches_the_next_allocation(numel):
    """On CUDA, what a backend allocates right after poisoning reads NaN until written, so an
    unwritten output element cannot pass the oracle by luck, even when the allocator's pools
    hold free blocks of finite stale values inside partly used segments."""
    from harness.checks import poison_free_memory

    # Fragment both pools: holes of finite values between blocks still in use.
    blocks = [torch.full((size,), 1.0, dtype=torch.bfloat16, device="cuda")
              for size in (1 << 11, 1 << 12, 1 << 17, 1 << 18, 3 << 20, 1 << 22) * 3]  # fmt: skip
    keep = blocks[::2]
    del blocks
    poison_free_memory(torch.device("cuda"), 4 * numel)  # as the harness: more than the output
    fresh = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    assert torch.isnan(fresh).all()
    del keep


def test_backend_roles_are_checked():
    """One "ours" and one "baseline" backend per op, named by the registry (the tables compare
    against them); an unknown role is refused."""
    from impls import OPS, Backend, all_backends, backend_with_role, check_roles

    for op in OPS:
        assert get_backend(backend_with_role(op, "ours")).role == "ours"
        assert get_backend(backend_with_role(op, "baseline")).role == "baseline"
    assert backend_with_role("rmsnorm", "ours") == "triton"
    registry = {b.name: b for b in all_backends(op=None)}
    check_roles(registry)
    extra = dataclasses.replace(get_backend("torch"), name="second-ours", role="ours")
    with pytest.raises(RuntimeError, match="expected one 'ours' backend"):
        check_roles({**registry, extra.name: extra})
    without_baseline = {k: b for k, b in registry.items() if b.name != "eager"}
    with pytest.raises(RuntimeError, match="expected one 'baseline' backend"):
        check_roles(without_baseline)
    with pytest.raises(ValueError, match="role: expected one of"):
        Backend(name="x", label="x", build=lambda: None, numerics="fused_fp32",
                own_backward=True, role="champion")  # fmt: skip
