"""Shared test setup: the device, and the Triton interpreter on machines without CUDA.

TRITON_INTERPRET must be set before triton is first imported, which happens when the triton
backend builds its kernels; conftest runs before any test module imports them.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if ON_GPU else "cpu"


def pytest_report_header(config: pytest.Config) -> str:
    where = torch.cuda.get_device_name() if ON_GPU else "CPU (Triton interpreter, cut sweeps)"
    return f"rmsnorm-bench: device {where}, torch {torch.__version__}"


def pytest_configure(config: pytest.Config) -> None:
    benchmarking = bool(getattr(config.option, "benchmark_only", False))
    # Outside `pytest --benchmark-only`, benchmark tests run once, untimed, as smoke tests.
    if hasattr(config.option, "benchmark_only") and not benchmarking:
        config.option.benchmark_disable = True
    # Tests judge numerics, which every launch configuration must meet: they take the heuristic
    # configuration (RMSNORM_TRITON_AUTOTUNE=0: no dispatch table), so a test's path does not
    # depend on the table of the GPU it runs on. Tests of the table, of runtime tuning and of
    # the first call turn them on on purpose (test_first_call_gpu.py, dispatch.tuning());
    # benchmarks and harness.compare time the product, with the table.
    os.environ.setdefault("RMSNORM_TRITON_AUTOTUNE", "1" if benchmarking else "0")
    # On a GPU, every cached direct launch of a compiled kernel is checked against the kernel
    # Triton itself would run (impls/triton_rmsnorm/direct.py); not while timing.
    if ON_GPU and not benchmarking:
        os.environ.setdefault("RMSNORM_TRITON_CHECK_DIRECT", "1")


@pytest.fixture(autouse=True)
def _fresh_replays(monkeypatch):
    """Each test starts with no recorded replays (impls/triton_rmsnorm/launch.py): a signature
    recorded by an earlier test (say, untuned) must not stand in for the path a test means to
    run (say, the autotuned one). Within a test, a signature's later calls replay as usual."""
    from impls.triton_rmsnorm import launch

    monkeypatch.setattr(launch, "_REPLAYS", {})
