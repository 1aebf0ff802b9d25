"""harness.host_cost on the CPU: its grid, its two calls, its ratios, bars and summary, with a
fake host clock (the real one needs a GPU's queue)."""

from __future__ import annotations

import pytest
import torch

from harness import host_cost
from tests.conftest import DEVICE


def test_ratios_and_bars_per_mode(monkeypatch):
    figures = {"triton": {"nograd": 10.0, "fwd_bwd": 130.0},
               "torch": {"nograd": 12.0, "fwd_bwd": 100.0}}  # fmt: skip
    seen = []
    real_calls = host_cost.calls

    def recording_calls(fn, x, w, dy, eps):
        made = real_calls(fn, x, w, dy, eps)
        seen.append((fn, tuple(x.shape), x.dtype))
        return made

    monkeypatch.setattr(host_cost, "calls", recording_calls)
    backend_of = {}

    def host_us(call):
        out = call()  # both calls run on the interpreter: real outputs
        assert out is not None
        fn = seen[-1][0]
        name = backend_of.setdefault(fn, host_cost.BACKENDS[len(backend_of) % 2])
        return figures[name][call.__name__]

    rows = host_cost.measure([64], [1, 3], ["bf16"], host_us=host_us, device=DEVICE)
    assert [(r["m"], r["mode"]) for r in rows] == [(1, "nograd"), (1, "fwd_bwd"),
                                                   (3, "nograd"), (3, "fwd_bwd")]  # fmt: skip
    assert {tuple(s[1]) for s in seen} == {(1, 64), (3, 64)}
    nograd, fwd_bwd = rows[0], rows[1]
    assert nograd["ratio"] == pytest.approx(10 / 12) and nograd["met"] is True
    assert fwd_bwd["ratio"] == pytest.approx(1.3) and fwd_bwd["met"] is False  # bar 1.2
    table = host_cost.summary(rows)
    assert "| nograd | <= 1.0 | 2 of 2 |" in table and "| fwd_bwd | <= 1.2 | 0 of 2 |" in table


def test_a_failing_backend_leaves_its_figures_empty_and_the_run_goes_on():
    def host_us(call):
        raise RuntimeError("boom")

    rows = host_cost.measure([64], [2], ["fp16"], host_us=host_us, device=DEVICE)
    assert len(rows) == 2
    for row in rows:
        assert row["ours_us"] is None and row["ratio"] is None and row["met"] is None
        assert set(row["errors"]) == set(host_cost.BACKENDS) and "boom" in row["errors"]["torch"]
    assert host_cost.summary(rows).count("\n") == 1  # the header alone


def test_the_calls_give_the_oracle_shapes_and_gradients():
    x = torch.randn(3, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    dy = torch.randn(3, 64, device=DEVICE)
    made = host_cost.calls(
        lambda a, b, e: torch.nn.functional.rms_norm(a, (64,), b, e), x, w, dy, 1e-6
    )
    y = made["nograd"]()
    assert y.shape == (3, 64) and not y.requires_grad
    dx, dw = made["fwd_bwd"]()
    assert dx.shape == (3, 64) and dw.shape == (64,)


def test_main_needs_a_gpu(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert host_cost.main(["--out", str(tmp_path / "h.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_each_host_path_is_timed_under_itself_the_cpp_one_first(monkeypatch):
    from impls.triton_rmsnorm import host_path

    class Module:  # stands in for the built C++ module: it serves nothing
        def forward(self, *args):
            return None

    module = Module()
    monkeypatch.setattr(host_path, "MODULE", module)
    monkeypatch.setattr(host_path, "_LOADED", module)
    seen, figures = [], iter([10.0, 10.0, 30.0, 30.0, 20.0, 20.0])

    def host_us(call):
        call()
        seen.append(host_path.current())
        return next(figures)

    rows = host_cost.measure([64], [2], ["bf16"], host_us=host_us, device=DEVICE,
                             host_paths=("python", "cpp"))  # fmt: skip
    # per case: ours under cpp (2 calls), ours under python (2), then torch (2, the process's own)
    assert seen == ["cpp", "cpp", "python", "python", "cpp", "cpp"]
    assert [(r["host_path"], r["mode"]) for r in rows] == [
        ("cpp", "nograd"),
        ("cpp", "fwd_bwd"),
        ("python", "nograd"),
        ("python", "fwd_bwd"),
    ]
    assert [r["ratio"] for r in rows] == [0.5, 0.5, 1.5, 1.5]
    table = host_cost.summary(rows)
    assert "| cpp | nograd | <= 1.0 | 1 of 1 |" in table and "| python | fwd_bwd |" in table
    monkeypatch.setattr(host_path, "MODULE", None)
    figures = iter([1.0] * 6)
    with pytest.raises(RuntimeError, match="C\\+\\+ host path is not on"):
        host_cost.measure([64], [2], ["bf16"], host_us=host_us, device=DEVICE,
                          host_paths=("cpp",))  # fmt: skip
