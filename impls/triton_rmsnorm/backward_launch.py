"""The backward's paths on Triton kernels (kernels.py): single tile (plain and shifted rows),
two-role, wide (two steps); their grids and arguments, and the dw partials' reduction. The held
backwards are in held_launch.py."""

from __future__ import annotations

import torch

from . import common, kernel_launch, kernels
from .common import (
    SPLIT_BLOCK_N,
    WIDE_BLOCK_N,
    _previous_power_of_2,
    _row_period,
    _shift_constants,
    block_size,
    cdiv,
    next_power_of_2,
    rows_are_split,
    two_level_switches,
)
from .kernel_launch import _launch_fixed
from .paths import path

#: Widest row the single-tile backward takes. Above it, its per-program fp32 dw accumulator plus
#: x, dy and g per row spill (docs/design.md, Backward).
BACKWARD_SINGLE_TILE_MAX_N = 16384
#: From this tile width on, the single-tile backward holds 16-bit x and dy as loaded between its
#: two passes (rmsnorm_bwd_kernel's HOLD_STORAGE_FORM): at 16384 it spills without that;
#: narrower tiles gain nothing and keep the plain kernel. N = 8193-16383 share its tile width
#: and take it too (docs/design.md, Backward).
BACKWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N = 16384
#: The dw reduction's tile: every partial row at once (up to DW_REDUCE_MAX_ROWS, padded to a
#: power of two; there are at most SM-count of them) x DW_REDUCE_BLOCK_N columns, one program per
#: column block. It reads the partials while they sit in L2, each program in one step rather
#: than in a loop of dependent 64-row steps: the reduction is a chain of L2 round trips.
DW_REDUCE_MAX_ROWS = 256
DW_REDUCE_BLOCK_N = 32
DW_REDUCE_WARPS = 8
#: Over DW_REDUCE_FEW_ROWS partial rows or fewer (the grouped backwards' 2-16 groups) that tile
#: leaves a program 64-512 elements, far too little work. There the tile is
#: DW_REDUCE_FEW_ROWS_TILE elements, at most DW_REDUCE_MAX_BLOCK_N columns and no more than leave
#: every SM a program, 8 warps from DW_REDUCE_WIDE_BLOCK_N columns and 4 below (the sweep's
#: picks: docs/design.md, Backward).
DW_REDUCE_FEW_ROWS = 16
DW_REDUCE_FEW_ROWS_TILE = 8192
DW_REDUCE_MAX_BLOCK_N = 1024
DW_REDUCE_WIDE_BLOCK_N = 512
DW_REDUCE_FEW_ROWS_WIDE_WARPS = 8
DW_REDUCE_FEW_ROWS_NARROW_WARPS = 4
#: The two-role backward (kernels.rmsnorm_bwd_two_role_kernel: dx from row programs, dw from
#: column programs beside them, one launch and no partials) is offered beside the single tile,
#: (the dispatch picks between them), for rows of TWO_ROLE_MIN_N to TWO_ROLE_MAX_N
#: columns that the plain single tile takes, up to TWO_ROLE_MAX_ELEMENTS elements in all, and x
#: and dy that take at most half the L2 (the column programs' second read of them should hit).
#: Past that size each column program's walk over every row is the critical path; narrower rows
#: leave few column programs, each walking more rows (not offered; docs/design.md, Backward).
TWO_ROLE_MIN_N = 2048
TWO_ROLE_MAX_N = 16384
TWO_ROLE_MAX_ELEMENTS = 1 << 22
#: Its column programs' tile, per single-tile width (BLOCK_N): (COL_BLOCK columns, COL_ROWS rows
#: a step, COL_STAGES): a sweep's best at 2048, 4096 and 8192 columns, about one column
#: program an SM there (docs/design.md, Backward); 16384's keeps that count and 8192's tile
#: size (written before it was timed: the dispatch table decides whether it serves a call).
TWO_ROLE_COLUMN_TILES = {2048: (16, 128, 3), 4096: (32, 128, 4), 8192: (64, 64, 3),
                         16384: (128, 32, 3)}  # fmt: skip


def backward_is_looped(n: int) -> bool:
    return n > BACKWARD_SINGLE_TILE_MAX_N


def _reduce_partials(dw_partial: torch.Tensor, dw: torch.Tensor) -> None:
    """dw = the [programs, N] fp32 partials summed over programs, in a fixed order."""
    rows, n = dw_partial.shape
    block_rows, block_n, warps = dw_reduce_tile(rows, n, dw_partial.device)
    _launch_fixed(
        kernels.rmsnorm_dw_reduce_kernel, (cdiv(n, block_n),), dw_partial, dw, rows, n,
        BLOCK_ROWS=block_rows, BLOCK_N=block_n, num_warps=warps,
    )  # fmt: skip


def dw_reduce_tile(rows: int, n: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_N, num_warps) of the dw reduction over [rows, n] partials: every row
    at once (padded to a power of two, DW_REDUCE_MAX_ROWS at most) by DW_REDUCE_BLOCK_N columns,
    or, over DW_REDUCE_FEW_ROWS rows or fewer, by as many columns as make a
    DW_REDUCE_FEW_ROWS_TILE-element tile within the limits of the constants' comment."""
    block_rows = min(next_power_of_2(rows), DW_REDUCE_MAX_ROWS)
    if rows > DW_REDUCE_FEW_ROWS:
        return block_rows, DW_REDUCE_BLOCK_N, DW_REDUCE_WARPS
    per_sm = max(DW_REDUCE_BLOCK_N, _previous_power_of_2(n // common._programs_cap(device)))
    block_n = min(DW_REDUCE_FEW_ROWS_TILE // block_rows, DW_REDUCE_MAX_BLOCK_N, per_sm)
    if block_n >= DW_REDUCE_WIDE_BLOCK_N:
        return block_rows, block_n, DW_REDUCE_FEW_ROWS_WIDE_WARPS
    return block_rows, block_n, DW_REDUCE_FEW_ROWS_NARROW_WARPS


@path("single_tile")
def _backward_single_tile(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw):
    """x [M, N], or [outer, heads, N] read in two levels (common.two_level_switches: the plain
    kernel, backward_row_period being 1 there)."""
    m, n = dx.shape
    block_n = block_size(n)
    period = backward_row_period(x, dy, dh_arg if has_dh_out else None)
    programs, rows_per_program = _single_tile_backward_grid(m, x.device, period)
    dw_partial = torch.empty((programs, n), dtype=torch.float32, device=x.device)
    args = _single_tile_backward_args(
        dy, x, weight, rstd, offset, dx, dh_arg, dw_partial, rows_per_program
    )
    switches = {
        "BLOCK_N": block_n,
        "HAS_DH_OUT": has_dh_out,
        "HOLD_STORAGE_FORM": backward_holds_storage_form(block_n, x.dtype, dy.dtype),
    }
    if period > 1:
        switches.update(_shift_constants(n, x.element_size(), period))
    else:
        switches.update(two_level_switches(x))
    kernel_launch._launch(
        "rmsnorm_bwd_shifted_kernel" if period > 1 else "rmsnorm_bwd_kernel", (programs,), *args,
        dtypes=(x.dtype, weight.dtype, dy.dtype, dh_arg.dtype), **switches,
    )  # fmt: skip
    _reduce_partials(dw_partial, dw)


def backward_takes_two_roles(
    x: torch.Tensor, dy: torch.Tensor, dh_out: torch.Tensor | None
) -> bool:
    """Whether the two-role backward is offered for x (beside the single tile; see
    TWO_ROLE_MAX_N): rows the plain single tile takes, TWO_ROLE_MIN_N to TWO_ROLE_MAX_N columns,
    at most TWO_ROLE_MAX_ELEMENTS elements, x and dy within half of a GPU's L2."""
    m, n = x.shape
    if not TWO_ROLE_MIN_N <= n <= TWO_ROLE_MAX_N or m * n > TWO_ROLE_MAX_ELEMENTS:
        return False
    if backward_row_period(x, dy, dh_out) != 1:
        return False
    return _two_role_fits_device(x.device, m * n * (x.element_size() + dy.element_size()))


def _two_role_fits_device(device: torch.device, x_and_dy_bytes: int) -> bool:
    """A GPU whose L2 holds x and dy twice over (the interpreter's CPU has no L2 to hit)."""
    l2 = common._l2_bytes(device)
    return l2 > 0 and 2 * x_and_dy_bytes <= l2


def two_role_column_tile(block_n: int) -> tuple[int, int, int]:
    """(COL_BLOCK, COL_ROWS, COL_STAGES) of the two-role backward's column programs (rows
    narrower than the table's, which only a test forces onto this path, take its narrowest)."""
    return TWO_ROLE_COLUMN_TILES[max(block_n, min(TWO_ROLE_COLUMN_TILES))]


@path("two_role")
def _backward_two_role(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw):
    """dx and dw in one launch (kernels.rmsnorm_bwd_two_role_kernel): the single tile's row
    programs without their dw partials, and a column program per COL_BLOCK columns."""
    m, n = x.shape
    block_n = block_size(n)
    programs, rows_per_program = _single_tile_backward_grid(m, x.device)
    col_block, col_rows, col_stages = two_role_column_tile(block_n)
    args = _two_role_backward_args(
        dy, x, weight, rstd, offset, dx, dh_arg, dw, programs, rows_per_program
    )
    kernel_launch._launch(
        "rmsnorm_bwd_two_role_kernel", (programs + cdiv(n, col_block),), *args,
        dtypes=(x.dtype, weight.dtype, dy.dtype, dh_arg.dtype), BLOCK_N=block_n,
        HAS_DH_OUT=has_dh_out, COL_BLOCK=col_block, COL_ROWS=col_rows, COL_STAGES=col_stages,
    )  # fmt: skip


def _two_role_backward_args(
    dy, x, weight, rstd, offset, dx, dh_arg, dw, programs, rows_per_program
) -> tuple:
    """rmsnorm_bwd_two_role_kernel's arguments before its constexprs (launch and replay): the
    single tile's, dw in place of its partials, then the number of row programs."""
    single_tile = _single_tile_backward_args(
        dy, x, weight, rstd, offset, dx, dh_arg, dw, rows_per_program
    )
    return (*single_tile, programs)


def backward_row_period(x: torch.Tensor, dy: torch.Tensor, dh_out: torch.Tensor | None) -> int:
    """_row_period of the single-tile backward's rows: x, dy, dh_out (and dx, contiguous); 1
    for x [outer, heads, N], whose rows the plain kernel reads in two levels."""
    if x.dim() == 3:
        return 1
    return _row_period(x.shape[0], x.shape[1], (x, dy) if dh_out is None else (x, dy, dh_out))


def backward_holds_storage_form(block_n: int, x_dtype: torch.dtype, dy_dtype: torch.dtype) -> bool:
    """Whether the single-tile backward holds x and dy as loaded between its passes: wide tiles
    with x or dy in a 16-bit dtype (fp32 ones gain nothing: the same code, a second binary), on
    an NVIDIA GPU (the second pass upcasts through inline PTX, which neither the interpreter nor
    ROCm runs)."""
    return (
        block_n >= BACKWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N
        and (x_dtype.itemsize == 2 or dy_dtype.itemsize == 2)
        and common._inline_ptx_runs()
    )


def _single_tile_backward_grid(m: int, device: torch.device, period: int = 1) -> tuple[int, int]:
    """(programs, rows per program): contiguous chunks of rows, no program without rows. With
    period > 1 (rmsnorm_bwd_shifted_kernel) the chunks are of each residue class of rows modulo
    period, period programs of each chunk index; a class with fewer rows may leave a program
    without rows (it writes zero partials)."""
    class_rows = cdiv(m, period)
    per_class = max(1, min(class_rows, common._programs_cap(device) // period))
    rows_per_program = cdiv(class_rows, per_class)
    return period * cdiv(class_rows, rows_per_program), rows_per_program


def _single_tile_backward_args(
    dy, x, weight, rstd, offset, dx, dh_arg, dw_partial, rows_per_program
) -> tuple:
    """rmsnorm_bwd_kernel's arguments before its constexprs (launch and replay share them); x's
    row stride is its head stride when x is [outer, heads, N]."""
    m, n = dx.shape
    return (
        x, weight, dy, rstd, dx, dw_partial, dh_arg,
        x.stride(-2), dy.stride(0), dx.stride(0), dh_arg.stride(0), m, n, rows_per_program,
        offset, m.bit_length(),
    )  # fmt: skip


@path("wide")
def _backward_wide(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw) -> None:
    """Two steps: each row's mean(g * x_hat) (split across programs when rows are fewer
    than SMs), then column blocks x row groups for dx and the dw partials."""
    m, n = x.shape
    mean_gx = torch.empty((m,), dtype=torch.float32, device=x.device)
    if rows_are_split(m, x.device):
        splits = cdiv(n, SPLIT_BLOCK_N)
        partial = torch.empty((m, splits), dtype=torch.float32, device=x.device)
        kernel_launch._launch(
            "rmsnorm_bwd_split_dot_kernel", (splits, m),
            x, weight, dy, partial, x.stride(0), dy.stride(0), n, splits, offset,
            dtypes=(x.dtype, weight.dtype, dy.dtype), BLOCK_N=SPLIT_BLOCK_N,
        )  # fmt: skip
        _launch_fixed(
            kernels.rmsnorm_bwd_split_finish_kernel, (m,), partial, rstd, mean_gx, n, splits,
            BLOCK_S=next_power_of_2(splits), num_warps=1,
        )  # fmt: skip
    else:
        kernel_launch._launch(
            "rmsnorm_bwd_row_dot_kernel", (m,),
            x, weight, dy, rstd, mean_gx, x.stride(0), dy.stride(0), n, offset,
            dtypes=(x.dtype, weight.dtype, dy.dtype), BLOCK_N=WIDE_BLOCK_N,
        )  # fmt: skip
    col_blocks = cdiv(n, WIDE_BLOCK_N)
    row_groups, rows_per_group = _row_groups(m, col_blocks, x.device)
    dw_partial = torch.empty((row_groups, n), dtype=torch.float32, device=x.device)
    kernel_launch._launch(
        "rmsnorm_bwd_columns_kernel", (col_blocks, row_groups),
        x, weight, dy, rstd, mean_gx, dx, dw_partial, dh_arg,
        x.stride(0), dy.stride(0), dx.stride(0), dh_arg.stride(0), m, n, rows_per_group, offset,
        dtypes=(x.dtype, weight.dtype, dy.dtype, dh_arg.dtype), BLOCK_N=WIDE_BLOCK_N,
        HAS_DH_OUT=has_dh_out,
    )  # fmt: skip
    _reduce_partials(dw_partial, dw)


def _group_count(
    m: int, programs_per_group: int, device: torch.device, programs_per_sm: int = 1
) -> int:
    """As many groups of programs_per_group programs as fit programs_per_sm programs an SM, at
    least one and at most m (every group has a row)."""
    return max(1, min(m, programs_per_sm * common._programs_cap(device) // programs_per_group))


def _row_groups(
    m: int, programs_per_group: int, device: torch.device, programs_per_sm: int = 1
) -> tuple[int, int]:
    """(groups, rows per group): contiguous chunks of the m rows, one a group (_group_count
    groups at most), none without rows."""
    rows_per_group = cdiv(m, _group_count(m, programs_per_group, device, programs_per_sm))
    return cdiv(m, rows_per_group), rows_per_group
