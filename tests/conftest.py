"""Shared test setup: the device, the Triton interpreter on machines without CUDA, parallel
workers on a CPU, and a skip summary of one line per reason.

TRITON_INTERPRET must be set before triton is first imported, which happens when the triton
backend builds its kernels; conftest runs before any test module imports them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter

import pytest
import torch

from harness.interpreter import use_interpreter_without_cuda

ON_GPU = use_interpreter_without_cuda()  # raises, naming the fix, for a triton/numpy mismatch

DEVICE = "cuda" if ON_GPU else "cpu"

#: pytest-benchmark columns when none are asked for: the default ten make a 300-column table.
BENCHMARK_COLUMNS = ["min", "median", "iqr", "rounds"]


def pytest_report_header(config: pytest.Config) -> str:
    where = torch.cuda.get_device_name() if ON_GPU else "CPU (Triton interpreter, cut sweeps)"
    return f"rmsnorm-bench: device {where}, torch {torch.__version__}"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """On a CPU, spread the tests over one worker a core (pytest-xdist, in the test extra)
    unless -n was given: the interpreter keeps one core busy a test. Never on a GPU, whose
    tests time paths and share one device; never while benchmarking (pytest-benchmark turns
    itself off under xdist). ``-n 0`` runs serially."""
    option = config.option
    if ON_GPU or getattr(option, "numprocesses", "absent") is not None:
        return  # xdist absent (-p no:xdist), or -n given
    if getattr(option, "benchmark_only", False) or option.collectonly or option.usepdb:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    option.numprocesses = "auto"
    if option.dist == "no":
        option.dist = "worksteal"  # test times range from milliseconds to seconds


def pytest_configure(config: pytest.Config) -> None:
    benchmarking = bool(getattr(config.option, "benchmark_only", False))
    columns = getattr(config.option, "benchmark_columns", None)
    if benchmarking and columns in (None, _DEFAULT_COLUMNS):
        config.option.benchmark_columns = BENCHMARK_COLUMNS
    if benchmarking and getattr(config.option, "benchmark_name", None) == "normal":
        config.option.benchmark_name = "short"
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


@pytest.fixture
def force_paths():
    """force_paths(forward=..., backward=...): the named paths (dispatch.path_name) are every
    call's only ones for the rest of the test, offered or not: the public kernel-test override,
    dispatch.override(offered_only=False), held open until the test ends."""
    from impls.triton_rmsnorm import dispatch

    with contextlib.ExitStack() as stack:
        yield lambda **names: stack.enter_context(dispatch.override(**names, offered_only=False))


@pytest.fixture
def pretend_device():
    """pretend_device(sm_count=..., capability=..., shared_bytes_per_block=...,
    shared_bytes_per_sm=..., inline_ptx=...): every device has these facts for the rest of the
    test (dispatch.pretend_device, held open until the test ends; a later call's facts win)."""
    from impls.triton_rmsnorm import dispatch

    with contextlib.ExitStack() as stack:
        yield lambda **facts: stack.enter_context(dispatch.pretend_device(**facts))


@pytest.fixture
def reading_tables():
    """reading_tables(enabled=True): calls read the committed table and the tuning cache, or
    ignore them (False, as the tests' RMSNORM_TRITON_AUTOTUNE=0 does), for the rest of the test
    (dispatch.reading_tables, held open until the test ends; a later call's setting wins)."""
    from impls.triton_rmsnorm import dispatch

    with contextlib.ExitStack() as stack:
        yield lambda enabled=True: stack.enter_context(dispatch.reading_tables(enabled))


@pytest.fixture(autouse=True)
def _fresh_replays():
    """Each test starts with no recorded replays (impls/triton_rmsnorm/launch.py): a signature
    recorded by an earlier test (say, untuned) must not stand in for the path a test means to
    run (say, the autotuned one). Within a test, a signature's later calls replay as usual."""
    from impls.triton_rmsnorm import replays

    replays.forget()  # (and the C++ host path's entries, where it is on)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under --benchmark-only, the tests that take no benchmark are deselected (one count in
    the summary) rather than each skipped with the same reason."""
    if not getattr(config.option, "benchmark_only", False):
        return
    keep = [item for item in items if "benchmark" in getattr(item, "fixturenames", ())]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


#: pytest-benchmark's default --benchmark-columns (kept equal to its own list).
_DEFAULT_COLUMNS = ["min", "max", "mean", "stddev", "median", "iqr", "outliers", "ops", "rounds",
                    "iterations"]  # fmt: skip


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return re.sub(r"^Skipped: ", "", text)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The skips, one line per reason with its count (-rs would list every test)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.when != "teardown"]
    if not skipped:
        return
    reasons = Counter(_skip_reason(r) for r in skipped)
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="-")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:4d}  {reason}")


@pytest.fixture
def python_host_path():
    """Python's replays serve the test's calls, the C++ host path set aside where it is on
    (RMSNORM_TRITON_HOST=cpp): for tests that count Python's replays or name its autograd node."""
    from impls.triton_rmsnorm import host_path

    with host_path.set_aside():
        yield
