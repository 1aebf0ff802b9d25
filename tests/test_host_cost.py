"""harness.host_cost on the CPU: its grid, its two calls, its ratios, bars and summary, with a
fake host clock (the real one needs a GPU's queue)."""

from __future__ import annotations

import pytest
import torch

from harness import host_cost
from tests.conftest import DEVICE


def _tagging_calls(monkeypatch, seen):
    """host_cost.calls, each call tagged with its backend (ours first at each case, then
    torch's) and the case recorded in seen."""
    real_calls = host_cost.calls

    def tagging_calls(fn, x, w, dy, eps):
        made = real_calls(fn, x, w, dy, eps)
        for call in made.values():
            call.backend = host_cost.BACKENDS[len(seen) % 2]
        seen.append((tuple(x.shape), x.dtype))
        return made

    monkeypatch.setattr(host_cost, "calls", tagging_calls)


def test_ratios_and_bars_per_mode(monkeypatch):
    figures = {"triton": {"nograd": 10.0, "fwd_bwd": 130.0},
               "torch": {"nograd": 12.0, "fwd_bwd": 100.0}}  # fmt: skip
    seen = []
    _tagging_calls(monkeypatch, seen)

    def host_us(call):
        out = call()  # both calls run on the interpreter: real outputs
        assert out is not None
        return figures[call.backend][call.__name__]

    rows = host_cost.measure([64], [1, 3], ["bf16"], host_us=host_us, device=DEVICE)
    assert [(r["m"], r["mode"]) for r in rows] == [(1, "nograd"), (1, "fwd_bwd"),
                                                   (3, "nograd"), (3, "fwd_bwd")]  # fmt: skip
    assert {s[0] for s in seen} == {(1, 64), (3, 64)}
    nograd, fwd_bwd = rows[0], rows[1]
    assert nograd["ratio"] == pytest.approx(10 / 12) and nograd["met"] is True
    assert fwd_bwd["ratio"] == pytest.approx(1.3) and fwd_bwd["met"] is False  # bar 1.2
    table = host_cost.summary(rows)
    assert "| nograd | <= 1.0 | 2 of 2 |" in table and "| fwd_bwd | <= 1.2 | 0 of 2 |" in table


def test_the_ratio_is_the_median_of_back_to_back_rounds(monkeypatch):
    """Host speed drifting during a case (here it halves, round by round) moves ours' and
    torch's samples alike: each round's ratio stays 2, though the medians of the two
    backends' samples, taken apart, would not give it."""
    _tagging_calls(monkeypatch, [])
    speed = {"round": 0}

    def host_us(call):
        slow = 2.0 ** speed["round"]
        figure = (20.0 if call.backend == "triton" else 10.0) * slow
        if call.backend == "torch":
            speed["round"] += 1  # torch's sample ends a round
        return figure

    rows = host_cost.measure([64], [2], ["bf16"], host_us=host_us, device=DEVICE, rounds=5)
    for row in rows:
        assert row["ratio"] == pytest.approx(2.0)
        assert row["round_ratios"] == [2.0] * 5


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
    seen = []
    figure = {"cpp": 10.0, "python": 30.0, "torch": 20.0}
    _tagging_calls(monkeypatch, [])

    def host_us(call):
        call()
        label = "torch" if call.backend == "torch" else host_path.current()
        seen.append(label)
        return figure[label]

    rows = host_cost.measure([64], [2], ["bf16"], host_us=host_us, device=DEVICE,
                             host_paths=("python", "cpp"), rounds=2)  # fmt: skip
    # per mode and round: ours under cpp (its first call records what python then replays),
    # ours under python, then torch (the process's own path: the stand-in module is on)
    assert seen == ["cpp", "python", "torch"] * 4
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
    with pytest.raises(RuntimeError, match="C\\+\\+ host path is not on"):
        host_cost.measure([64], [2], ["bf16"], host_us=host_us, device=DEVICE,
                          host_paths=("cpp",))  # fmt: skip
