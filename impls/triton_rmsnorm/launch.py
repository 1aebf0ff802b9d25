"""The launcher: which paths can serve a call (forward_paths, backward_paths, the default
first), the dispatch between them (_dispatch: the table's entry, an override or the default), and
the launch of each. The kernels are in kernels.py (single tile, looped, split), shifted_kernels.py
(rows that do not start on 16 bytes), wide_kernels.py, fp8_kernels.py and the Gluon modules
(gluon_*.py: rows held on chip); the paths as objects (paths.Path) in forward_launch.py,
backward_launch.py, held_launch.py; their launch configurations in configs.py.

The paths, by the names the dispatch table, dispatch.override and explain use (which rows each
serves, its thresholds and the measurements behind them: docs/design.md, "Forward" and
"Backward: which path serves which rows"):
- forward: single_tile (whole rows in one [BLOCK_M, BLOCK_N] tile, x read once), looped (rows
  walked in chunks of LOOPED_FORWARD_CHUNKS, x read twice, the second time mostly from L2),
  split (wide rows fewer than SMs: one program a (row, chunk), two launches), held_row and
  held_group (16-bit rows held on chip by one SM or by a group of programs that exchange their
  slices' sums through global memory; an ordinary launch: programs join groups in start order);
- backward: single_tile (a private dw accumulator a program, its partial rows summed by a
  second kernel), two_role (2048-16384 columns: row programs and column programs in one
  launch), wide (two steps: a per-row dot product, then column blocks x row groups; the split
  dot when M < SMs), held_row and held_group as above.
Where several of these paths can serve a call (forward rows of FORWARD_LOOPED_FROM_N < N <=
SINGLE_TILE_MAX_N take the single tile or the looped path, say), the dispatch table picks
one, with each tuned kernel's configuration (dispatch.py, _dispatch below); with no entry the
default (the first offered) runs in its heuristic configuration, so the held rows never do.
Nothing is timed at a default call. Runtime tuning (opt-in: dispatch.tuning(),
RMSNORM_TRITON_TUNE=1, and the offline tuner, tune.py) measures the offered paths and tunes the
kernels per N over num_warps x num_stages with BLOCK_N pinned (the single-tile forward also over
its grid: one program per tile, or a persistent grid with a software-pipelined tile loop), each
candidate timed by device-only time (tuning.py), as the harness ranks backends.
Under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors) nothing can be timed: a fixed
configuration is used, and the kernel code is the same; dispatch.override still picks a path.
"""

from __future__ import annotations

import warnings

import torch

# Besides what this module calls, the names that fp8.py, the harness, tests and experiments read as
# launch.X are imported here (noqa: F401) and re-exported. Each lives, and is patched, where it is
# defined: patching launch.X changes only what this module itself calls.
from . import direct, dispatch, kernels, replays, tuning  # noqa: F401 (launch.direct, .tuning)
from .backward_launch import (  # noqa: F401
    BACKWARD_SINGLE_TILE_MAX_N,
    DW_REDUCE_BLOCK_N,
    DW_REDUCE_FEW_ROWS,
    DW_REDUCE_FEW_ROWS_TILE,
    DW_REDUCE_MAX_BLOCK_N,
    DW_REDUCE_MAX_ROWS,
    DW_REDUCE_WARPS,
    TWO_ROLE_MAX_N,
    TWO_ROLE_MIN_N,
    _backward_single_tile,
    _backward_two_role,
    _backward_wide,
    _group_count,
    _reduce_partials,
    _row_groups,
    _single_tile_backward_args,
    _single_tile_backward_grid,
    _two_role_backward_args,
    _two_role_fits_device,
    backward_holds_storage_form,
    backward_is_looped,
    backward_row_period,
    backward_takes_two_roles,
    dw_reduce_tile,
    two_role_column_tile,
)
from .common import (  # noqa: F401
    MAX_N,
    SPLIT_BLOCK_N,
    WIDE_BLOCK_N,
    _check_runnable,
    _hopper_class,
    _on_device,
    _programs_cap,
    _row_period,
    _shift_constants,
    _sm_count,
    block_size,
    cdiv,
    check_hidden_size,
    interpreting,
    next_power_of_2,
    rows_and_width,
    rows_are_split,
    two_level_switches,
)
from .configs import (  # noqa: F401
    FORWARD_GRID_CHOICES,
    KERNELS,
    LOOPED_FORWARD_CHUNKS,
    MAX_TILE,
    NUM_STAGES_CHOICES,
    PIPELINE_SHARED_BYTES,
    TRITON_DEFAULT_STAGES,
    _candidates,
    _configs,
    _heuristic_config,
    _kernel_grid_and_meta,
    _prune_tiles,
    _tile_programs,
    heuristic_num_warps,
    rows_per_tile,
    tile_loop_staging,
)
from .forward_launch import (  # noqa: F401
    FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N,
    SHIFTED_FORWARD_FROM_BLOCK_N,
    SINGLE_TILE_MAX_N,
    _forward_looped,
    _forward_single_tile,
    _forward_split,
    _shifted_forward_programs,
    _single_tile_forward_args,
    forward_holds_storage_form,
    forward_is_looped,
)
from .held_launch import (  # noqa: F401
    _HELD_ROW_BACKWARDS,
    HELD_GROUP_SPIN_LIMIT,
    HELD_GROUP_TAG_OFFSET,
    _backward_held_group,
    _backward_held_row,
    _forward_held_group,
    _forward_held_row,
    _held_group_backward_path,
    _held_group_forward_path,
)
from .held_paths import (  # noqa: F401
    HELD_BACKWARD_CHUNK,
    HELD_BACKWARD_MAX_N,
    HELD_GROUP_BACKWARDS,
    HELD_GROUP_CHUNKS_PER_GROUP,
    HELD_GROUP_FORWARDS,
    HELD_ROW_CHUNK,
    HELD_ROW_MAX_N,
    HELD_ROW_REG,
    HELD_ROW_SCRATCH_BYTES,
    HELD_ROW_WARPS,
    REGISTERS_PER_SM,
    _held_backward_ring,
    _held_group_backward_programs_per_sm,
    _held_group_fits_device,
    _held_group_forward_fits_device,
    _held_group_forward_programs_per_sm,
    _held_group_forward_shared_bytes,
    _held_row_backward_fits_device,
    _held_row_fits_device,
    _held_row_shared_chunks,
    _register_cap,
    backward_holds_row_in_group,
    backward_holds_row_on_chip,
    forward_holds_row_on_chip,
    gluon_kernels,
    held_backward_ring_slots,
    held_group_backwards,
    held_group_forwards,
    held_group_row_chunks,
    held_group_words,
)
from .kernel_launch import (  # noqa: F401
    _LAUNCHED,
    _compile_in_parallel,
    _launch,
    _launch_fixed,
    autotuning,
    take_launch_configs,
)
from .replays import (
    _REPLAYABLE,
    _backward_replay_key,
    _forward_replay_key,
    _is_current,
    _record,
)


def rmsnorm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
    residual: torch.Tensor | None = None,
    keep_rstd: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(y, rstd, h) for a 2-D x [M, N] whose last dimension is contiguous (rows may be strided),
    or a 3-D x [outer, heads > 1, N] of such rows whose M = outer * heads rows no one stride
    describes (a [tokens, heads, head_dim] view of a packed QKV projection: check_two_level),
    read in place.

    y is in out_dtype (default x's), rstd one fp32 per row; both [M, N] and [M] whatever x's
    layout. With a residual r [M, N], h = x + r (x's dtype) is written too and y normalizes h;
    else h is None. keep_rstd False (a forward no backward follows): rstd may be None, and is
    where the single tile serves the call (it then writes none: one allocation fewer).
    """
    eps, offset = float(eps), float(offset)  # as every launch specializes them (fp32)
    replay_key = None
    tag = dispatch.replay_tag() if residual is None and _REPLAYABLE else None
    if tag is not None:
        replay_key = _forward_replay_key(x, weight, out_dtype, keep_rstd)
        if tag:  # a kernel test's override: its own replays (the device stays last)
            replay_key = (tag, *replay_key)
        replayed = replays._REPLAYS.get(replay_key)
        if replayed is not None and _is_current(replay_key[-1]):
            return _replay_forward(replayed, x, weight, eps, offset, out_dtype, keep_rstd)
    _check_runnable(x)
    if x.dim() != 2:
        check_two_level(x, residual)
    m, n = rows_and_width(x)
    check_hidden_size(n)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    h = None if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    has_residual = residual is not None
    if m == 0:
        return y, torch.empty((0,), dtype=torch.float32, device=x.device), h
    r_arg, h_arg = (x, x) if residual is None else (residual, h)
    strides = (x.stride(-2), y.stride(0), r_arg.stride(-2), h_arg.stride(-2))  # x's: per head
    dtypes = (x.dtype, weight.dtype, y.dtype)
    with _on_device(x):
        paths = forward_paths(x, y, weight, has_residual)
        rstd = None
        if keep_rstd or paths != [_forward_single_tile]:
            rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
        args = (x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual)
        call = ("fwd", dtypes, has_residual, n, m, paths, x.device)
        if paths == [_forward_single_tile] and replay_key is not None:
            two_level = True if x.dim() == 3 else None  # (the replay's extra)
            _record(replay_key, lambda *a: _dispatch(*call, a), args, (1,), two_level)
        else:
            _dispatch(*call, args)
    return y, rstd, h


def forward_paths(x, y, weight, has_residual: bool) -> list:
    """Every forward path that can serve this call, the default first (dispatch picks one).
    Rows in two levels (x [outer, heads, N]) only the single tile reads (kernels.py's HEADS), so
    neither a table entry nor an override can send them to another path."""
    if x.dim() == 3:
        return [_forward_single_tile]
    beyond = dispatch.forced_beyond_offers("fwd")
    if beyond is not None:  # a kernel test's override(offered_only=False)
        return [dispatch.path_named(every_forward_path(), beyond, "forward")]
    m, n = x.shape
    paths = _forward_paths(m, n, x.device)
    if forward_holds_row_on_chip(x, y, has_residual):
        paths = [*paths, _forward_held_row]
    groups = held_group_forwards(x, y, weight, has_residual)
    return [*paths, *map(_held_group_forward_path, groups)]


def every_forward_path() -> list:
    """Every forward path, each configuration of a family its own (what an
    override(offered_only=False) names)."""
    return [_forward_single_tile, _forward_looped, _forward_split, _forward_held_row,
            *map(_held_group_forward_path, HELD_GROUP_FORWARDS)]  # fmt: skip


def every_backward_path() -> list:
    """Every backward path, as every_forward_path."""
    return [_backward_single_tile, _backward_two_role, _backward_wide, *_HELD_ROW_BACKWARDS,
            *map(_held_group_backward_path, HELD_GROUP_BACKWARDS)]  # fmt: skip


def _forward_paths(m: int, n: int, device: torch.device) -> list:
    """The forward paths that can serve [m, n], the default first; with several, the dispatch
    (dispatch.py) picks one."""
    if n <= FORWARD_LOOPED_FROM_N:
        return [_forward_single_tile]
    if not forward_is_looped(n):
        return [_forward_single_tile, _forward_looped]
    if rows_are_split(m, device):  # looped too: a table may keep one path at every M (bits)
        return [_forward_split, _forward_looped]
    return [_forward_looped]


#: Rows wider than this and up to SINGLE_TILE_MAX_N can take either forward path: the single
#: tile (x read once, but 32K-64K fp32 values a program strain registers) or the persistent
#: looped kernel (x read twice, the second time mostly from L2). Which is faster depends on N, M
#: and dtype: the dispatch table holds the pick of each (N, M size class, dtypes).
FORWARD_LOOPED_FROM_N = 16384
#: The widest rows read in two levels (x [outer, heads, N]: kernels.py's HEADS): where the
#: single tile is the only forward path and the backward's single tile serves. Wider heads are
#: copied to [M, N] rows (function.py).
TWO_LEVEL_MAX_N = min(FORWARD_LOOPED_FROM_N, BACKWARD_SINGLE_TILE_MAX_N)


def check_two_level(x: torch.Tensor, residual: torch.Tensor | None) -> None:
    """Raise unless x [outer, heads, N] is rows the single-tile kernels read in two levels:
    heads > 1 (else x[:, 0] is [M, N] rows), unit-stride rows of at most TWO_LEVEL_MAX_N
    columns, and no residual (h and the residual are [M, N])."""
    if x.dim() != 3 or x.shape[1] < 2 or x.stride(2) != 1 or x.shape[2] > TWO_LEVEL_MAX_N:
        raise ValueError(
            "x: expected [M, N] rows, or [outer, heads > 1, N] with N <= "
            f"{TWO_LEVEL_MAX_N} and a contiguous last dimension; got shape {tuple(x.shape)}, "
            f"strides {x.stride()}"
        )
    if residual is not None:
        raise ValueError("x: [outer, heads, N] rows take no residual; pass [M, N] rows")


#: Each path is timed this many times, every other pass in reverse order, its best time kept: a
#: path chosen once is kept for the process, and with one pass a passing disturbance could
#: decide it (docs/design.md, Dispatch).
PATH_MEASURE_PASSES = 2


def _fastest(paths: list, args: tuple):
    """The path with the least device time on these arguments (tuning.py), each already tuned
    (its first call tunes its kernels). Paths write the same outputs from the same inputs. The
    default path (the first) must run; another that fails at its first call (a kernel that does
    not compile on this GPU, say; any exception, so a bug in it too) is left out with a warning,
    and the default keeps the call."""
    paths[0](*args)
    runnable = [paths[0]]
    for path in paths[1:]:
        try:
            path(*args)
        except Exception as error:  # an optional path never takes the call down
            warnings.warn(
                f"rmsnorm: the {dispatch.path_name(path)} path failed at its first call and is left out "
                f"({type(error).__name__}: {str(error)[:200]})",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            runnable.append(path)
    return tuning.fastest(
        runnable, lambda path, launch_args: path(*launch_args), args, passes=PATH_MEASURE_PASSES
    )


def _dispatch(direction: str, dtypes: tuple, residual: bool, n: int, m: int, paths: list,
              device: torch.device, args: tuple) -> None:  # fmt: skip
    """Run the call on the path that serves it (dispatch.run: an override, an opt-in tuning's
    measurement with _fastest, the dispatch table, or the default in heuristic configurations)."""
    dispatch.run(direction, dtypes, residual, n, m, paths, device, args, _fastest)


def rmsnorm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    offset: float = 0.0,
    dh_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx [M, N] (dtype of x) and dw [N] (dtype of weight), dw summed from fp32 partials.

    x is the normalized input (h, with a residual). dh_out, the gradient arriving on h, is
    added to dx, which is then also the residual's gradient.

    Allocates dx, dw, the [programs, N] fp32 partials (programs <= SM count) and, for wide rows,
    one fp32 per row (and per 16384-wide chunk when rows are split; one int64 per 8192- or
    16384-wide slice instead when a group of programs holds each row); nothing else. dw is the
    partials' fp32 sum in a fixed order, rounded once. The two-role path (small shapes, where
    the dispatch table picks it) allocates dx and dw only: its column programs sum dw
    over every row in fp32, in a fixed order.
    """
    offset = float(offset)
    replay_key = None
    tag = dispatch.replay_tag() if _REPLAYABLE else None
    if tag is not None:
        replay_key = _backward_replay_key(dy, x, weight, rstd, dh_out)
        if tag:  # as in rmsnorm_forward
            replay_key = (tag, *replay_key)
        replayed = replays._REPLAYS.get(replay_key)
        if replayed is not None and _is_current(replay_key[-1]):
            return _replay_backward(replayed, dy, x, weight, rstd, offset, dh_out)
    _check_runnable(x)
    if x.dim() != 2:
        check_two_level(x, None)
    m, n = rows_and_width(x)
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return dx, torch.zeros_like(weight)
    dh_arg = dy if dh_out is None else dh_out
    dw = torch.empty_like(weight)
    args = (dy, x, weight, rstd, offset, dx, dh_arg, dh_out is not None, dw)
    with _on_device(x):
        if replay_key is not None and not backward_is_looped(n) and _replays_as_single_tile():
            grid = _single_tile_backward_grid(m, x.device, backward_row_period(x, dy, dh_out))
            _record(replay_key, _backward_launches, args, (1, 2), (*grid, x.dim() == 3))
        else:
            _backward_launches(*args)
    return dx, dw


#: The backward families _replay_backward repeats (their launches take the single tile's
#: arguments); the offered paths at widths that are not looped are these.
_REPLAYED_BACKWARDS = ("single_tile", "two_role")


def _replays_as_single_tile() -> bool:
    """Whether a recorded backward would be one _replay_backward repeats: always for the
    offered paths; under a kernel test's override(offered_only=False), for the families above."""
    beyond = dispatch.forced_beyond_offers("bwd")
    return beyond is None or beyond.split("(")[0] in _REPLAYED_BACKWARDS


def _backward_launches(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw) -> None:
    """The backward's kernels for x's width, then the dw partials' reduction into dw. Where
    several paths can serve x (wide rows that fit the held row), the dispatch picks one."""
    args = (dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out, dw)
    m, n = dx.shape
    paths = backward_paths(x, dy, weight, dh_arg if has_dh_out else None)
    dtypes = (x.dtype, weight.dtype, dy.dtype, dh_arg.dtype)
    _dispatch("bwd", dtypes, has_dh_out, n, m, paths, x.device, args)


def backward_paths(x, dy, weight, dh_out) -> list:
    """The backward paths that can serve x, the default first; for rows in two levels (x
    [outer, heads, N]) the plain single tile only (kernels.py's HEADS)."""
    if x.dim() == 3:
        return [_backward_single_tile]
    beyond = dispatch.forced_beyond_offers("bwd")
    if beyond is not None:  # a kernel test's override(offered_only=False)
        return [dispatch.path_named(every_backward_path(), beyond, "backward")]
    if not backward_is_looped(x.shape[1]):
        if backward_takes_two_roles(x, dy, dh_out):
            return [_backward_single_tile, _backward_two_role]
        return [_backward_single_tile]
    groups = [_held_group_backward_path(c) for c in held_group_backwards(x, dy, weight, dh_out)]
    if backward_holds_row_on_chip(x, dy, weight, dh_out):
        return [_backward_wide, *_HELD_ROW_BACKWARDS, *groups]
    return [_backward_wide, *groups]


def _replay_forward(replayed: tuple, x, weight, eps, offset, out_dtype, keep_rstd: bool):
    (replay,), configs, two_level = replayed
    _LAUNCHED.update(configs)
    if two_level is None:
        m, n = x.shape
        stride = x.stride(0)
    else:  # x [outer, heads, N]: its HEADS and STRIDE_X_OUTER are the recorded launch's (key)
        outer, heads, n = x.shape
        m, stride = outer * heads, x.stride(1)
    y = x.new_empty((m, n)) if out_dtype is None else x.new_empty((m, n), dtype=out_dtype)
    rstd = x.new_empty((m,), dtype=torch.float32) if keep_rstd else None
    strides = (stride, n, stride, stride)
    rstd_arg = y if rstd is None else rstd  # recorded without rstd: STORE_RSTD False (key)
    replay(
        x.get_device(),
        *_single_tile_forward_args(x, weight, y, rstd_arg, x, x, strides, eps, offset),
    )
    return y, rstd, None


def _replay_backward(replayed: tuple, dy, x, weight, rstd, offset, dh_out):
    """The recorded single-tile backward again: two launches (the main kernel and the dw
    reduction), or one (the two-role kernel)."""
    launches, configs, (programs, rows_per_program, two_level) = replayed
    _LAUNCHED.update(configs)
    if two_level:  # x [outer, heads, N] (its HEADS and STRIDE_X_OUTER: the recorded launch's)
        outer, heads, n = x.shape
        m = outer * heads
    else:
        m, n = x.shape
    device = x.get_device()
    dx = x.new_empty((m, n))
    dw = weight.new_empty((n,))
    dh_arg = dy if dh_out is None else dh_out
    if launches[0].kernel is kernels.rmsnorm_bwd_two_role_kernel:
        (two_role,) = launches
        two_role(device, *_two_role_backward_args(dy, x, weight, rstd, offset, dx, dh_arg, dw,
                                                  programs, rows_per_program))  # fmt: skip
        return dx, dw
    backward, reduce = launches
    dw_partial = x.new_empty((programs, n), dtype=torch.float32)
    backward(device, *_single_tile_backward_args(dy, x, weight, rstd, offset, dx, dh_arg,
                                                 dw_partial, rows_per_program))  # fmt: skip
    reduce(device, dw_partial, dw, programs, n)
    return dx, dw
