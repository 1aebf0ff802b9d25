"""pytest --benchmark-only: every available backend over a representative shape set.

Each benchmark carries the harness's byte count, bandwidth and oracle result in extra_info, so
`python -m harness.compare --from <pytest-benchmark JSON>` ranks them. pytest-benchmark's timer is
host wall clock around each call, with a CUDA synchronize inside the timed call: the host-inclusive
view. Outside --benchmark-only these run once, untimed, as smoke tests. On a CPU the times are
the Triton interpreter's: each table is headed "interpreter timings on CPU: meaningless for
speed", and extra_info["timer"] says the same.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from harness import traffic
from harness.checks import check_backend
from harness.inputs import make_inputs
from impls import all_backends
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE, ON_GPU

SHAPES = [(4096, 4096), (4096, 8192), (16384, 8192)] if ON_GPU else [(64, 1024)]
#: The benchmark group of every CPU timing: the table's header then says what they are.
INTERPRETER_GROUP = "interpreter timings on CPU: meaningless for speed"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _sync() -> None:
    if ON_GPU:
        torch.cuda.synchronize()


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
@pytest.mark.parametrize("backend", [pytest.param(b, id=b.name) for b in all_backends()])
def test_bench(benchmark, backend, dtype, shape, mode):
    reason = backend.skip_reason(shape, dtype, DEVICE)
    if reason is not None:
        pytest.skip(f"{backend.name}: {reason}")
    if mode == "bwd" and not backend.has_backward:
        pytest.skip(f"{backend.name}: forward-only")
    fn = backend.build()
    inputs = make_inputs(shape, dtype, DEVICE)
    check = check_backend(backend, fn, inputs)
    x = inputs.x.detach().requires_grad_(True)
    w = inputs.weight.detach().requires_grad_(True)
    if mode == "fwd":

        def call():
            fn(x, w, inputs.eps)
            _sync()
    else:
        y = fn(x, w, inputs.eps)

        def call():
            torch.autograd.grad(y, (x, w), inputs.dy, retain_graph=True)
            _sync()

    call()  # compile and autotune outside the timed rounds
    m, n = shape
    nbytes = traffic.counted_bytes(mode, m, n, x.element_size())
    # pytest-benchmark prints each group under its own header: on a CPU the header says what
    # the numbers are.
    benchmark.group = f"{mode} {m}x{n}" if ON_GPU else INTERPRETER_GROUP
    benchmark.extra_info.update({
        "backend": backend.name, "label": backend.label, "m": m, "n": n, "shape": f"{m}x{n}",
        "dtype": DTYPE_NAMES[dtype], "mode": mode, "bytes": nbytes,
        "gpu": torch.cuda.get_device_name() if ON_GPU else None,
        "oracle_passed": check.passed, "oracle_max_ulps": check.worst_ulps,
        "timer": "pytest wall clock" if ON_GPU else "Triton interpreter on CPU: not a speed",
        "torch": torch.__version__, "triton": _version("triton"),
    })  # fmt: skip
    benchmark.pedantic(call, rounds=20 if ON_GPU else 2, warmup_rounds=2 if ON_GPU else 0)
    if benchmark.stats is not None:
        benchmark.extra_info["gbps"] = traffic.gbps(nbytes, benchmark.stats.stats.median * 1e3)
    assert check.passed, check.summary()
