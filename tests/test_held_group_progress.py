"""The grouped kernels in an ordinary launch (gluon_group_exchange.py's docstring), called directly
through their launchers (tests/held_group_scenarios.py): they match the oracle, give the same
bits in every run and process and whether or not their time-out fallback runs, survive graph
capture, and finish beside a kernel that holds SMs until a flag set after our call (the
SM-holding scenario, run in a process of its own with a timeout, so that a hang fails the test
instead of stopping the suite). NVIDIA Hopper-class GPU only; the CPU checks of the kernels
(compiled for sm_90) are in test_held_row.py and test_held_row_backward.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.oracle import compare, reference
from impls.triton_rmsnorm import held_launch, launch
from tests import held_group_scenarios as scenarios
from tests.test_held_row_backward import ON_NVIDIA_GPU
from tests.test_triton_features import TOL

ROOT = Path(__file__).resolve().parents[1]
needs_group_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and launch.gluon_kernels is not None
        and launch._hopper_class(torch.device("cuda"))
    ),
    reason="the grouped kernels need a Hopper-class NVIDIA GPU and a Triton with Gluon",
)

CASES = [
    # forward: 64 and 17 slices of 4096 columns (32 and 9 of 8192); 49 of 4096 (25 of 8192)
    *({"direction": "fwd", "config": c, "shape": s, "dtype": d}
      for c in (0, 1)
      for s, d in (([300, 262144], "bf16"), ([64, 65552], "fp16"), ([2, 3, 200016], "fp16"))),
    # backward: 8 and 32 slices of 8192 columns (4 and 16 of 16384); 128 of 8192 (64 of 16384)
    *({"direction": "bwd", "config": c, "shape": s, "dtype": d}
      for c in (0, 1)
      for s, d in (([300, 65536], "bf16"), ([64, 262144], "fp16"), ([4, 1048576], "bf16"))),
]  # fmt: skip


def _case_id(case: dict) -> str:
    return (
        f"{case['direction']}{case['config']}-{'x'.join(map(str, case['shape']))}-{case['dtype']}"
    )


def _run_in_process(mode: str, case: dict, timeout: float) -> dict:
    """tests.held_group_scenarios in a process of its own: its printed JSON record."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.held_group_scenarios", mode, json.dumps(case)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_group_gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_grouped_call_matches_the_oracle(case):
    x, w, dy, rstd = scenarios.case_inputs(case)
    config = scenarios.config_of(case["direction"], case["config"])
    n, m = x.shape[1], x.shape[0]
    ref = reference(x, w, scenarios.EPS, dy)
    if case["direction"] == "fwd":
        y, got_rstd = scenarios.grouped_forward(x, w, config)
        report = compare("y", y, ref.y, y.dtype, TOL["y"], n)
        assert report.passed, report.summary()
        rstd_ref = torch.rsqrt(x.double().pow(2).mean(1) + scenarios.EPS)
        torch.testing.assert_close(got_rstd.double(), rstd_ref, rtol=1e-6, atol=0)
    else:
        dx, dw = scenarios.grouped_backward(dy, x, w, rstd, config)
        for name, got, want, k in (("dx", dx, ref.dx, n), ("dw", dw, ref.dw, m)):
            report = compare(name, got, want, got.dtype, TOL[name], k)
            assert report.passed, report.summary()


BITS_CASES = [
    {"direction": "fwd", "config": 0, "shape": [300, 262144], "dtype": "bf16"},
    {"direction": "fwd", "config": 1, "shape": [64, 65552], "dtype": "fp16"},
    {"direction": "bwd", "config": 0, "shape": [2048, 65536], "dtype": "bf16"},
    {"direction": "bwd", "config": 1, "shape": [64, 262144], "dtype": "fp16"},
]


@needs_group_gpu
@pytest.mark.parametrize("case", BITS_CASES, ids=_case_id)
def test_grouped_bits_repeat_in_runs_and_processes(case):
    """Rows are claimed in whatever order groups get to them, and dw partials are per fixed
    chunk of rows: the bits are the same in three runs and in another process."""
    digests = [scenarios.digest(case) for _ in range(3)]
    assert digests[0] == digests[1] == digests[2]
    assert _run_in_process("digest", case, timeout=300) == digests[0]


FALLBACK_CASES = [
    {"direction": "fwd", "config": 0, "shape": [64, 262144], "dtype": "bf16"},  # 64 words
    {"direction": "fwd", "config": 0, "shape": [50, 65552], "dtype": "fp16"},  # 17
    {"direction": "bwd", "config": 0, "shape": [32, 262144], "dtype": "bf16"},  # 32
    {"direction": "bwd", "config": 0, "shape": [8, 1048576], "dtype": "fp16"},  # 128
]


@needs_group_gpu
@pytest.mark.parametrize("case", FALLBACK_CASES, ids=_case_id)
@pytest.mark.parametrize("spin_limit", [0, 4])
def test_fallback_gives_the_exchanges_bits(monkeypatch, case, spin_limit):
    """Readers that look for tags one past the writers' never find a row complete: once its
    polls are spent every warp recomputes every slice's sum from global memory, as its owner
    sums it, and the outputs are bitwise those of the exchange (with 0 polls member 0 also
    claims without waiting for its group)."""
    call = scenarios.call_of(case)
    exchanged = [t.clone() for t in call()]
    monkeypatch.setattr(held_launch, "HELD_GROUP_SPIN_LIMIT", spin_limit)
    monkeypatch.setattr(held_launch, "HELD_GROUP_TAG_OFFSET", 1)
    fallen_back = call()
    for a, b in zip(fallen_back, exchanged, strict=True):
        assert torch.equal(a, b), (a - b).abs().max()


@needs_group_gpu
@pytest.mark.parametrize("case", BITS_CASES[::2], ids=_case_id)
def test_grouped_call_is_captured_and_replayed(case):
    """A CUDA graph of the grouped call (its exchange zeroed by a memset node) replays twice
    with the eager bits."""
    call = scenarios.call_of(case)
    eager = [t.clone() for t in call()]
    graph = torch.cuda.CUDAGraph()
    call()  # warm on the capturing stream's side: compiled and cached
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        static = call()
    for _ in range(2):
        for t in static:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(static, eager, strict=True):
            assert torch.equal(a, b)


def _hold_cases() -> list:
    sms = launch._sm_count(0) if ON_NVIDIA_GPU else 132
    return [
        {"direction": "fwd", "config": 0, "shape": [512, 262144], "dtype": "bf16", "held": 8},
        {"direction": "fwd", "config": 1, "shape": [256, 262144], "dtype": "fp16", "held": 66},
        {"direction": "bwd", "config": 0, "shape": [512, 65536], "dtype": "bf16", "held": 8},
        {"direction": "bwd", "config": 1, "shape": [64, 1048576], "dtype": "bf16", "held": 8},
        # fewer program slots than a group (17 programs a row; 2 SMs left): the last resort
        {"direction": "fwd", "config": 0, "shape": [8, 65552], "dtype": "bf16",
         "held": sms - 2},
        {"direction": "bwd", "config": 0, "shape": [16, 65536], "dtype": "fp16",
         "held": sms - 3},
    ]  # fmt: skip


@needs_group_gpu
@pytest.mark.parametrize("case", _hold_cases(), ids=lambda c: f"{_case_id(c)}-held{c['held']}")
def test_grouped_call_finishes_beside_a_kernel_holding_sms(case):
    """A kernel on another stream holds `held` SMs until a flag that a kernel queued after our
    call sets: our call must finish on the SMs left (so releasing the holder) with no help from
    the host, and with the bits it has alone."""
    # 2 repeats of at most HOLD_TIMEOUT_S (20 s) each when the host must release the holder, plus
    # the compile: a case past 75 s hangs, and a hang must not take a device call's whole budget
    record = _run_in_process("hold", {**case, "repeats": 2}, timeout=75)
    assert record["holder_started"], record
    assert record["host_released"] == 0, record
    assert record["same_bits"], record
