"""The single-tile kernels for rows that do not start on 16 bytes (N odd, say):
rmsnorm_fwd_shifted_kernel and rmsnorm_bwd_shifted_kernel. Which calls take them; their numerics
against the oracle over every residue class of rows, with and without the row's last columns
wrapping round to the first lanes, narrow rows several a step, fp32 and a residual; that they
write y, h and dx inside the rows and nowhere else, and that the neighbouring rows' elements they
load with each row's end groups never reach that row's results; and that they compile for sm_90
with their loads and stores as 16-byte vectors (CI has no GPU)."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import (
    backward_launch,
    forward_launch,
    kernel_launch,
    kernels,
    launch,
    replays,
)
from tests import sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import assert_matches_oracle as _assert_matches_oracle

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
        kernel_launch, "_launch", lambda name, grid, *args, **kw: launched.append((name, grid, kw))
    )
    monkeypatch.setattr(backward_launch, "_reduce_partials", lambda partial, dw: None)
    for n, dtype in ((4095, BF16), (4001, BF16), (4094, BF16), (4092, FP16), (4095, FP32),
                     (4096, BF16)):  # fmt: skip
        x = torch.zeros(20, n, dtype=dtype)
        launch._backward_single_tile(x, x, x[0], torch.empty(20), 0.0, x, x, False, x[0])
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
        ((17, 4095), FP32, FP32),  # fp32, wrapping
        ((16, 18), BF16, BF16),  # the narrowest rows it takes
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES[p],
)
def test_matches_the_oracle(shape, dtype, w_dtype):
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy)
    launched = set(launch.take_launch_configs())
    assert "rmsnorm_bwd_shifted_kernel" in launched
    shifted_forward = launch.block_size(shape[1]) >= forward_launch.SHIFTED_FORWARD_FROM_BLOCK_N
    assert ("rmsnorm_fwd_shifted_kernel" in launched) == shifted_forward


def test_the_forward_takes_narrow_odd_rows_only_when_asked(monkeypatch):
    """Below SHIFTED_FORWARD_FROM_BLOCK_N (not measured) the forward keeps the plain kernel; the
    shifted one serves such rows correctly all the same (one width below it, forced)."""
    inputs = make_inputs((300, 1023), BF16, DEVICE)
    launch.take_launch_configs()
    launch.rmsnorm_forward(inputs.x, inputs.weight, 1e-5)
    assert set(launch.take_launch_configs()) == {"rmsnorm_fwd_kernel"}
    monkeypatch.setattr(forward_launch, "SHIFTED_FORWARD_FROM_BLOCK_N", 1024)
    replays.forget()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    assert "rmsnorm_fwd_shifted_kernel" in launch.take_launch_configs()


def test_strided_rows_in_the_pattern():
    """x a view whose rows are 4103 elements apart (as 4095, 7 modulo 8): the shifted kernels
    on the strided rows, without a copy."""
    wide = make_inputs((29, 4103), BF16, DEVICE).x
    x = wide[:, :4095]
    assert launch.backward_row_period(x, x, None) == 8
    inputs = make_inputs((29, 4095), BF16, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(x, inputs.weight, inputs.dy)
    assert {"rmsnorm_fwd_shifted_kernel", "rmsnorm_bwd_shifted_kernel"} <= set(
        launch.take_launch_configs()
    )


def test_later_calls_replay_it_with_the_same_bits():
    """A signature's later calls repeat the recorded launches (replays._REPLAYS): the shifted
    kernels, with their grid, give the first call's bits."""
    from tests.helpers import grads as _grads

    inputs = make_inputs((37, 4095), BF16, DEVICE)
    first = _grads(inputs.x, inputs.weight, inputs.dy)
    launch.take_launch_configs()
    again = _grads(inputs.x, inputs.weight, inputs.dy)
    assert {"rmsnorm_fwd_shifted_kernel", "rmsnorm_bwd_shifted_kernel"} <= set(
        launch.take_launch_configs()
    )
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


def test_the_forward_takes_it_only_where_every_row_shifts_alike():
    """An fp32 output (4 elements in 16 bytes against x's 8) keeps the plain forward; so does a
    residual off 16 bytes. A residual in the pattern takes it, h and all."""
    inputs = make_inputs((21, 4095), BF16, DEVICE)
    x, w = inputs.x, inputs.weight
    launch.take_launch_configs()
    launch.rmsnorm_forward(x, w, 1e-5, out_dtype=FP32)
    assert set(launch.take_launch_configs()) == {"rmsnorm_fwd_kernel"}
    r = torch.zeros(21 * 4095 + 1, dtype=BF16, device=DEVICE)
    launch.rmsnorm_forward(x, w, 1e-5, residual=r[1:].view(21, 4095))
    assert set(launch.take_launch_configs()) == {"rmsnorm_fwd_kernel"}
    launch.rmsnorm_forward(x, w, 1e-5, residual=r[:-1].view(21, 4095))
    assert set(launch.take_launch_configs()) == {"rmsnorm_fwd_shifted_kernel"}


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=lambda d: DTYPE_NAMES[d])
def test_with_a_residual(dtype):
    """h = x + r formed, rounded and written in the shifted frame, and the gradient arriving on h
    (HAS_DH_OUT) read in it."""
    from tests.helpers import check_residual as _check

    launch.take_launch_configs()
    _check((45, 4093), dtype)
    assert {"rmsnorm_fwd_shifted_kernel", "rmsnorm_bwd_shifted_kernel"} <= set(
        launch.take_launch_configs()
    )


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
    in x and NaNs in dy at row 9's two ends change no other row's dx, nor dw outside those two
    columns."""
    m, n = 23, 4095
    x, w, dy, rstd, period, programs, rows_per_program = _grid_and_inputs(m, n, BF16)
    results = []
    for poisoned in (False, True):
        x_run, dy_run = x.clone(), dy.clone()
        if poisoned:
            x_run[9, 0] = x_run[9, -1] = float("inf")
            dy_run[9, 0] = dy_run[9, -1] = float("nan")
        dx = torch.empty_like(x)
        partial = torch.empty((programs, n), device=DEVICE)
        _run_kernel(x_run, w, dy_run, rstd, dx, partial, programs, rows_per_program, period)
        results.append((dx, partial.sum(dim=0)))
    (dx_clean, dw_clean), (dx_poisoned, dw_poisoned) = results
    others = [row for row in range(m) if row != 9]
    assert torch.equal(dx_poisoned[others], dx_clean[others])
    assert torch.equal(dw_poisoned[1:-1], dw_clean[1:-1])
    assert not torch.isfinite(dw_poisoned[[0, -1]]).any()


def _forward(x, w, y, rstd, period):
    m, n = x.shape
    block_n = launch.block_size(n)
    config = launch._heuristic_config("rmsnorm_fwd_shifted_kernel", block_n)
    grid = (launch._shifted_forward_programs(m, period, config, x.device),)
    meta = {k: v for k, v in config.items() if k != "PROGRAMS_PER_SM"}
    args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-5, 0.0)
    kernels.rmsnorm_fwd_shifted_kernel[grid](
        *args, BLOCK_N=block_n, HAS_RESIDUAL=False,
        **launch._shift_constants(n, x.element_size(), period), **meta,
    )  # fmt: skip


def test_the_forward_writes_inside_the_rows_only():
    m, n = 23, 4095
    x, w, _, _, period, _, _ = _grid_and_inputs(m, n, BF16)
    guard = 8
    buffer = torch.full((guard + m * n + guard,), 7.0, dtype=BF16, device=DEVICE)
    y = buffer[guard : guard + m * n].view(m, n)
    y.fill_(float("nan"))
    rstd = torch.full((m,), float("nan"), device=DEVICE)
    _forward(x, w, y, rstd, period)
    assert not y.isnan().any() and not rstd.isnan().any()
    assert bool((buffer[:guard] == 7.0).all()) and bool((buffer[guard + m * n :] == 7.0).all())


def test_the_forward_keeps_neighbouring_rows_out():
    m, n = 23, 4095
    x, w, _, _, period, _, _ = _grid_and_inputs(m, n, BF16)
    results = []
    for poisoned in (False, True):
        x_run = x.clone()
        if poisoned:
            x_run[9, 0] = x_run[9, -1] = float("inf")
        y, rstd = torch.empty_like(x), torch.empty(m, device=DEVICE)
        _forward(x_run, w, y, rstd, period)
        results.append((y, rstd))
    (y_clean, rstd_clean), (y_poisoned, rstd_poisoned) = results
    others = [row for row in range(m) if row != 9]
    assert torch.equal(y_poisoned[others], y_clean[others])
    assert torch.equal(rstd_poisoned[others], rstd_clean[others])


def test_compiles_for_sm90_with_vector_loads_and_stores():
    """The interpreter runs the kernels' code but not their compilation: CI compiles them for
    sm_90 (no GPU) and checks that x and dy (the forward's x and r) arrive as 16-byte vectors,
    staged through cp.async when the row loop is pipelined, and that dx (y, h) leave as 16-byte
    vectors; the held variants with their inline upcast."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    # without wrapping (whose second load of group 0 is a vector too) the counts are the main
    # loads' alone
    base = {"kernel": "bwd_shifted", "x": "bf16", "dy": "bf16", "hold": False, "extra": False,
            "block_n": 4096, "warps": 8, "stages": 1, "persistent": None, "wrap": False}  # fmt: skip
    cases = [base, {**base, "stages": 3},
             {**base, "x": "fp16", "dy": "fp16", "hold": True, "extra": True, "block_n": 16384,
              "warps": 16, "wrap": True}]  # fmt: skip
    forward = {**base, "kernel": "fwd_shifted", "persistent": True}
    cases += [forward, {**forward, "stages": 3, "extra": True},
              {**forward, "x": "fp16", "hold": True, "block_n": 32768, "warps": 16}]  # fmt: skip
    found = sm90_compile.run(cases)
    for plain, pipelined, held in (found[:3], found[3:]):
        assert plain["vector loads"] > 0 and plain["vector stores"] > 0
        assert pipelined["staged vectors"] > 0 and pipelined["vector stores"] > 0
        assert held["fp16"] and held["vector stores"] > 0
