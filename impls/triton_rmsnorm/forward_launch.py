"""The forward's paths on Triton kernels (kernels.py): single tile (plain and shifted rows),
looped, split; their grids and arguments. The held forwards are in held_launch.py."""

from __future__ import annotations

import torch

from . import common, kernel_launch, overrides
from .common import (
    SPLIT_BLOCK_N,
    WIDE_BLOCK_N,
    _row_period,
    _shift_constants,
    block_size,
    cdiv,
    next_power_of_2,
    two_level_switches,
)
from .configs import _tile_programs, one_row_tiles
from .paths import path

#: Widest row the single-tile forward takes: one row lives in registers.
SINGLE_TILE_MAX_N = 65536
#: From this tile width on, the single-tile forward holds 16-bit x as loaded between its
#: reduction and its scaling (rmsnorm_fwd_kernel's HOLD_STORAGE_FORM). At 65536 columns that
#: ends its spills (ptxas, sm_90); narrower, it gains nothing (docs/design.md, Forward).
FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N = 32768
#: From this tile width on, the single-tile forward takes rows that do not start on 16 bytes
#: (odd N) in rmsnorm_fwd_shifted_kernel, faster from here; narrower odd rows, several a tile,
#: were not measured and keep the plain kernel (docs/design.md, Forward).
SHIFTED_FORWARD_FROM_BLOCK_N = 4096


def forward_is_looped(n: int) -> bool:
    return n > SINGLE_TILE_MAX_N


@path("single_tile")
def _forward_single_tile(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    """x [M, N], or [outer, heads, N] read in two levels (common.two_level_switches; the plain
    kernel only: such rows are not grouped by their 16-byte residue). rstd None: a forward that
    no backward follows, which writes no rstd (the kernels' STORE_RSTD; y stands in for it)."""
    m, n = y.shape
    args = _single_tile_forward_args(
        x, weight, y, y if rstd is None else rstd, r_arg, h_arg, strides, eps, offset
    )
    switches = _single_tile_forward_switches(x, y, rstd, has_residual)
    dtypes = (x.dtype, weight.dtype, y.dtype)
    period = _single_tile_row_period(x, y, r_arg, h_arg)
    if period > 1:
        kernel_launch._launch(
            "rmsnorm_fwd_shifted_kernel",
            lambda meta: (_shifted_forward_programs(m, period, meta, x.device),),
            *args, dtypes=dtypes, **switches, **_shift_constants(n, x.element_size(), period),
        )  # fmt: skip
        return
    kernel_launch._launch(
        "rmsnorm_fwd_kernel", lambda meta: (_tile_programs(m, meta, x.device),), *args,
        dtypes=dtypes, **switches, **plain_forward_switches(x, strides),
        adjust=_one_row_tiles(m, n, (x, y, r_arg, h_arg), x.device),
    )  # fmt: skip


def _single_tile_forward_switches(x, y, rstd, has_residual: bool) -> dict:
    """The launch switches both single-tile forwards (plain and shifted) take for these tensors
    (rstd None: no rstd written)."""
    block_n = block_size(y.shape[1])
    return {
        "BLOCK_N": block_n,
        "HAS_RESIDUAL": has_residual,
        "HOLD_STORAGE_FORM": forward_holds_storage_form(block_n, x.dtype),
        **({} if rstd is not None else {"STORE_RSTD": False}),
    }


def plain_forward_switches(x, strides: tuple) -> dict:
    """The plain single-tile forward's own launch switches beside those: constant strides where
    every row stride is N, rows in two levels, programmatic dependent launch."""
    n = x.shape[-1]
    return {"ROWS_CONTIGUOUS": all(stride == n for stride in strides), **two_level_switches(x),
            **common.pdl_switches(x.device)}  # fmt: skip


def plain_forward_launch_switches(x, y, rstd, has_residual: bool, strides: tuple) -> dict:
    """Every launch switch of the plain single-tile forward for these tensors, as its path
    launches it (the offline tuner compiles its candidates with them)."""
    return {**_single_tile_forward_switches(x, y, rstd, has_residual),
            **plain_forward_switches(x, strides)}  # fmt: skip


def _single_tile_row_period(x, y, r_arg, h_arg) -> int:
    """1 where the plain single-tile kernel serves the rows (rmsnorm_fwd_kernel), else the
    16-byte residue period of rows that rmsnorm_fwd_shifted_kernel serves (wide rows not all
    on 16 bytes)."""
    m, n = y.shape
    period = 1 if x.dim() == 3 else _row_period(m, n, (x, y, r_arg, h_arg))
    return period if period > 1 and block_size(n) >= SHIFTED_FORWARD_FROM_BLOCK_N else 1


def single_tile_kernel(x, y, residual=None) -> str:
    """The kernel the single-tile forward launches for these tensors (h is laid out as y)."""
    r_arg, h_arg = (x, x) if residual is None else (residual, y)
    period = _single_tile_row_period(x, y, r_arg, h_arg)
    return "rmsnorm_fwd_kernel" if period == 1 else "rmsnorm_fwd_shifted_kernel"


def _one_row_tiles(m: int, n: int, tensors: tuple, device: torch.device):
    """The plain single-tile forward's configuration adjusted to m rows (configs.one_row_tiles),
    or None where configurations are forced (dispatch.override: they run as given)."""
    if overrides.forced_configs("fwd") is not None:
        return None
    element_size = min(t.element_size() for t in tensors if t is not None)
    sms = common._programs_cap(device)
    return lambda config: one_row_tiles(config, m, block_size(n), element_size, sms)


def _shifted_forward_programs(m: int, period: int, meta: dict, device: torch.device) -> int:
    """The shifted forward's grid: period programs for each of up to PROGRAMS_PER_SM x SMs /
    period chunks of a residue class's tiles (never more than its tiles)."""
    tiles = cdiv(cdiv(m, period), meta["BLOCK_M"])
    per_class = max(1, meta["PROGRAMS_PER_SM"] * common._programs_cap(device) // period)
    return period * min(tiles, per_class)


def forward_holds_storage_form(block_n: int, x_dtype: torch.dtype) -> bool:
    """Whether the single-tile forward holds x (or h) as loaded between its reduction and its
    scaling: wide tiles of 16-bit rows, where inline PTX runs (common._inline_ptx_runs)."""
    return (
        block_n >= FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N
        and x_dtype.itemsize == 2
        and common._inline_ptx_runs()
    )


def _single_tile_forward_args(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset) -> tuple:
    """rmsnorm_fwd_kernel's leading arguments, up to ROWS_BUCKET (launch and replay share
    them); N among them is a constexpr, passed by position like the rest. y is [M, N] (x may be
    [outer, heads, N])."""
    m, n = y.shape
    return (x, weight, y, rstd, r_arg, h_arg, *strides, m, n, eps, offset, m.bit_length())


@path("looped")
def _forward_looped(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    m, n = x.shape
    programs_cap = common._programs_cap(x.device)
    kernel_launch._launch(
        "rmsnorm_fwd_looped_kernel", lambda meta: (min(m, meta["PROGRAMS_PER_SM"] * programs_cap),),
        x, weight, y, rstd, r_arg, h_arg, *strides, m, n, eps, offset, m.bit_length(),
        dtypes=(x.dtype, weight.dtype, y.dtype), BLOCK_N=WIDE_BLOCK_N, HAS_RESIDUAL=has_residual,
    )  # fmt: skip


@path("split")
def _forward_split(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    """Few wide rows: per-chunk sums of squares, then the scaling, one program per (row, chunk).
    Allocates one fp32 per (row, chunk)."""
    m, n = x.shape
    splits = cdiv(n, SPLIT_BLOCK_N)
    partial = torch.empty((m, splits), dtype=torch.float32, device=x.device)
    stride_x, stride_y, stride_r, stride_h = strides
    kernel_launch._launch(
        "rmsnorm_fwd_split_sumsq_kernel", (splits, m), x, r_arg, h_arg, partial,
        stride_x, stride_r, stride_h, n, splits, dtypes=(x.dtype,),
        BLOCK_N=SPLIT_BLOCK_N, HAS_RESIDUAL=has_residual,
    )  # fmt: skip
    normalized, stride_n = (h_arg, stride_h) if has_residual else (x, stride_x)
    kernel_launch._launch(
        "rmsnorm_fwd_split_scale_kernel", (splits, m), normalized, weight, y, rstd, partial,
        stride_n, stride_y, n, splits, eps, offset, dtypes=(x.dtype, weight.dtype, y.dtype),
        BLOCK_N=SPLIT_BLOCK_N, BLOCK_S=next_power_of_2(splits),
    )  # fmt: skip
