"""The single-tile backward for rows that do not start on 16 bytes (N odd, say):
rmsnorm_bwd_shifted_kernel. Which calls take it; its numerics against the oracle over every
residue class of rows, with and without the row's last columns wrapping round to the first lanes,
narrow rows several a step, fp32 and a residual's gradient; that it writes dx inside the rows and
nowhere else, and that the neighbouring rows' elements it loads with each row's end groups never
reach that row's results; and that it compiles for sm_90 with its loads and stores as 16-byte
vectors (CI has no GPU)."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import kernels, launch
from tests import sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.test_triton_features import _assert_matches_oracle

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _period(n, dtype=BF16, dy_dtype=None, x_offset=0, x_stride=None, dh_offset=None):
    """backward_row_period for 4 rows of width n: x at x_offset elements into its buffer with
    row stride x_stride (default n), dy contiguous, dh_out (when dh_offset is given) at
    dh_offset elements into its buffer."""
    stride = x_stride or n
    x = torch.zeros(x_offset + 4 * stride, dtype=dtype)[x_offset:].as_strided((4, n), (stride, 1))
    dy = torch.zeros(4, n, dtype=dy_dtype or dtype)
    dh = None
    if dh_offset is not None:
        dh = torch.zeros(dh_offset + 4 * n, dtype=dtype)[dh_offset:].view(4, n)
    return launch.backward_row_period(x, dy, dh)


def test_which_rows_take_it():
    """Rows whose starts leave 16 bytes, with one alignment pattern in x, dy, dx (contiguous)
    and dh_out: the period is the number of rows after which the pattern repeats."""
    assert _period(4095) == 8 and _period(4095, FP16) == 8
    assert _period(4094) == 4 and _period(4092) == 2
    assert _period(4095, FP32) == 4 and _period(4094, FP32) == 2
    assert _period(4096) == 1 and _period(4088) == 1 and _period(4092, FP32) == 1
    assert _period(4095, x_stride=4103) == 8  # strided rows in the same pattern as dx
    assert _period(4095, x_stride=4100) == 1  # ... or not
    assert _period(4095, x_offset=1) == 1  # a base off 16 bytes
    assert _period(4095, dh_offset=0) == 8 and _period(4095, dh_offset=3) == 1
    assert _period(4095, dy_dtype=FP32) == 1  # element sizes differ
    assert _period(15) == 1 and _period(17) == 8  # rows of fewer than two 16-byte groups


def test_the_launch_passes_its_constants(monkeypatch):
    """VEC, PERIOD and MAY_WRAP (whether N plus the largest shift passes the tile) as the
    kernel needs them; aligned rows keep the plain kernel."""
    launched = []
    monkeypatch.setattr(
        launch, "_launch", lambda name, grid, *args, **kw: launched.append((name, grid, kw))
    )
    for n, dtype in ((4095, BF16), (4001, BF16), (4094, BF16), (4092, FP16), (4095, FP32),
                     (4096, BF16)):  # fmt: skip
        x = torch.zeros(20, n, dtype=dtype)
        launch._backward_single_tile(x, x, x[0], torch.empty(20), 0.0, x, x, False)
    constants = [(name, kw.get("VEC"), kw.get("PERIOD"), kw.get("MAY_WRAP"))
                 for name, _, kw in launched]  # fmt: skip
    shifted = "rmsnorm_bwd_shifted_kernel"
    assert constants == [
        (shifted, 8, 8, True),  # shifts 0-7: 4095 + 7 > 4096
        (shifted, 8, 8, False),  # 4001 + 7 <= 4096
        (shifted, 8, 4, True),  # shifts 0, 2, 4, 6
        (shifted, 8, 2, False),  # shifts 0, 4: 4092 + 4 <= 4096
        (shifted, 4, 4, True),  # fp32: 4 elements in 16 bytes, shifts 0-3
        ("rmsnorm_bwd_kernel", None, None, None),
    ]
    programs = launched[0][1][0]  # whole classes of rows, no more programs than SMs (or 8)
    assert programs % 8 == 0 and programs <= max(8, launch._programs_cap(x.device))


@pytest.mark.parametrize(
    "shape, dtype, w_dtype",
    [
        ((37, 4095), BF16, BF16),  # every residue class, rows not a multiple of 8, wrapping
        ((64, 4001), FP16, FP16),  # no wrapping
        ((19, 4094), BF16, FP32),  # period 4
        ((5, 4092), FP16, FP16),  # period 2
        ((3, 4095), BF16, BF16),  # fewer rows than the period: programs without rows
        ((300, 1023), BF16, BF16),  # narrow rows, several a step
        ((33, 1001), FP32, FP32),  # fp32: 4 elements in 16 bytes
        ((16, 18), BF16, BF16),  # the narrowest rows it takes
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES[p],
)
def test_matches_the_oracle(shape, dtype, w_dtype):
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy)
    assert "rmsnorm_bwd_shifted_kernel" in launch.take_launch_configs()


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=lambda d: DTYPE_NAMES[d])
def test_with_a_residual(dtype):
    """The gradient arriving on h (HAS_DH_OUT) read in the same shifted frame."""
    from tests.test_residual import _check

    launch.take_launch_configs()
    _check((45, 4093), dtype)
    assert "rmsnorm_bwd_shifted_kernel" in launch.take_launch_configs()


def _run_kernel(x, w, dy, rstd, dx, partial, programs, rows_per_program, period):
    n = x.shape[1]
    vec = 16 // x.element_size()
    args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                             rows_per_program)  # fmt: skip
    block_n = launch.block_size(n)
    config = launch._heuristic_config("rmsnorm_bwd_shifted_kernel", block_n)
    kernels.rmsnorm_bwd_shifted_kernel[(programs,)](
        *args, BLOCK_N=block_n, VEC=vec, PERIOD=period,
        MAY_WRAP=n + vec - vec // period > block_n, HAS_DH_OUT=False, **config,
    )  # fmt: skip


def _grid_and_inputs(m, n, dtype):
    inputs = make_inputs((m, n), dtype, DEVICE)
    x, w, dy = inputs.x, inputs.weight, inputs.dy
    rstd = torch.rsqrt(x.float().pow(2).mean(dim=1) + 1e-5)
    period = launch.backward_row_period(x, dy, None)
    assert period == 8
    programs, rows_per_program = launch._single_tile_backward_grid(m, x.device, period)
    return x, w, dy, rstd, period, programs, rows_per_program


def test_writes_inside_the_rows_only():
    """dx inside a buffer with 16 bytes of guard on each side: every element of dx written,
    no guard touched (the end groups are stored element by element); every partial written."""
    m, n = 23, 4095
    x, w, dy, rstd, period, programs, rows_per_program = _grid_and_inputs(m, n, BF16)
    guard = 8  # 16 bytes: dx's base stays aligned
    buffer = torch.full((guard + m * n + guard,), 7.0, dtype=BF16, device=DEVICE)
    dx = buffer[guard : guard + m * n].view(m, n)
    dx.fill_(float("nan"))
    partial = torch.full((programs, n), float("nan"), device=DEVICE)
    _run_kernel(x, w, dy, rstd, dx, partial, programs, rows_per_program, period)
    assert not dx.isnan().any() and not partial.isnan().any()
    assert bool((buffer[:guard] == 7.0).all()) and bool((buffer[guard + m * n :] == 7.0).all())


def test_neighbouring_rows_never_reach_a_row():
    """Each row's end groups are loaded whole, with elements of the rows beside it: infinities
    at row 9's two ends change no other row's dx, nor dw outside those two columns."""
    m, n = 23, 4095
    x, w, dy, rstd, period, programs, rows_per_program = _grid_and_inputs(m, n, BF16)
    results = []
    for poisoned in (False, True):
        x_run = x.clone()
        if poisoned:
            x_run[9, 0] = x_run[9, -1] = float("inf")
        dx = torch.empty_like(x)
        partial = torch.empty((programs, n), device=DEVICE)
        _run_kernel(x_run, w, dy, rstd, dx, partial, programs, rows_per_program, period)
        results.append((dx, partial.sum(dim=0)))
    (dx_clean, dw_clean), (dx_poisoned, dw_poisoned) = results
    others = [row for row in range(m) if row != 9]
    assert torch.equal(dx_poisoned[others], dx_clean[others])
    assert torch.equal(dw_poisoned[1:-1], dw_clean[1:-1])
    assert not torch.isfinite(dw_poisoned[[0, -1]]).any()


def test_compiles_for_sm90_with_vector_loads_and_stores():
    """The interpreter runs the kernel's code but not its compilation: CI compiles it for
    sm_90 (no GPU) and checks that x and dy arrive as 16-byte vectors, staged through cp.async
    when the row loop is pipelined, and that dx leaves as 16-byte vectors; the held variant
    (16384-wide tiles) with its inline upcast."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    base = {"kernel": "bwd_shifted", "x": "bf16", "dy": "bf16", "hold": False, "extra": False,
            "block_n": 4096, "warps": 8, "stages": 1, "persistent": None}  # fmt: skip
    cases = [base, {**base, "stages": 3},
             {**base, "x": "fp16", "dy": "fp16", "hold": True, "extra": True, "block_n": 16384,
              "warps": 16}]  # fmt: skip
    found = sm90_compile.run(cases)
    plain, pipelined, held = found
    assert plain["vector loads"] > 0 and plain["vector stores"] > 0
    assert pipelined["staged vectors"] > 0 and pipelined["vector stores"] > 0
    assert held["fp16"] and held["vector stores"] > 0
