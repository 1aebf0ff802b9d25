"""The held paths' launches (gluon_kernels.py): the held row and the grouped held row, forward
and backward, each configuration a path of its own; fixed configurations, no tuning."""

from __future__ import annotations

import functools

import torch

from . import backward_launch, common, direct, held_paths
from .backward_launch import _group_count, _single_tile_backward_grid
from .common import cdiv
from .held_paths import (
    HELD_BACKWARD_CHUNK,
    HELD_BACKWARD_WARPS,
    HELD_ROW_CHUNK,
    HELD_ROW_REG,
    HELD_ROW_WARPS,
    HeldGroupBackward,
    HeldGroupForward,
    _held_backward_ring,
    _held_row_shared_chunks,
    _register_cap,
    held_group_exchange,
    held_group_row_chunks,
    held_group_words,
)
from .kernel_launch import _LAUNCHED
from .paths import Path, path

#: Polls of a row's published sums a warp of a grouped kernel makes, all its rows together,
#: before it stops waiting and sums rows alone (the same bits), and of its group's tickets that
#: member 0 makes before it claims rows with the members it has: the last resort where fewer
#: than a group's programs can be resident at all (a kernel on another stream holding the rest
#: of the GPU until ours ends). Programs join groups in start order, so otherwise every wait
#: ends once partners that are already running, or about to start, get there.
HELD_GROUP_SPIN_LIMIT = 1 << 20
#: Rows a claim of the grouped forward takes (gluon_group_exchange.py's docstring): one, so that
#: groups finish within a row of each other whatever number of them is resident.
HELD_GROUP_FORWARD_CHUNK_ROWS = 1
#: How far past the writers' tags the grouped kernels' readers look: 0. The tests set 1, so
#: that no group ever looks complete and every program takes the fallback on every row.
HELD_GROUP_TAG_OFFSET = 0


@path("held_row")
def _forward_held_row(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    """Rows held on chip (forward_holds_row_on_chip says when): one launch, one program per SM
    walking its rows; a fixed configuration (no tuning)."""
    m, n = x.shape
    config = {"REG": HELD_ROW_REG, "SHARED_CHUNKS": _held_row_shared_chunks(n),
              "CHUNK": HELD_ROW_CHUNK, "WARPS": HELD_ROW_WARPS}  # fmt: skip
    meta = {"N": n, **config, "num_warps": HELD_ROW_WARPS}
    grid = (min(m, common._programs_cap(x.device)),)
    args = (x, weight, y, rstd, strides[0], strides[1], m, eps, offset)
    direct.launch(
        held_paths.gluon_kernels.rmsnorm_fwd_held_row_kernel, grid, args, meta, x.get_device()
    )
    _LAUNCHED["rmsnorm_fwd_held_row_kernel"] = {**config, "num_warps": HELD_ROW_WARPS}


def _forward_held_group(
    x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual, *, config
):
    """Rows shared by a group of programs (held_group_forwards says when), in configuration
    `config`: as many groups as fit _held_group_forward_programs_per_sm programs an SM (the
    registers capped so that they can: _register_cap), in an ordinary launch (any number of them may be resident: gluon_group_exchange.py's docstring), each
    group claiming rows one at a time. Allocates one int64 per (row, slice) and per row, and a
    few more (the exchange and the claims: held_group_exchange)."""
    m, n = x.shape
    group = cdiv(n, config.slice_n)
    per_sm = held_paths._held_group_forward_programs_per_sm(x.device.index or 0, config)
    groups = _group_count(m, group, x.device, per_sm)
    rows_per_chunk, chunks = HELD_GROUP_FORWARD_CHUNK_ROWS, cdiv(m, HELD_GROUP_FORWARD_CHUNK_ROWS)
    sums, ctrl = held_group_exchange(m, group, groups, chunks, x.device)
    constexprs = {"GROUP": group, "GROUP_PADDED": held_group_words(group, config.warps),
                  "SLICE": config.slice_n,
                  "RING": config.ring, "WARPS": config.warps}  # fmt: skip
    cap = _register_cap(per_sm, config.warps)
    meta = {"N": n, **constexprs, "SPIN_LIMIT": HELD_GROUP_SPIN_LIMIT,
            "num_warps": config.warps, **cap}  # fmt: skip
    args = (x, weight, y, rstd, sums, ctrl, strides[0], strides[1], m, eps, offset,
            HELD_GROUP_TAG_OFFSET, rows_per_chunk, chunks)  # fmt: skip
    direct.launch(held_paths.gluon_kernels.rmsnorm_fwd_held_group_kernel, (groups * group,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_fwd_held_group_kernel"] = {
        **constexprs, "PROGRAMS_PER_SM": per_sm, "num_warps": config.warps, **cap,
    }  # fmt: skip


@functools.cache
def _held_group_forward_path(config: HeldGroupForward):
    """The grouped forward in one configuration: a path of its own (one object a configuration,
    as the measured paths' key holds the paths)."""
    return Path(_forward_held_group, "held_group", config=config)


def _backward_held_group(
    dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out, dw, *, config: HeldGroupBackward
) -> None:
    """Rows shared by a group of programs (held_group_backwards says when), in configuration
    `config`: as many groups as fit _held_group_backward_programs_per_sm programs an SM (the
    registers capped so that they can), in an ordinary launch, each group claiming chunks of
    rows (held_group_row_chunks) and writing each chunk's dw partial row. Allocates the
    partials (a row a chunk: at most max(groups, SM count) of them)
    and one int64 per (row, slice) and a few more (held_group_exchange): dx's bytes / 2048 for
    16-bit rows in 8192-column slices, / 4096 in 16384-column ones."""
    m, n = x.shape
    group = cdiv(n, config.slice_n)
    per_sm = held_paths._held_group_backward_programs_per_sm(x.device.index or 0, config)
    groups = _group_count(m, group, x.device, per_sm)
    rows_per_chunk, chunks = held_group_row_chunks(m, groups, common._sm_count(x.device.index or 0))
    dw_partial = torch.empty((chunks, n), dtype=torch.float32, device=x.device)
    sums, ctrl = held_group_exchange(m, group, groups, chunks, x.device)
    constexprs = {"GROUP": group, "GROUP_PADDED": held_group_words(group, config.warps),
                  "CHUNK": config.chunk, "CHUNKS": config.chunks, "RING": config.ring,
                  "WARPS": config.warps}  # fmt: skip
    cap = _register_cap(per_sm, config.warps)
    meta = {"N": n, **constexprs, "HAS_DH_OUT": has_dh_out, "SPIN_LIMIT": HELD_GROUP_SPIN_LIMIT,
            "num_warps": config.warps, **cap}  # fmt: skip
    args = (x, weight, dy, rstd, dx, dw_partial, dh_arg, sums, ctrl, x.stride(0), dy.stride(0),
            dx.stride(0), dh_arg.stride(0), m, rows_per_chunk, chunks, offset,
            HELD_GROUP_TAG_OFFSET)  # fmt: skip
    direct.launch(held_paths.gluon_kernels.rmsnorm_bwd_held_group_kernel, (groups * group,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_bwd_held_group_kernel"] = {
        **constexprs, "PROGRAMS_PER_SM": per_sm, "num_warps": config.warps, **cap,
    }  # fmt: skip
    backward_launch._reduce_partials(dw_partial, dw)


@functools.cache
def _held_group_backward_path(config: HeldGroupBackward):
    """The grouped backward in one configuration: a path of its own (one object a
    configuration, as the measured paths' key holds the paths)."""
    return Path(_backward_held_group, "held_group", config=config)


def _backward_held_row(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out, dw, *, warps: int):
    """Rows staged whole on one SM (backward_holds_row_on_chip says when): one program per SM
    walking a contiguous chunk of rows, a fixed configuration but for its warps."""
    m, n = x.shape
    programs, rows_per_program = _single_tile_backward_grid(m, x.device)
    dw_partial = torch.empty((programs, n), dtype=torch.float32, device=x.device)
    config = {"CHUNK": HELD_BACKWARD_CHUNK, "CHUNKS": cdiv(n, HELD_BACKWARD_CHUNK),
              "RING": _held_backward_ring(n, x.device), "WARPS": warps}  # fmt: skip
    meta = {"N": n, **config, "HAS_DH_OUT": has_dh_out, "num_warps": warps}
    args = (x, weight, dy, rstd, dx, dw_partial, dh_arg, x.stride(0), dy.stride(0), dx.stride(0),
            dh_arg.stride(0), m, rows_per_program, offset)  # fmt: skip
    direct.launch(held_paths.gluon_kernels.rmsnorm_bwd_held_row_kernel, (programs,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_bwd_held_row_kernel"] = {**config, "num_warps": warps}
    backward_launch._reduce_partials(dw_partial, dw)


#: The held-row backward at each of its warp counts: paths of their own, offered beside the
#: wide path, as neither warp count wins at every shape (docs/design.md, Backward).
_HELD_ROW_BACKWARDS = tuple(
    Path(_backward_held_row, "held_row", warps=warps) for warps in HELD_BACKWARD_WARPS
)
