"""Launchers: grids, launch configurations and allocation for the kernels in kernels.py.

Paths, chosen by the hidden size N (and for wide rows by M), separately for each direction:
- single tile (forward N <= SINGLE_TILE_MAX_N, backward N <= BACKWARD_SINGLE_TILE_MAX_N): whole
  rows in one [BLOCK_M, BLOCK_N] tile (BLOCK_N = next_power_of_2(N)), x read once; the backward
  walks rows with a private dw accumulator per program, and takes rows that do not start on 16
  bytes (N odd, say) in a kernel of its own that reads and writes them in aligned vectors
  (backward_row_period).
- looped, for wider rows: each row walked in WIDE_BLOCK_N chunks (the forward, persistent, reads
  x twice, the second time mostly from L2), the backward in two steps (per-row dot product, then
  column blocks x row groups). No hidden-size cap below 2**31.
- split, for wide rows fewer than SMs: each row cut into SPLIT_BLOCK_N chunks, one program per
  (row, chunk), in two launches.
- held row (forward, 16-bit rows of SINGLE_TILE_MAX_N < N <= HELD_ROW_MAX_N, NVIDIA GPUs with
  Gluon): each row held on one SM in registers and shared memory (gluon_kernels.py), x read
  once; measured against the looped or split path at the first call. The backward's held row
  (16-bit rows of BACKWARD_SINGLE_TILE_MAX_N < N <= HELD_BACKWARD_MAX_N) stages each row's x and
  dy in shared memory and reads them once; measured against the wide path at the first call.
- held group (16-bit rows, forward past SINGLE_TILE_MAX_N, backward past HELD_BACKWARD_MAX_N,
  and at the held row's widths where the row fills whole slices): each row held by a group of
  programs, each staging a slice of it, the slices' sums exchanged through global memory (an
  ordinary launch: programs join groups in start order and claim rows); measured at the first call beside the paths above (the forward in each
  configuration of HELD_GROUP_FORWARDS).
Where several paths can serve a call ("measured" above: forward rows of FORWARD_LOOPED_FROM_N
< N <= SINGLE_TILE_MAX_N take the single tile or the looped path, say), the dispatch table picks
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

import contextlib
import functools
import math
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
import triton

from . import direct, dispatch, kernels, tuning

try:  # Triton's lower-level language; the held-row forward needs it
    from . import gluon_kernels
except ImportError:
    gluon_kernels = None

#: Widest row the single-tile forward takes: one row lives in registers.
SINGLE_TILE_MAX_N = 65536
#: Widest row the single-tile backward takes. Above it, its per-program fp32 dw accumulator plus
#: x, dy and g per row spill: on the H200 it fell to 638 GB/s at N = 32768 and 358 at 65536, while
#: the looped backward ran ~2.1 TB/s at N = 131072 and 262144 (docs/perf-log.md, v1; heuristic
#: launch configs, the looped path at 32768-65536 itself not yet measured).
BACKWARD_SINGLE_TILE_MAX_N = 16384
#: From this tile width on, the single-tile backward holds 16-bit x and dy as loaded between its
#: two passes (rmsnorm_bwd_kernel's HOLD_STORAGE_FORM). At N = 16384 it spilled without that and
#: ran 1.28-1.38x faster with it on the H200 (bf16 and fp16, 2048-8192 rows); at N <= 8192 it
#: ran 0.97-1.02x, so narrower tiles keep the plain kernel
#: (results/nvidia-h200/probes/2026-11-30-83f69ecd04db-backward-raw-held-ab.txt). Measured at
#: N = 16384 only; N = 8193-16383 share its tile width and take it too.
BACKWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N = 16384
#: From this tile width on, the single-tile forward holds 16-bit x as loaded between its
#: reduction and its scaling (rmsnorm_fwd_kernel's HOLD_STORAGE_FORM). At 65536 columns that
#: ends its spills (ptxas, sm_90). Measured against the product's forward, bf16 and fp16
#: (results/nvidia-h200/probes/2026-11-30-daf182be02dc-forward-storage-form-ab.txt): 1.20-1.31x
#: at N = 65536, 1.04-1.08x at 32768, within noise (0.995-1.003) at 16384.
FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N = 32768
#: From this tile width on, the single-tile forward takes rows that do not start on 16 bytes
#: (odd N) in rmsnorm_fwd_shifted_kernel. On the H200 it ran 1.06x the plain kernel at 4095
#: columns, 1.11x at 8191 and 1.41x at 16383, bf16 and fp16
#: (results/nvidia-h200/probes/2026-11-30-6386bc914efd-forward-shifted-ab.txt); narrower odd
#: rows, several a tile, were not measured and keep the plain kernel.
SHIFTED_FORWARD_FROM_BLOCK_N = 4096
#: Chunk width of the looped (wide-row) kernels.
WIDE_BLOCK_N = 4096
#: The held-row forward (gluon_kernels.rmsnorm_fwd_held_row_kernel): a row's first HELD_ROW_REG
#: elements in registers, the rest in shared buffers of HELD_ROW_CHUNK, at most
#: HELD_ROW_SHARED_CHUNKS (192 KB of 16-bit elements), HELD_ROW_WARPS warps, one program per SM.
#: At N = 131072 on the H200: 3131-3310 GB/s bf16 at 256-1024 rows, 1.17x the looped forward
#: at 512 rows (results/nvidia-h200/2026-11-30-e8ad3d4cb361-n131072.jsonl; perf log, v16).
HELD_ROW_REG = 32768
HELD_ROW_CHUNK = 32768
HELD_ROW_SHARED_CHUNKS = 3
HELD_ROW_WARPS = 32
HELD_ROW_MAX_N = HELD_ROW_REG + HELD_ROW_SHARED_CHUNKS * HELD_ROW_CHUNK
#: Shared memory the kernel needs beyond its buffers (its reductions' scratch), with margin.
HELD_ROW_SCRATCH_BYTES = 4096


class HeldGroupForward(NamedTuple):
    """A configuration of the grouped held-row forward: a program owns slice_n columns of a row,
    staged in a ring of `ring` slots beside w's slice; at most per_sm programs an SM (fewer
    where its shared memory holds fewer); `warps` warps a program."""

    slice_n: int
    ring: int
    per_sm: int
    warps: int


#: The grouped held-row forward (gluon_kernels.rmsnorm_fwd_held_group_kernel), past
#: SINGLE_TILE_MAX_N: a group of programs shares each row, each holding a slice, in an ordinary
#: launch (programs join groups in start order and claim rows: gluon_kernels' grouped section);
#: the slices' sums exchanged as the grouped backward's. Each configuration here that
#: fits the device is a path of its own, measured at the first call beside the looped or split
#: path and, up to HELD_ROW_MAX_N, v16's held row. On the H200: 8192-column slices, 2 ring slots,
#: 4 an SM, 8 warps (v21) ran 1.17-1.23x the looped and split paths at 262144 and 1048576 columns
#: (probes/2026-11-30-bb689b9d08e7-forward-held-group-sweep.txt), 80-82% of the copy with v22's
#: exchange (2026-11-30-ef67b6007d7c-wide.jsonl). 4096-column slices, 3 slots, 6 an SM, 4 warps
#: ran 1.07x (bf16) and 1.15x (fp16) the held row at 512x131072 and 1.00-1.04x v21's at
#: 256x262144; at 64x1048576 they tied once v24 took a barrier a row out of the 4096 one's
#: exchange (...-54cf7de0323a-held-group-no-barrier-ab.txt), and in the wide preset the 4096
#: configuration was chosen at every width (2026-11-30-54cf7de0323a-wide.jsonl); below 65537
#: columns every configuration ran 0.88-0.94x the single tile
#: (probes/2026-11-30-476e7722a907-forward-group-below-held-row-ab.txt, ...-2c36f439a200-
#: forward-group-config-sweep.txt).
HELD_GROUP_FORWARDS = (
    HeldGroupForward(slice_n=4096, ring=3, per_sm=6, warps=4),
    HeldGroupForward(slice_n=8192, ring=2, per_sm=4, warps=8),
)
#: Shared memory an SM keeps for each resident program beyond what the program asks for.
SHARED_BYTES_RESERVED_PER_PROGRAM = 1024
#: The held-row backward (gluon_kernels.rmsnorm_bwd_held_row_kernel): a row's x and dy staged
#: whole in a shared-memory ring of HELD_BACKWARD_CHUNK-column slots (as many as fit, at least a
#: row's), w in shared memory, the program's dw accumulator in registers (one variable a chunk,
#: HELD_BACKWARD_MAX_CHUNKS at most), one program per SM, 16 or 32 warps (measured at the first
#: call with the wide path). On the H200 (bf16, 2048-8192 rows of 20480-32768 columns) it ran
#: 1.30-1.49x the wide path, 73-87% of the copy; at 512 rows and fewer, slower
#: (results/nvidia-h200/probes/2026-11-30-72bc9566aa85-backward-held-row-ab.txt).
HELD_BACKWARD_CHUNK = 8192
HELD_BACKWARD_MAX_CHUNKS = 4
HELD_BACKWARD_MAX_N = HELD_BACKWARD_CHUNK * HELD_BACKWARD_MAX_CHUNKS
HELD_BACKWARD_WARPS = (16, 32)


class HeldGroupBackward(NamedTuple):
    """A configuration of the grouped held-row backward: a program owns `chunks` chunks of
    `chunk` columns of a row (its slice), staged in a ring of `ring` chunk slots of x and dy
    beside w's slice; at most per_sm programs an SM (fewer where its shared memory holds fewer;
    registers capped so that per_sm fit); `warps` warps a program."""

    chunk: int
    chunks: int
    ring: int
    per_sm: int
    warps: int

    @property
    def slice_n(self) -> int:
        return self.chunk * self.chunks


#: The grouped held-row backward (gluon_kernels.rmsnorm_bwd_held_group_kernel), past
#: HELD_BACKWARD_MAX_N: a group of programs shares each row, each holding a slice as the held
#: row holds a row, the slices' sums exchanged through global memory; an ordinary launch. Each
#: configuration here that fits the device is a path of its own, measured at the first call
#: with the wide path. On the H200, 16384-column slices, 5 ring slots, 8 warps, 1 an SM (v20)
#: ran 1.12-1.20x the wide path at 64-2048 rows of 65536-1048576 columns, 54-70% of the copy
#: (results/nvidia-h200/probes/2026-11-30-efadf974d067-backward-held-group-ab.txt), and
#: 1.07-1.14x that at 65536-262144 columns (70-79%) once each slice's sum and its row's tag
#: travelled in one word, read early (...-f6e941568a02-backward-held-group-packed-ab.txt).
#: Under that exchange 8192-column slices at 2 an SM ran 1.015-1.033x (v28; 512x65536 to
#: 256x262144 and 2048x32768, bf16, and 512x65536 fp16: ...-762450216ee4-backward-group-configs-
#: ab.txt), where under v20's they had not; at 2 an SM the registers are capped at 128
#: (REGISTERS_PER_SM over 2 x 8 warps), which ptxas met without spilling at 24576-1048576
#: columns, bf16 and fp16, with or without dh_out (Triton 3.6, `ptxas -v` offline:
#: probes/2026-11-30-0e25331f7a64-grouped-backward-registers.txt, where uncapped it gave both
#: configurations up to 183 registers). A row's programs are at most the SM count in either
#: (_held_group_fits_device).
HELD_GROUP_BACKWARDS = (
    HeldGroupBackward(chunk=4096, chunks=2, ring=5, per_sm=2, warps=8),
    HeldGroupBackward(chunk=8192, chunks=2, ring=5, per_sm=1, warps=8),
)
#: 32-bit registers an SM on the Hopper-class GPUs the Gluon kernels run on.
REGISTERS_PER_SM = 65536
#: Polls of a row's published sums a warp of a grouped kernel makes, all its rows together,
#: before it stops waiting and sums rows alone (the same bits), and of its group's tickets that
#: member 0 makes before it claims rows with the members it has: the last resort where fewer
#: than a group's programs can be resident at all (a kernel on another stream holding the rest
#: of the GPU until ours ends). Programs join groups in start order, so otherwise every wait
#: ends once partners that are already running, or about to start, get there.
HELD_GROUP_SPIN_LIMIT = 1 << 20
#: Rows a claim of the grouped forward takes (gluon_kernels' grouped section): one, so that
#: groups finish within a row of each other whatever number of them is resident.
HELD_GROUP_FORWARD_CHUNK_ROWS = 1
#: Chunks of rows a group of the grouped backward takes in a call, where the SM count allows
#: (held_group_row_chunks): groups that start late (beside a kernel on another stream) then
#: leave at most a quarter of a group's rows to the others.
HELD_GROUP_CHUNKS_PER_GROUP = 4
#: How far past the writers' tags the grouped kernels' readers look: 0. The tests set 1, so
#: that no group ever looks complete and every program takes the fallback on every row.
HELD_GROUP_TAG_OFFSET = 0
#: Chunk width of the split kernels (wide rows, fewer of them than SMs): one program per
#: (row, chunk).
SPLIT_BLOCK_N = 16384
#: The dw reduction's tile: every partial row at once (up to DW_REDUCE_MAX_ROWS, padded to a
#: power of two; there are at most SM-count of them) x DW_REDUCE_BLOCK_N columns, one program per
#: column block. It reads the partials while they sit in L2, each program in one step rather
#: than in a loop of dependent 64-row steps: the reduction is a chain of L2 round trips.
DW_REDUCE_MAX_ROWS = 256
DW_REDUCE_BLOCK_N = 32
DW_REDUCE_WARPS = 8
#: Over DW_REDUCE_FEW_ROWS partial rows or fewer (the grouped backwards' 2-16 groups) that tile
#: leaves a program 64-512 elements: 32768 programs of 64 over [2, 1048576], 22-28 µs where the
#: read takes 4. There the tile is DW_REDUCE_FEW_ROWS_TILE elements, at most
#: DW_REDUCE_MAX_BLOCK_N columns and no more than leave every SM a program, 8 warps from
#: DW_REDUCE_WIDE_BLOCK_N columns and 4 below (1.5-6.4x the 32-column tile at 2-16 rows of
#: 131072-1048576 columns; 0-0.4 µs behind the best tile swept at each case, 2.7 at [16,
#: 1048576]; 128 columns at 8 warps ran 1.5-3x slower than at 4:
#: `probes/2026-11-30-5bf2d0db5974-dw-reduce-tile-sweep.txt`). Over more rows the sweep found 4
#: warps 4-50% faster than 8 (64 and 132 rows); not taken: that tile serves every narrow
#: backward, whose runs were not repeated with it.
DW_REDUCE_FEW_ROWS = 16
DW_REDUCE_FEW_ROWS_TILE = 8192
DW_REDUCE_MAX_BLOCK_N = 1024
DW_REDUCE_WIDE_BLOCK_N = 512
DW_REDUCE_FEW_ROWS_WIDE_WARPS = 8
DW_REDUCE_FEW_ROWS_NARROW_WARPS = 4
#: Column indices are int32 inside the kernels, and the last chunk's indices (up to N - 1 plus
#: one chunk) must stay below 2**31.
MAX_N = 2**31 - SPLIT_BLOCK_N
#: The two-role backward (kernels.rmsnorm_bwd_two_role_kernel: dx from row programs, dw from
#: column programs beside them, one launch and no partials) is offered beside the single tile,
#: and measured against it at the first call, for rows of TWO_ROLE_MIN_N to TWO_ROLE_MAX_N
#: columns that the plain single tile takes, up to TWO_ROLE_MAX_ELEMENTS elements in all, and x
#: and dy that take at most half the L2 (the column programs' second read of them should hit).
#: Measured at 512-4096 x 2048-8192 bf16 (`probes/2026-11-30-00b1a79b83c3-backward-two-role-ab.txt`
#: and `-298c233f2267-...-ab-2.txt`): 1.09-1.38x the single tile at 512x2048-8192 and
#: 1.16-1.18x at 1024x2048; 1.00x at 1024x4096 and 0.97-1.00x at 2048x2048; 0.92-0.94x at
#: 1024x8192, 0.91x at 2048x4096 and 0.68-0.80x at 4096x2048, 2048x8192 and 4096x8192 (each
#: column program walks every row). Narrower rows leave few column programs, each walking more
#: rows (not measured: not offered).
TWO_ROLE_MIN_N = 2048
TWO_ROLE_MAX_N = 8192
TWO_ROLE_MAX_ELEMENTS = 1 << 22
#: Its column programs' tile, per single-tile width (BLOCK_N): (COL_BLOCK columns, COL_ROWS rows
#: a step, COL_STAGES): the probe's best at 2048, 4096 and 8192 columns, about one column
#: program an SM there.
TWO_ROLE_COLUMN_TILES = {2048: (16, 128, 3), 4096: (32, 128, 4), 8192: (64, 64, 3)}

NUM_WARPS_CHOICES = (1, 2, 4, 8, 16, 32)
#: Stages of the kernels with loops (each sets LOOP_STAGES, see _PIPELINED_LOOPS). Triton's
#: pipeliner keeps S - 2 later steps' loads in flight while a step computes: at 2 stages it
#: issues the next step's loads after the current step's stores, no overlap (compiled on Triton
#: 3.6 and 3.9), so 2 is not tried.
NUM_STAGES_CHOICES = (1, 3, 4)
ROWS_PER_TILE_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: Rows per program (BLOCK_M) of the single-tile kernels: the tile holds about this many elements
#: (tuning tries this and twice this), so narrow rows are taken several at a time; rows of
#: TILE_TARGET or more elements go one per tile. Per-thread element counts outside a range keep
#: the autotuner from compiling configs that only spill or idle.
TILE_TARGET = {
    "rmsnorm_fwd_kernel": 4096,
    "rmsnorm_fwd_shifted_kernel": 4096,
    "rmsnorm_bwd_kernel": 4096,
    "rmsnorm_bwd_shifted_kernel": 4096,
    "rmsnorm_bwd_two_role_kernel": 4096,
}
_ELEMENTS_PER_THREAD = {
    "rmsnorm_fwd_kernel": (4, 64),
    "rmsnorm_fwd_shifted_kernel": (4, 64),
    "rmsnorm_bwd_kernel": (8, 32),
    "rmsnorm_bwd_shifted_kernel": (8, 32),
    "rmsnorm_bwd_two_role_kernel": (8, 32),
}
#: The single-tile backward kernels: rows that start on 16 bytes, rows that do not, and the
#: two-role kernel's row programs.
_BACKWARD_TILE_KERNELS = (
    "rmsnorm_bwd_kernel",
    "rmsnorm_bwd_shifted_kernel",
    "rmsnorm_bwd_two_role_kernel",
)
#: The largest tile a single-tile program holds: [BLOCK_M, BLOCK_N] elements.
MAX_TILE = 65536

#: Backward programs under the interpreter (no SM count there); > 1 so the partial-dw reduction
#: is exercised by CPU tests.
_INTERPRETER_PROGRAMS = 4


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints. Plain Python: triton.cdiv is a constexpr function object whose call
    costs several microseconds of host time per launch (triton 3.9)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1); plain Python, like cdiv."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _previous_power_of_2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


#: Read once, when triton is imported with this module, as Triton itself reads it.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return _INTERPRETING


def rows_per_tile(kernel_name: str, block_n: int) -> int:
    """The heuristic BLOCK_M: whole rows per tile, about TILE_TARGET elements (at least 1 row,
    at most the largest tuning choice)."""
    return max(1, min(ROWS_PER_TILE_CHOICES[-2], TILE_TARGET[kernel_name] // block_n))


#: Kernels without a loop compile to the same code for every num_stages: tuned over warps only.
_LOOP_FREE = {
    "rmsnorm_fwd_split_sumsq_kernel",
    "rmsnorm_fwd_split_scale_kernel",
    "rmsnorm_bwd_split_dot_kernel",
}


#: Programs per SM of the persistent looped forward (its grid): fewer rows in flight leave
#: more of each row in L2 for the second pass, more programs keep more bytes in flight. 16 gives
#: up to 2112 rows a program each on 132 SMs, as torch.compile's one program per row
#: (2048x32768, where it led our forward by 10% in the v8 run).
PROGRAMS_PER_SM_CHOICES = (1, 2, 4, 8, 16)
#: Chunk widths the looped forward is tuned over (its BLOCK_N; WIDE_BLOCK_N untuned): the grid
#: sweep measured 16384-wide chunks 9% faster at 512x131072 (perf log, "Lead refuted").
LOOPED_FORWARD_CHUNKS = (WIDE_BLOCK_N, 16384)
#: ... and without autotuning (about one program per row at the wide preset's shapes).
HEURISTIC_PROGRAMS_PER_SM = 8
#: The single-tile forward's grids, as (PROGRAMS_PER_SM, LOOP_STAGES): one program per tile
#: (PROGRAMS_PER_SM 0, no tile loop), or a persistent grid of that many programs per SM whose
#: tile loop is software-pipelined (3 or 4 stages; 1 would overlap nothing that more programs
#: would not). PROGRAMS_PER_SM shapes the grid; the kernel takes only whether it is persistent.
FORWARD_GRID_CHOICES = ((0, 1), *((p, s) for p in (1, 2, 4) for s in (3, 4)))
#: The shifted forward's grids (rmsnorm_fwd_shifted_kernel, always persistent: each program
#: keeps one residue class's w), as (PROGRAMS_PER_SM, LOOP_STAGES).
SHIFTED_FORWARD_GRID_CHOICES = ((4, 1), *((p, s) for p in (1, 2, 4) for s in (3, 4)))


#: Kernels whose loops are software-pipelined through a LOOP_STAGES constexpr (tl.range's
#: num_stages: Triton leaves a loop without dot products unpipelined whatever the launch's
#: num_stages). LOOP_STAGES follows the config's num_stages; without tuning it is 1.
_PIPELINED_LOOPS = {
    "rmsnorm_fwd_kernel",
    "rmsnorm_fwd_shifted_kernel",
    "rmsnorm_bwd_kernel",
    "rmsnorm_bwd_shifted_kernel",
    "rmsnorm_bwd_two_role_kernel",
    "rmsnorm_fwd_looped_kernel",
    "rmsnorm_bwd_row_dot_kernel",
    "rmsnorm_bwd_columns_kernel",
}


def _loop_stages(kernel_name: str, stages: int) -> dict:
    return {"LOOP_STAGES": stages} if kernel_name in _PIPELINED_LOOPS else {}


#: The single-tile forwards' grid choices, (PROGRAMS_PER_SM, LOOP_STAGES) each.
_FORWARD_GRIDS = {
    "rmsnorm_fwd_kernel": FORWARD_GRID_CHOICES,
    "rmsnorm_fwd_shifted_kernel": SHIFTED_FORWARD_GRID_CHOICES,
}


def _configs(kernel_name: str) -> list[triton.Config]:
    if kernel_name in _FORWARD_GRIDS:
        return [
            triton.Config(
                {"BLOCK_M": m, "PROGRAMS_PER_SM": p, **_loop_stages(kernel_name, st)},
                num_warps=warps,
                num_stages=st,
            )
            for m in ROWS_PER_TILE_CHOICES
            for warps in NUM_WARPS_CHOICES
            for p, st in _FORWARD_GRIDS[kernel_name]
        ]
    stages = (1,) if kernel_name in _LOOP_FREE else NUM_STAGES_CHOICES
    if kernel_name in TILE_TARGET:
        metas = [{"BLOCK_M": m} for m in ROWS_PER_TILE_CHOICES]
    elif kernel_name == "rmsnorm_fwd_looped_kernel":
        metas = [
            {"PROGRAMS_PER_SM": p, "BLOCK_N": chunk}
            for p in PROGRAMS_PER_SM_CHOICES
            for chunk in LOOPED_FORWARD_CHUNKS
        ]
    else:
        metas = [{}]
    return [
        triton.Config({**meta, **_loop_stages(kernel_name, st)}, num_warps=warps, num_stages=st)
        for meta in metas
        for warps in NUM_WARPS_CHOICES
        for st in stages
    ]


def _threads_fit(tile: int, num_warps: int, low: int, high: int) -> bool:
    """A tile of that many elements gives each of num_warps * 32 threads low to high of them."""
    return low <= tile / (32 * num_warps) <= high


def _prune_tiles(kernel_name: str):
    """Keep the tiles of BLOCK_M in {h, 2h} rows (h = rows_per_tile) with a sensible number of
    elements per thread; the forward also tries h/2 (more, shorter programs: at 1024x2048 Liger's
    one row per program beat our two, docs/perf-log.md v3), drops 2h when it would leave
    fewer than 2 programs per SM, and drops persistent grids that would give no program a
    second tile (the same launch as one program per tile, with a pipeline that never fills)."""
    low, high = _ELEMENTS_PER_THREAD[kernel_name]

    def prune(configs, named_args, **kwargs):
        block_n = kwargs["BLOCK_N"]
        inputs = 2 if kwargs.get("HAS_RESIDUAL") else 1
        h = rows_per_tile(kernel_name, block_n)
        candidates = {h}
        if 2 * h * block_n <= MAX_TILE:
            candidates.add(2 * h)
        if kernel_name in _BACKWARD_TILE_KERNELS:  # no taller tile than a program's rows
            rows = next_power_of_2(named_args["rows_per_program"])
            candidates = {min(c, rows) for c in candidates}
        if kernel_name == "rmsnorm_fwd_kernel":
            m, device = named_args["M"], named_args["X"].device
            if 2 * h in candidates and cdiv(m, 2 * h) < 2 * _programs_cap(device):
                candidates.discard(2 * h)
            if h > 1:
                candidates.add(h // 2)
        kept = [
            c
            for c in configs
            if c.kwargs["BLOCK_M"] in candidates
            and _threads_fit(c.kwargs["BLOCK_M"] * block_n, c.num_warps, low, high)
            and _persistent_grid_loops(c.kwargs, named_args, block_n, inputs)
        ]
        if kept:
            return kept
        # a tile too small for even one warp at the low end: the fewest warps
        fewest = min(c.num_warps for c in configs)
        smallest = min(candidates)
        return [c for c in configs if c.kwargs["BLOCK_M"] == smallest and c.num_warps == fewest]

    return prune


#: Shared memory a forward's pipelined loops may stage (the single-tile forward's tile loop:
#: LOOP_STAGES - 1 tiles of x, and r, in flight; the looped forward: _looped_forward_staging).
#: The H200 gives a program up to 227 KB; larger stagings fail to launch.
PIPELINE_SHARED_BYTES = 200 * 1024


def tile_loop_staging(config: dict, block_n: int, bytes_per_element: int) -> int:
    """Shared memory the single-tile forward's pipelined tile loop takes: LOOP_STAGES - 1 tiles
    in flight, bytes_per_element per tile element (x's size, twice with a residual's r)."""
    return (config["LOOP_STAGES"] - 1) * config["BLOCK_M"] * block_n * bytes_per_element


def _persistent_grid_loops(config: dict, named_args: dict, block_n: int, inputs: int) -> bool:
    """A config without a persistent grid, or one whose programs get more than one tile and
    whose staged tiles (inputs tensors of X's dtype) fit PIPELINE_SHARED_BYTES."""
    if config.get("PROGRAMS_PER_SM", 0) == 0:
        return True
    x, m = named_args["X"], named_args["M"]
    staged = tile_loop_staging(config, block_n, x.element_size() * inputs)
    programs = _tile_programs(m, config, x.device)  # the grid the launch would get
    return programs < cdiv(m, config["BLOCK_M"]) and staged <= PIPELINE_SHARED_BYTES


def _prune_looped_forward(configs, named_args, **kwargs):
    """The persistent looped forward: 8 to 32 elements per thread per chunk (BLOCK_N, a tuning
    choice here), of the PROGRAMS_PER_SM choices that already give every row its own program
    only the smallest, and stagings that fit PIPELINE_SHARED_BYTES (_looped_forward_staging).
    With a residual, no pipelined loops: the second pass reads h that the program's threads
    wrote in the first, ordered by a barrier for plain loads; asynchronous copies of it are
    left untried until measured correct on a GPU."""
    x, m = named_args["X"], named_args["M"]
    device, w_size = x.device, named_args["W"].element_size()
    enough = next(
        (p for p in PROGRAMS_PER_SM_CHOICES if p * _programs_cap(device) >= m),
        PROGRAMS_PER_SM_CHOICES[-1],
    )
    return [
        c
        for c in configs
        if c.kwargs["PROGRAMS_PER_SM"] <= enough
        and _threads_fit(c.kwargs["BLOCK_N"], c.num_warps, 8, 32)
        and not (kwargs["HAS_RESIDUAL"] and c.kwargs["LOOP_STAGES"] > 1)
        and _looped_forward_staging(c.kwargs, x.element_size(), w_size) <= PIPELINE_SHARED_BYTES
    ]


def _looped_forward_staging(config: dict, x_size: int, w_size: int) -> int:
    """Shared memory the looped forward's pipelined loops take: LOOP_STAGES - 1 chunks of x and
    of w in flight (the first pass stages x, the second x and w, in the same buffers). On the
    H200 fp32 16384-wide chunks at 3 stages asked for 262144 bytes (2 x 16384 x (4 + 4)) and
    failed to launch; bf16 ones at 4 stages (3 x 16384 x (2 + 2)) ran. Compiled for sm_90
    (Triton 3.6 and 3.9), bf16 x with an fp32 w at 4 stages takes 3 x 16384 x (2 + 4)."""
    return (config["LOOP_STAGES"] - 1) * config["BLOCK_N"] * (x_size + w_size)


def _prune_shifted_forward(configs, named_args, **kwargs):
    """The shifted forward: BLOCK_M of h / 2, h and 2h rows (h = rows_per_tile), 4 to 64
    elements per thread, and staged tiles (LOOP_STAGES - 1 of them, x's, r's, and with MAY_WRAP
    each twice) within PIPELINE_SHARED_BYTES."""
    block_n = kwargs["BLOCK_N"]
    h = rows_per_tile("rmsnorm_fwd_shifted_kernel", block_n)
    heights = {max(1, h // 2), h} | ({2 * h} if 2 * h * block_n <= MAX_TILE else set())
    staged_bytes = named_args["X"].element_size() * (2 if kwargs["HAS_RESIDUAL"] else 1)
    staged_bytes *= 2 if kwargs["MAY_WRAP"] else 1
    kept = [
        c
        for c in configs
        if c.kwargs["BLOCK_M"] in heights
        and _threads_fit(c.kwargs["BLOCK_M"] * block_n, c.num_warps, 4, 64)
        and tile_loop_staging(c.kwargs, block_n, staged_bytes) <= PIPELINE_SHARED_BYTES
    ]
    return kept or [min(configs, key=lambda c: (c.kwargs["BLOCK_M"], c.num_warps))]


def _prune_warps(configs, named_args, **kwargs):
    """Split kernels (one BLOCK_N chunk per program): 8 to 64 elements per thread."""
    kept = [c for c in configs if _threads_fit(kwargs["BLOCK_N"], c.num_warps, 8, 64)]
    return kept or [max(configs, key=lambda c: c.num_warps)]


#: The kernels launched through _launch, tuned per key: the kernel, the dtypes of its varying
#: tensors, its constexpr switches (each variant gets its own config), N and, for the kernels
#: that take it, ROWS_BUCKET (M's bit length: a config tuned at M = 512 ran fp16 N = 2048 at half
#: speed at M = 4096, docs/perf-log.md v3), and the device.
_TUNED_KERNELS = (
    "rmsnorm_fwd_kernel",
    "rmsnorm_fwd_shifted_kernel",
    "rmsnorm_fwd_looped_kernel",
    "rmsnorm_bwd_kernel",
    "rmsnorm_bwd_shifted_kernel",
    "rmsnorm_bwd_two_role_kernel",
    "rmsnorm_bwd_columns_kernel",
    "rmsnorm_bwd_row_dot_kernel",
    "rmsnorm_fwd_split_sumsq_kernel",
    "rmsnorm_fwd_split_scale_kernel",
    "rmsnorm_bwd_split_dot_kernel",
)


#: Each tuned kernel's pruning of its configuration space (the rest keep every config).
_PRUNE = {
    "rmsnorm_fwd_kernel": _prune_tiles("rmsnorm_fwd_kernel"),
    "rmsnorm_fwd_shifted_kernel": _prune_shifted_forward,
    "rmsnorm_bwd_kernel": _prune_tiles("rmsnorm_bwd_kernel"),
    "rmsnorm_bwd_shifted_kernel": _prune_tiles("rmsnorm_bwd_shifted_kernel"),
    "rmsnorm_bwd_two_role_kernel": _prune_tiles("rmsnorm_bwd_two_role_kernel"),
    "rmsnorm_fwd_looped_kernel": _prune_looped_forward,
    "rmsnorm_fwd_split_sumsq_kernel": _prune_warps,
    "rmsnorm_fwd_split_scale_kernel": _prune_warps,
    "rmsnorm_bwd_split_dot_kernel": _prune_warps,
}


def _candidates(kernel_name: str, args: tuple, constexprs: dict) -> list[dict]:
    """The configurations tried for this launch, as launch keywords."""
    configs = _configs(kernel_name)
    prune = _PRUNE.get(kernel_name)
    if prune is not None:
        named_args = dict(zip(getattr(kernels, kernel_name).arg_names, args, strict=False))
        configs = prune(configs, named_args, **constexprs)
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in configs]


def _tuned_config(kernel_name: str, grid, args: tuple, constexprs: dict) -> dict:
    """The candidate configuration with the least device time on these arguments
    (tuning.py: CUDA-graph replays over rotating copies, as the harness times backends)."""
    kernel = getattr(kernels, kernel_name)
    # each candidate with its launch grid and keywords, made once for compiling and timing
    launches = [
        (config, *_kernel_grid_and_meta(kernel_name, grid, {**constexprs, **config}))
        for config in _candidates(kernel_name, args, constexprs)
    ]
    _compile_in_parallel(kernel, args, [(launch_grid, meta) for _, launch_grid, meta in launches])

    def run(launch: tuple, launch_args: tuple) -> None:
        _config, launch_grid, meta = launch
        kernel[launch_grid](*launch_args, **meta)

    return tuning.fastest(launches, run, args)[0]


#: Threads compiling a tuning's candidates at once (at most one per CPU core).
COMPILE_THREADS = 16


def _compile_in_parallel(kernel, args: tuple, launches: list[tuple]) -> None:
    """Compile the kernel for every (grid, launch keywords) in launches before any is timed, on
    a thread pool (Triton's AsyncCompileMode; its compiler releases the GIL: 42 forward
    candidates compiled 1.7-1.8x faster on 2 cores, Triton 3.6 and 3.9). The first call of a
    shape class compiles up to ~100 candidates, one after another without this. A candidate
    that fails to compile is left to the timing loop, which compiles it again and skips it
    (tuning._UNRUNNABLE)."""
    threads = min(len(launches), _usable_cpus(), COMPILE_THREADS)
    if threads < 2:
        return
    with ThreadPoolExecutor(threads) as pool:
        compile_mode = triton.AsyncCompileMode(pool, ignore_errors=True)
        try:
            compile_mode.__enter__()
        except RuntimeError:  # the caller has one open (one per context): compile one by one
            return
        try:
            for launch_grid, meta in launches:
                kernel.warmup(*args, grid=launch_grid, **meta)
        finally:
            compile_mode.__exit__(None, None, None)  # waits for every compile


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def autotuning() -> bool:
    """Whether this call tunes its kernels and measures its paths: only inside a runtime tuning
    (dispatch.py: the offline tuner, dispatch.tuning(), RMSNORM_TRITON_TUNE=1), on a GPU. A
    default call takes its configurations from the dispatch table or the heuristic."""
    return dispatch.measuring() and not _INTERPRETING


def heuristic_num_warps(tile: int) -> int:
    """Warps for a tile of that many elements when not autotuning: ~256 elements per warp."""
    return max(1, min(32, tile // 256))


#: (kernel, dtypes, launch switches, N, M's bit length, device) -> the tuner's choice as launch
#: keywords: each key is tuned once per process (tuning.py).
_TUNED: dict[tuple, dict] = {}
#: Launch switches that change a kernel's binary but not which configuration suits it: left out
#: of the tuning key, so contiguous and strided rows of one shape share one tuning (each layout
#: still compiles its own binary at its first launch).
_LAYOUT_SWITCHES = frozenset({"ROWS_CONTIGUOUS"})


def _launch(kernel_name: str, grid, *args, dtypes: tuple, **kwargs) -> dict:
    """The dispatch table's configuration (or the heuristic's) on a GPU, tuned inside a runtime
    tuning (autotuning()); one fixed configuration under the interpreter, which cannot time.

    grid: a tuple, or a function of the launch meta-parameters (BLOCK_M is chosen by the tuner).
    dtypes: the dtypes of the kernel's tensors that vary (with N and kwargs, the tuning key).
    Triton launches on the current CUDA device: the caller makes it x's device (_on_device).
    After the first launch of a specialization, launches go straight to the compiled kernel
    (direct.py). Returns the configuration launched (the tuner's choice, or the fixed one).
    """
    kernel = getattr(kernels, kernel_name)
    if interpreting():
        config = {**_heuristic_config(kernel_name, kwargs["BLOCK_N"]), "num_warps": 4}
        if "PROGRAMS_PER_SM" in config:
            config["PROGRAMS_PER_SM"] = 1  # fewer programs than rows: the row loop is exercised
        _LAUNCHED[kernel_name] = config
        _harvest(kernel_name, config)
        grid, meta = _kernel_grid_and_meta(kernel_name, grid, {**kwargs, **config})
        kernel[grid](*args, **meta)
        _note_launch(kernel, grid, args, meta, config)
        return config
    if autotuning():
        key = (
            kernel_name,
            dtypes,
            *(value for name, value in kwargs.items() if name not in _LAYOUT_SWITCHES),
            *(args[i] for i in _KEY_POSITIONS[kernel_name]),
            args[0].get_device(),  # GPUs of different models tune apart
        )
        config = _TUNED.get(key)
        if config is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"rmsnorm: {kernel_name} has no tuned launch configuration for N="
                    f"{kwargs['BLOCK_N']} (padded) and these dtypes yet, and configurations "
                    "cannot be timed (nor compiled and loaded) inside a CUDA-graph capture; "
                    "call rmsnorm once with the same shapes and dtypes before capturing"
                )
            config = _TUNED[key] = _tuned_config(kernel_name, grid, args, kwargs)
    else:
        config = _table_config(kernel_name) or _heuristic_config(kernel_name, kwargs["BLOCK_N"])
    _LAUNCHED[kernel_name] = config
    _harvest(kernel_name, config)
    grid, meta = _kernel_grid_and_meta(kernel_name, grid, {**kwargs, **config})
    direct.launch(kernel, grid, args, meta, args[0].get_device())
    _note_launch(kernel, grid, args, meta, config)
    return config


def _harvest(kernel_name: str, config: dict) -> None:
    """While a tuning harvests its choice (dispatch.tune_call), note the kernel's configuration."""
    launched = getattr(dispatch._ACTIVE, "launched", None)
    if launched is not None:
        launched[kernel_name] = dict(config)


def _table_config(kernel_name: str) -> dict | None:
    """The dispatch table's configuration for this kernel in the running path (dispatch.py),
    if it has one and it is in the kernel's configuration space (_configs); else None (the
    heuristic). Not checked against the pruning of a launch's candidates: pruning is about
    speed at the tuned M (every configuration in the space runs at every M of one padded
    width), and a configuration that changed with M would change the bits with M."""
    configs = getattr(dispatch._ACTIVE, "configs", None)
    config = configs.get(kernel_name) if configs else None
    if config is None:
        return None
    known = _IN_SPACE.get(id(config))
    if known is None or known[0] is not config:  # (the config is kept: its id stays its own)
        known = _IN_SPACE[id(config)] = (
            config,
            tuple(sorted(config.items())) in _config_space(kernel_name),
        )
    return config if known[1] else None


#: id(table configuration) -> (the configuration, whether it is in its kernel's space).
_IN_SPACE: dict[int, tuple] = {}


@functools.cache
def _config_space(kernel_name: str) -> frozenset:
    """Every configuration the tuner may pick for the kernel, as sorted launch-keyword items."""
    return frozenset(
        tuple(sorted({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}.items()))
        for c in _configs(kernel_name)
    )


def _kernel_grid_and_meta(kernel_name: str, grid, meta: dict) -> tuple:
    """(grid, launch keywords) for the kernel. The single-tile forwards' PROGRAMS_PER_SM is read
    by their grid functions and reaches the plain kernel only as PERSISTENT (PROGRAMS_PER_SM >
    0), the shifted one not at all; every other kernel launches its configuration as it is."""
    if kernel_name not in _FORWARD_GRIDS:
        return grid, meta
    grid = grid(meta) if callable(grid) else grid
    kernel_meta = {k: v for k, v in meta.items() if k != "PROGRAMS_PER_SM"}
    if kernel_name == "rmsnorm_fwd_kernel":
        kernel_meta["PERSISTENT"] = meta["PROGRAMS_PER_SM"] > 0
    return grid, kernel_meta


#: num_stages when a launch does not choose one (Triton's default).
TRITON_DEFAULT_STAGES = 3


#: kernel name -> the configuration of its latest launch (see take_launch_configs).
_LAUNCHED: dict[str, dict] = {}


def take_launch_configs() -> dict[str, dict]:
    """The tuned kernels launched since the last call, each with its latest configuration
    (BLOCK_M or PROGRAMS_PER_SM, num_warps, num_stages), then forgets them. For the harness's
    records: which configuration a timing ran."""
    taken = {kernel: dict(config) for kernel, config in _LAUNCHED.items()}
    _LAUNCHED.clear()
    return taken


def _heuristic_config(kernel_name: str, block_n: int) -> dict:
    """The launch configuration without autotuning: BLOCK_M by rows_per_tile, ~256 elements per
    warp, no software pipelining of a row loop (LOOP_STAGES 1)."""
    config = {}
    if kernel_name in TILE_TARGET:
        config["BLOCK_M"] = rows_per_tile(kernel_name, block_n)
    if kernel_name == "rmsnorm_fwd_looped_kernel":
        config["PROGRAMS_PER_SM"] = HEURISTIC_PROGRAMS_PER_SM
        config["BLOCK_N"] = block_n  # the chunk: a tuning choice, WIDE_BLOCK_N untuned
    if kernel_name == "rmsnorm_fwd_kernel":
        config["PROGRAMS_PER_SM"] = 0  # one program per tile
    if kernel_name == "rmsnorm_fwd_shifted_kernel":
        config["PROGRAMS_PER_SM"] = SHIFTED_FORWARD_GRID_CHOICES[0][0]
    tile = config.get("BLOCK_M", 1) * block_n
    return {
        **config,
        **_loop_stages(kernel_name, 1),
        "num_warps": heuristic_num_warps(tile),
        "num_stages": TRITON_DEFAULT_STAGES,
    }


def _launch_fixed(kernel, grid, *args, num_warps: int, **constexprs) -> None:
    """A kernel with one fixed configuration (not tuned)."""
    if interpreting():
        meta = {**constexprs, "num_warps": num_warps}
        kernel[grid](*args, **meta)
    else:
        meta = {**constexprs, "num_warps": num_warps, "num_stages": TRITON_DEFAULT_STAGES}
        direct.launch(kernel, grid, args, meta, args[0].get_device())
    _note_launch(kernel, grid, args, meta)


#: Where the tuning key's runtime values (N, ROWS_BUCKET) sit among each kernel's arguments.
_KEY_POSITIONS = {
    name: tuple(
        getattr(kernels, name).arg_names.index(k)
        for k in ("N", "ROWS_BUCKET")
        if k in getattr(kernels, name).arg_names
    )
    for name in _TUNED_KERNELS
}


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _programs_cap(device: torch.device) -> int:
    return _INTERPRETER_PROGRAMS if device.type != "cuda" else _sm_count(device.index or 0)


def block_size(n: int) -> int:
    """The tile width of the single-tile kernels (the whole row, padded to a power of two)."""
    return next_power_of_2(n)


def forward_is_looped(n: int) -> bool:
    return n > SINGLE_TILE_MAX_N


def backward_is_looped(n: int) -> bool:
    return n > BACKWARD_SINGLE_TILE_MAX_N


def rows_are_split(m: int, device: torch.device) -> bool:
    """Wide rows, fewer than programs_cap (the SM count) of them: one program per row would
    leave SMs idle, so each row is split across several programs."""
    return m < _programs_cap(device)


def check_hidden_size(n: int) -> None:
    if n > MAX_N:
        raise ValueError(f"x: hidden size (last dimension) N={n} exceeds {MAX_N} (int32 columns)")


def _on_device(x: torch.Tensor):
    """Make x's GPU the current device for the launches (a no-op when it already is)."""
    index = x.get_device()  # -1 on the CPU
    if index >= 0 and index != torch.cuda.current_device():
        return torch.cuda.device(index)
    return contextlib.nullcontext()


def _check_runnable(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"x: the Triton RMSNorm needs a CUDA tensor, got one on {x.device}; to run on the CPU "
            "set TRITON_INTERPRET=1 before triton is first imported"
        )


def rmsnorm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(y, rstd, h) for a 2-D x [M, N] whose last dimension is contiguous (rows may be strided).

    y is in out_dtype (default x's), rstd one fp32 per row. With a residual r [M, N],
    h = x + r (x's dtype) is written too and y normalizes h; else h is None.
    """
    eps, offset = float(eps), float(offset)  # as every launch specializes them (fp32)
    replay_key = None
    if residual is None and _REPLAYABLE and not dispatch.overridden():
        replay_key = _forward_replay_key(x, weight, out_dtype)
        replayed = _REPLAYS.get(replay_key)
        if replayed is not None and _is_current(replay_key[-1]):
            return _replay_forward(replayed, x, weight, eps, offset, out_dtype)
    _check_runnable(x)
    m, n = x.shape
    check_hidden_size(n)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    h = None if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y, rstd, h
    r_arg, h_arg = (x, x) if residual is None else (residual, h)
    strides = (x.stride(0), y.stride(0), r_arg.stride(0), h_arg.stride(0))
    has_residual = residual is not None
    dtypes = (x.dtype, weight.dtype, y.dtype)
    args = (x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual)
    with _on_device(x):
        paths = forward_paths(x, y, weight, has_residual)
        call = ("fwd", dtypes, has_residual, n, m, paths, x.device)
        if paths == [_forward_single_tile] and replay_key is not None:
            _record(replay_key, lambda *a: _dispatch(*call, a), args, (1,))
        else:
            _dispatch(*call, args)
    return y, rstd, h


def forward_paths(x, y, weight, has_residual: bool) -> list:
    """Every forward path that can serve this call, the default first (dispatch picks one)."""
    m, n = x.shape
    paths = _forward_paths(m, n, x.device)
    if forward_holds_row_on_chip(x, y, has_residual):
        paths = [*paths, _forward_held_row]
    groups = held_group_forwards(x, y, weight, has_residual)
    return [*paths, *map(_held_group_forward_path, groups)]


def _forward_paths(m: int, n: int, device: torch.device) -> list:
    """The forward paths that can serve [m, n], the default first; with several, a GPU measures
    them at the first call (autotuning) and keeps the fastest."""
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
#: and dtype; on a GPU it is measured at the first call of each (N, M size class, dtypes).
FORWARD_LOOPED_FROM_N = 16384
#: Each path is timed this many times, every other pass in reverse order, its best time kept: a
#: path chosen once is kept for the process. With one pass (2.5 ms of replays a path) the wide
#: run at 6e0569859fab kept the two-step backward at 64x1048576 bf16 (168.8 µs) where fresh
#: processes measured the grouped one at 144 µs against its 171, every time
#: (`probes/2026-11-30-271ee64b6e0d-measured-path-choice-*.txt`).
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


def _forward_single_tile(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    m, n = x.shape
    args = _single_tile_forward_args(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset)
    switches = {
        "BLOCK_N": block_size(n),
        "HAS_RESIDUAL": has_residual,
        "HOLD_STORAGE_FORM": forward_holds_storage_form(block_size(n), x.dtype),
    }
    dtypes = (x.dtype, weight.dtype, y.dtype)
    period = _row_period(m, n, (x, y, r_arg, h_arg))
    if period > 1 and block_size(n) >= SHIFTED_FORWARD_FROM_BLOCK_N:
        _launch(
            "rmsnorm_fwd_shifted_kernel",
            lambda meta: (_shifted_forward_programs(m, period, meta, x.device),),
            *args, dtypes=dtypes, **switches, **_shift_constants(n, x.element_size(), period),
        )  # fmt: skip
        return
    _launch(
        "rmsnorm_fwd_kernel", lambda meta: (_tile_programs(m, meta, x.device),), *args,
        dtypes=dtypes, ROWS_CONTIGUOUS=all(stride == n for stride in strides), **switches,
    )  # fmt: skip


def _shifted_forward_programs(m: int, period: int, meta: dict, device: torch.device) -> int:
    """The shifted forward's grid: period programs for each of up to PROGRAMS_PER_SM x SMs /
    period chunks of a residue class's tiles (never more than its tiles)."""
    tiles = cdiv(cdiv(m, period), meta["BLOCK_M"])
    per_class = max(1, meta["PROGRAMS_PER_SM"] * _programs_cap(device) // period)
    return period * min(tiles, per_class)


def forward_holds_storage_form(block_n: int, x_dtype: torch.dtype) -> bool:
    """Whether the single-tile forward holds x (or h) as loaded between its reduction and its
    scaling: wide tiles of 16-bit rows, where inline PTX runs (_inline_ptx_runs)."""
    return (
        block_n >= FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N
        and x_dtype.itemsize == 2
        and _inline_ptx_runs()
    )


def _tile_programs(m: int, meta: dict, device: torch.device) -> int:
    """The single-tile forward's grid: one program per tile of BLOCK_M rows, or at most
    PROGRAMS_PER_SM per SM (a persistent grid) when that is set."""
    tiles = cdiv(m, meta["BLOCK_M"])
    per_sm = meta["PROGRAMS_PER_SM"]
    return tiles if per_sm == 0 else min(tiles, per_sm * _programs_cap(device))


def _single_tile_forward_args(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset) -> tuple:
    """rmsnorm_fwd_kernel's leading arguments, up to ROWS_BUCKET (launch and replay share
    them); N among them is a constexpr, passed by position like the rest."""
    m, n = x.shape
    return (x, weight, y, rstd, r_arg, h_arg, *strides, m, n, eps, offset, m.bit_length())


def _forward_looped(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    m, n = x.shape
    programs_cap = _programs_cap(x.device)
    _launch(
        "rmsnorm_fwd_looped_kernel", lambda meta: (min(m, meta["PROGRAMS_PER_SM"] * programs_cap),),
        x, weight, y, rstd, r_arg, h_arg, *strides, m, n, eps, offset, m.bit_length(),
        dtypes=(x.dtype, weight.dtype, y.dtype), BLOCK_N=WIDE_BLOCK_N, HAS_RESIDUAL=has_residual,
    )  # fmt: skip


def forward_holds_row_on_chip(x: torch.Tensor, y: torch.Tensor, has_residual: bool) -> bool:
    """Whether the held-row forward can serve x: 16-bit rows of SINGLE_TILE_MAX_N < N <=
    HELD_ROW_MAX_N with N a multiple of 8 (the copies move 16-byte vectors), no residual, x and
    y at 16-byte addresses with row strides that divide by 16 elements (Triton marks an integer
    divisible by 16 or not at all, and the copies need the rows' 16-byte alignment proven),
    Gluon present (_held_forward_can_stage), a Hopper-class NVIDIA GPU (_held_row_fits_device)."""
    n = x.shape[1]
    return (
        SINGLE_TILE_MAX_N < n <= HELD_ROW_MAX_N
        and _held_forward_can_stage(x, y, has_residual)
        and _held_row_fits_device(x.device, n)
    )


def _held_forward_can_stage(x: torch.Tensor, y: torch.Tensor, has_residual: bool) -> bool:
    """The held forwards' conditions on the tensors: 16-bit x, N a multiple of 8 (the copies
    move 16-byte vectors), no residual, x's and y's rows on 16 bytes (_rows_on_16_bytes);
    Gluon present, inline PTX runnable (an NVIDIA GPU, not the interpreter)."""
    return (
        gluon_kernels is not None
        and not has_residual
        and x.dtype in (torch.float16, torch.bfloat16)
        and x.shape[1] % 8 == 0
        and _rows_on_16_bytes(x, y)
        and _inline_ptx_runs()
    )


def _held_row_fits_device(device: torch.device, n: int) -> bool:
    """A Hopper-class device (_hopper_class) that gives a program the held row's shared memory
    (the H100 and H200 give 227 KB)."""
    return _hopper_class(device) and _shared_bytes_per_block(
        device.index or 0
    ) >= _held_row_shared_bytes(n)


def _hopper_class(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or later, where the held kernels (Gluon) run;
    they were measured on the H200 only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device.index or 0) >= (9, 0)


def _held_row_shared_chunks(n: int) -> int:
    return cdiv(n - HELD_ROW_REG, HELD_ROW_CHUNK)


def _held_row_shared_bytes(n: int) -> int:
    return _held_row_shared_chunks(n) * HELD_ROW_CHUNK * 2 + HELD_ROW_SCRATCH_BYTES


@functools.cache
def _shared_bytes_per_block(device_index: int) -> int:
    """The most shared memory a program may ask for on this device (0 if torch does not say)."""
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 0)


def _forward_held_row(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    """Rows held on chip (forward_holds_row_on_chip says when): one launch, one program per SM
    walking its rows; a fixed configuration (no tuning)."""
    m, n = x.shape
    config = {"REG": HELD_ROW_REG, "SHARED_CHUNKS": _held_row_shared_chunks(n),
              "CHUNK": HELD_ROW_CHUNK, "WARPS": HELD_ROW_WARPS}  # fmt: skip
    meta = {"N": n, **config, "num_warps": HELD_ROW_WARPS}
    grid = (min(m, _programs_cap(x.device)),)
    args = (x, weight, y, rstd, strides[0], strides[1], m, eps, offset)
    direct.launch(gluon_kernels.rmsnorm_fwd_held_row_kernel, grid, args, meta, x.get_device())
    _LAUNCHED["rmsnorm_fwd_held_row_kernel"] = {**config, "num_warps": HELD_ROW_WARPS}


def held_group_forwards(x, y, weight, has_residual: bool) -> tuple[HeldGroupForward, ...]:
    """The configurations of HELD_GROUP_FORWARDS in which the grouped held-row forward can serve
    x (none, or those that fit the device): rows wider than SINGLE_TILE_MAX_N that the held
    forwards can stage (_held_forward_can_stage; N a multiple of 16 in effect, as y's rows are
    N apart and must start on 16 bytes), a 16-bit w at a 16-byte address (staged by cp.async),
    on a Hopper-class device where every slice of a row has a program slot
    (_held_group_forward_fits_device)."""
    n = x.shape[1]
    if not (
        n > SINGLE_TILE_MAX_N
        and _held_forward_can_stage(x, y, has_residual)
        and weight.dtype in (torch.float16, torch.bfloat16)
        and weight.data_ptr() % 16 == 0
    ):
        return ()
    return tuple(c for c in HELD_GROUP_FORWARDS if _held_group_forward_fits_device(x.device, n, c))


def _held_group_forward_fits_device(device: torch.device, n: int, config: HeldGroupForward) -> bool:
    """A Hopper-class device (_hopper_class) that gives a program its ring and w's slice, with
    a program slot for each of a row's slices (_held_group_forward_programs_per_sm an SM)."""
    if not _hopper_class(device):
        return False
    index = device.index or 0
    slots = _held_group_forward_programs_per_sm(index, config) * _sm_count(index)
    fits_program = _shared_bytes_per_block(index) >= _held_group_forward_shared_bytes(config)
    return fits_program and cdiv(n, config.slice_n) <= slots


def _held_group_forward_shared_bytes(config: HeldGroupForward) -> int:
    """A grouped forward program's shared memory: its ring, w's slice (16-bit) and scratch."""
    return (config.ring + 1) * config.slice_n * 2 + HELD_ROW_SCRATCH_BYTES


@functools.cache
def _held_group_forward_programs_per_sm(device_index: int, config: HeldGroupForward) -> int:
    """config.per_sm, or as many fewer as the SM's shared memory holds (on the H100 and H200,
    228 KB an SM, all that HELD_GROUP_FORWARDS asks)."""
    return _programs_sm_shared_holds(device_index, _held_group_forward_shared_bytes(config),
                                     config.per_sm)  # fmt: skip


def _programs_sm_shared_holds(device_index: int, program_bytes: int, wanted: int) -> int:
    """wanted, or as many fewer programs asking program_bytes of shared memory each as an SM's
    shared memory holds (each with SHARED_BYTES_RESERVED_PER_PROGRAM beside)."""
    per_program = program_bytes + SHARED_BYTES_RESERVED_PER_PROGRAM
    return min(wanted, _shared_bytes_per_sm(device_index) // per_program)


def _shared_bytes_per_sm(device_index: int) -> int:
    """An SM's shared memory on this device, shared by its resident programs (if torch does not
    say, what one program may ask for: room for one)."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
    return per_sm or _shared_bytes_per_block(device_index)


def _forward_held_group(
    x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual, *, config
):
    """Rows shared by a group of programs (held_group_forwards says when), in configuration
    `config`: as many groups as fit _held_group_forward_programs_per_sm programs an SM (the
    registers capped so that they can: _register_cap), in an ordinary launch (any number of them may be resident: gluon_kernels' grouped section), each
    group claiming rows one at a time. Allocates one int64 per (row, slice) and per row, and a
    few more (the exchange and the claims: held_group_exchange)."""
    m, n = x.shape
    group = cdiv(n, config.slice_n)
    per_sm = _held_group_forward_programs_per_sm(x.device.index or 0, config)
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
    direct.launch(gluon_kernels.rmsnorm_fwd_held_group_kernel, (groups * group,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_fwd_held_group_kernel"] = {
        **constexprs, "PROGRAMS_PER_SM": per_sm, "num_warps": config.warps, **cap,
    }  # fmt: skip


def held_group_exchange(
    m: int, group: int, groups: int, chunks: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums, ctrl): the grouped kernels' exchange, one zeroed int64 allocation a launch (one
    memset, which a captured graph replays with the launch): sums, a word per (row, slice);
    ctrl, int32 from the next 16-byte boundary, the ticket and claim counters, a head a group
    and a link a chunk of rows (gluon_kernels' grouped section)."""
    words = m * group
    start = words + words % 2
    ctrl = 2 + groups + chunks  # int32
    buffer = torch.zeros((start + (ctrl + 1) // 2,), dtype=torch.int64, device=device)
    return buffer[:words], buffer[start:].view(torch.int32)[:ctrl]


@functools.cache
def _held_group_forward_path(config: HeldGroupForward):
    """The grouped forward in one configuration: a path of its own (one object a configuration,
    as the measured paths' key holds the paths)."""
    return functools.partial(_forward_held_group, config=config)


def _forward_split(x, weight, y, rstd, r_arg, h_arg, strides, eps, offset, has_residual):
    """Few wide rows: per-chunk sums of squares, then the scaling, one program per (row, chunk).
    Allocates one fp32 per (row, chunk)."""
    m, n = x.shape
    splits = cdiv(n, SPLIT_BLOCK_N)
    partial = torch.empty((m, splits), dtype=torch.float32, device=x.device)
    stride_x, stride_y, stride_r, stride_h = strides
    _launch(
        "rmsnorm_fwd_split_sumsq_kernel", (splits, m), x, r_arg, h_arg, partial,
        stride_x, stride_r, stride_h, n, splits, dtypes=(x.dtype,),
        BLOCK_N=SPLIT_BLOCK_N, HAS_RESIDUAL=has_residual,
    )  # fmt: skip
    normalized, stride_n = (h_arg, stride_h) if has_residual else (x, stride_x)
    _launch(
        "rmsnorm_fwd_split_scale_kernel", (splits, m), normalized, weight, y, rstd, partial,
        stride_n, stride_y, n, splits, eps, offset, dtypes=(x.dtype, weight.dtype, y.dtype),
        BLOCK_N=SPLIT_BLOCK_N, BLOCK_S=next_power_of_2(splits),
    )  # fmt: skip


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
    the first call measures it faster) allocates dx and dw only: its column programs sum dw
    over every row in fp32, in a fixed order.
    """
    offset = float(offset)
    replay_key = None
    if _REPLAYABLE and not dispatch.overridden():
        replay_key = _backward_replay_key(dy, x, weight, rstd, dh_out)
        replayed = _REPLAYS.get(replay_key)
        if replayed is not None and _is_current(replay_key[-1]):
            return _replay_backward(replayed, dy, x, weight, rstd, offset, dh_out)
    _check_runnable(x)
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return dx, torch.zeros_like(weight)
    dh_arg = dy if dh_out is None else dh_out
    dw = torch.empty_like(weight)
    args = (dy, x, weight, rstd, offset, dx, dh_arg, dh_out is not None, dw)
    with _on_device(x):
        if replay_key is not None and not backward_is_looped(n):
            extra = _single_tile_backward_grid(m, x.device, backward_row_period(x, dy, dh_out))
            _record(replay_key, _backward_launches, args, (1, 2), extra)
        else:
            _backward_launches(*args)
    return dx, dw


def _backward_launches(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw) -> None:
    """The backward's kernels for x's width, then the dw partials' reduction into dw. Where
    several paths can serve x (wide rows that fit the held row), a GPU measures them at the
    first call, each with its reduction, and keeps the fastest."""
    args = (dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out, dw)
    m, n = x.shape
    paths = _backward_paths(x, dy, weight, dh_arg if has_dh_out else None)
    dtypes = (x.dtype, weight.dtype, dy.dtype, dh_arg.dtype)
    _dispatch("bwd", dtypes, has_dh_out, n, m, paths, x.device, args)


def _backward_paths(x, dy, weight, dh_out) -> list:
    """The backward paths that can serve x, the default first."""
    if not backward_is_looped(x.shape[1]):
        if backward_takes_two_roles(x, dy, dh_out):
            return [_backward_single_tile, _backward_two_role]
        return [_backward_single_tile]
    groups = [_held_group_backward_path(c) for c in held_group_backwards(x, dy, weight, dh_out)]
    if backward_holds_row_on_chip(x, dy, weight, dh_out):
        return [_backward_wide, *_HELD_ROW_BACKWARDS, *groups]
    return [_backward_wide, *groups]


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
    per_sm = max(DW_REDUCE_BLOCK_N, _previous_power_of_2(n // _programs_cap(device)))
    block_n = min(DW_REDUCE_FEW_ROWS_TILE // block_rows, DW_REDUCE_MAX_BLOCK_N, per_sm)
    if block_n >= DW_REDUCE_WIDE_BLOCK_N:
        return block_rows, block_n, DW_REDUCE_FEW_ROWS_WIDE_WARPS
    return block_rows, block_n, DW_REDUCE_FEW_ROWS_NARROW_WARPS


def _backward_single_tile(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw):
    m, n = x.shape
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
    _launch(
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
    return device.type == "cuda" and 2 * x_and_dy_bytes <= tuning.l2_bytes(device.index or 0)


def two_role_column_tile(block_n: int) -> tuple[int, int, int]:
    """(COL_BLOCK, COL_ROWS, COL_STAGES) of the two-role backward's column programs (rows
    narrower than the table's, which only a test forces onto this path, take its narrowest)."""
    return TWO_ROLE_COLUMN_TILES[max(block_n, min(TWO_ROLE_COLUMN_TILES))]


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
    _launch(
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
    """_row_period of the single-tile backward's rows: x, dy, dh_out (and dx, contiguous)."""
    return _row_period(x.shape[0], x.shape[1], (x, dy) if dh_out is None else (x, dy, dh_out))


def _row_period(m: int, n: int, tensors: tuple) -> int:
    """1 where rows of n elements in these [m, n] tensors start on 16 bytes, or cannot be
    shifted into alignment together; else the PERIOD of the shifted single-tile kernels
    (rmsnorm_fwd_shifted_kernel, rmsnorm_bwd_shifted_kernel), which take them: rows whose
    element offsets r * stride are not multiples of 16 bytes (N odd, say) in every tensor alike,
    outputs made contiguous (stride N) included: every base on 16 bytes, one element size and
    every row stride equal to N modulo the elements in 16 bytes; rows of two 16-byte groups or
    more (narrower rows move few bytes; the kernels' tile must be whole groups)."""
    size = tensors[0].element_size()
    vec = 16 // size
    residue = n % vec
    if (
        residue == 0
        or n < 2 * vec
        or any(t.element_size() != size or t.data_ptr() % 16 for t in tensors)
        or any(t.stride(0) % vec != residue for t in tensors if m > 1)
    ):
        return 1
    return vec // math.gcd(residue, vec)


def _shift_constants(n: int, element_size: int, period: int) -> dict:
    """The shifted kernels' VEC, PERIOD and MAY_WRAP: whether N plus the largest shift (the
    shifts are the multiples of VEC / PERIOD) passes the tile."""
    vec = 16 // element_size
    largest_shift = vec - vec // period
    return {"VEC": vec, "PERIOD": period, "MAY_WRAP": n + largest_shift > block_size(n)}


def backward_holds_storage_form(block_n: int, x_dtype: torch.dtype, dy_dtype: torch.dtype) -> bool:
    """Whether the single-tile backward holds x and dy as loaded between its passes: wide tiles
    with x or dy in a 16-bit dtype (fp32 ones gain nothing: the same code, a second binary), on
    an NVIDIA GPU (the second pass upcasts through inline PTX, which neither the interpreter nor
    ROCm runs)."""
    return (
        block_n >= BACKWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N
        and (x_dtype.itemsize == 2 or dy_dtype.itemsize == 2)
        and _inline_ptx_runs()
    )


def _inline_ptx_runs() -> bool:
    """NVIDIA GPUs run the kernels' inline PTX (kernels._upcast_opaque); neither the
    interpreter nor ROCm does."""
    return not interpreting() and torch.version.hip is None


def _single_tile_backward_grid(m: int, device: torch.device, period: int = 1) -> tuple[int, int]:
    """(programs, rows per program): contiguous chunks of rows, no program without rows. With
    period > 1 (rmsnorm_bwd_shifted_kernel) the chunks are of each residue class of rows modulo
    period, period programs of each chunk index; a class with fewer rows may leave a program
    without rows (it writes zero partials)."""
    class_rows = cdiv(m, period)
    per_class = max(1, min(class_rows, _programs_cap(device) // period))
    rows_per_program = cdiv(class_rows, per_class)
    return period * cdiv(class_rows, rows_per_program), rows_per_program


def _single_tile_backward_args(
    dy, x, weight, rstd, offset, dx, dh_arg, dw_partial, rows_per_program
) -> tuple:
    """rmsnorm_bwd_kernel's arguments before its constexprs (launch and replay share them)."""
    m, n = x.shape
    return (
        x, weight, dy, rstd, dx, dw_partial, dh_arg,
        x.stride(0), dy.stride(0), dx.stride(0), dh_arg.stride(0), m, n, rows_per_program,
        offset, m.bit_length(),
    )  # fmt: skip


def _backward_wide(dy, x, weight, rstd, offset, dx, dh_arg, has_dh_out: bool, dw) -> None:
    """Two steps: each row's mean(g * x_hat) (split across programs when rows are fewer
    than SMs), then column blocks x row groups for dx and the dw partials."""
    m, n = x.shape
    mean_gx = torch.empty((m,), dtype=torch.float32, device=x.device)
    if rows_are_split(m, x.device):
        splits = cdiv(n, SPLIT_BLOCK_N)
        partial = torch.empty((m, splits), dtype=torch.float32, device=x.device)
        _launch(
            "rmsnorm_bwd_split_dot_kernel", (splits, m),
            x, weight, dy, partial, x.stride(0), dy.stride(0), n, splits, offset,
            dtypes=(x.dtype, weight.dtype, dy.dtype), BLOCK_N=SPLIT_BLOCK_N,
        )  # fmt: skip
        _launch_fixed(
            kernels.rmsnorm_bwd_split_finish_kernel, (m,), partial, rstd, mean_gx, n, splits,
            BLOCK_S=next_power_of_2(splits), num_warps=1,
        )  # fmt: skip
    else:
        _launch(
            "rmsnorm_bwd_row_dot_kernel", (m,),
            x, weight, dy, rstd, mean_gx, x.stride(0), dy.stride(0), n, offset,
            dtypes=(x.dtype, weight.dtype, dy.dtype), BLOCK_N=WIDE_BLOCK_N,
        )  # fmt: skip
    col_blocks = cdiv(n, WIDE_BLOCK_N)
    row_groups, rows_per_group = _row_groups(m, col_blocks, x.device)
    dw_partial = torch.empty((row_groups, n), dtype=torch.float32, device=x.device)
    _launch(
        "rmsnorm_bwd_columns_kernel", (col_blocks, row_groups),
        x, weight, dy, rstd, mean_gx, dx, dw_partial, dh_arg,
        x.stride(0), dy.stride(0), dx.stride(0), dh_arg.stride(0), m, n, rows_per_group, offset,
        dtypes=(x.dtype, weight.dtype, dy.dtype, dh_arg.dtype), BLOCK_N=WIDE_BLOCK_N,
        HAS_DH_OUT=has_dh_out,
    )  # fmt: skip
    _reduce_partials(dw_partial, dw)


def held_group_words(group: int, warps: int) -> int:
    """The size of a grouped kernel's tensor of a row's exchanged words (one a member, the rest
    masked): group's next power of two up to 32, which every warp then holds whole (its
    reductions stay within the warp); past 32, at least one a thread (32 x warps), so that no
    warp repeats another's words (gluon_kernels._read_sums says why)."""
    words = next_power_of_2(group)
    return words if words <= 32 else max(words, 32 * warps)


def _group_count(
    m: int, programs_per_group: int, device: torch.device, programs_per_sm: int = 1
) -> int:
    """As many groups of programs_per_group programs as fit programs_per_sm programs an SM, at
    least one and at most m (every group has a row)."""
    return max(1, min(m, programs_per_sm * _programs_cap(device) // programs_per_group))


def _row_groups(
    m: int, programs_per_group: int, device: torch.device, programs_per_sm: int = 1
) -> tuple[int, int]:
    """(groups, rows per group): contiguous chunks of the m rows, one a group (_group_count
    groups at most), none without rows."""
    rows_per_group = cdiv(m, _group_count(m, programs_per_group, device, programs_per_sm))
    return cdiv(m, rows_per_group), rows_per_group


def backward_holds_row_on_chip(x, dy, weight, dh_out) -> bool:
    """Whether the held-row backward can serve these tensors: rows of
    BACKWARD_SINGLE_TILE_MAX_N < N <= HELD_BACKWARD_MAX_N that it can stage
    (_held_backward_can_stage), on a Hopper-class NVIDIA GPU with the shared memory its ring
    needs (_held_row_backward_fits_device)."""
    n = x.shape[1]
    return (
        BACKWARD_SINGLE_TILE_MAX_N < n <= HELD_BACKWARD_MAX_N
        and _held_backward_can_stage(x, dy, weight, dh_out)
        and _held_row_backward_fits_device(x.device, n)
    )


def held_group_backwards(x, dy, weight, dh_out) -> tuple[HeldGroupBackward, ...]:
    """The configurations of HELD_GROUP_BACKWARDS in which the grouped held-row backward can
    serve these tensors: rows wider than HELD_BACKWARD_MAX_N, or at the held row's widths rows
    that fill the configuration's slices whole, that the held backwards can stage
    (_held_backward_can_stage), on a device where the configuration fits
    (_held_group_fits_device). At the held row's widths, with 16384-column slices (v27), it ran
    1.04x the held row at 2048x32768, 1.07-1.13x at 512-1024 rows and tied at 4096-8192; with
    a part-filled last slice (16400-24576 columns) 0.64-0.88x, so no configuration is offered
    where its last slice would be part-filled
    (`probes/2026-11-30-014678a37819-backward-group-at-held-row-widths-ab.txt`); in 8192-column
    slices (v28) 1.08x at 2048x32768, 1.21x at 512x32768, 1.03x at 4096x24576 and 0.99x at
    2048x24576 (`...-db5abee84ea2-backward-group-at-held-row-widths-ab.txt`)."""
    n = x.shape[1]
    if n <= BACKWARD_SINGLE_TILE_MAX_N or not _held_backward_can_stage(x, dy, weight, dh_out):
        return ()
    return tuple(
        c
        for c in HELD_GROUP_BACKWARDS
        if (n > HELD_BACKWARD_MAX_N or n % c.slice_n == 0)
        and _held_group_fits_device(x.device, n, c)
    )


def backward_holds_row_in_group(x, dy, weight, dh_out) -> bool:
    """Whether a grouped held-row backward can serve these tensors past HELD_BACKWARD_MAX_N (in
    a configuration of held_group_backwards)."""
    return x.shape[1] > HELD_BACKWARD_MAX_N and bool(held_group_backwards(x, dy, weight, dh_out))


def _held_backward_can_stage(x, dy, weight, dh_out) -> bool:
    """The held backwards' conditions on the tensors: x, dy and w in 16-bit dtypes, N a multiple
    of 16, x, dy, w, dh_out at 16-byte addresses with row strides that divide by 16 elements
    (the copies move 16-byte vectors, and Triton marks an integer divisible by 16 or not at
    all); Gluon present, inline PTX runnable (an NVIDIA GPU, not the interpreter)."""
    rows = (x, dy) if dh_out is None else (x, dy, dh_out)
    return (
        gluon_kernels is not None
        and all(t.dtype in (torch.float16, torch.bfloat16) for t in (x, dy, weight))
        and x.shape[1] % 16 == 0
        and _rows_on_16_bytes(*rows)
        and weight.data_ptr() % 16 == 0
        and _inline_ptx_runs()
    )


def _rows_on_16_bytes(*tensors: torch.Tensor) -> bool:
    """Every tensor at a 16-byte address with a row stride that divides by 16 elements: what the
    held kernels' 16-byte copies need proven (Triton marks an integer divisible by 16 or not at
    all)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in tensors)


def _held_row_backward_fits_device(device: torch.device, n: int) -> bool:
    """A Hopper-class device (_hopper_class) whose shared memory takes the ring
    (_held_backward_ring)."""
    return _hopper_class(device) and _held_backward_ring(n, device) > 0


def _held_backward_ring(n: int, device: torch.device) -> int:
    """held_backward_ring_slots for the device's shared memory a program."""
    return held_backward_ring_slots(n, _shared_bytes_per_block(device.index or 0))


def held_backward_ring_slots(n: int, shared_bytes: int) -> int:
    """Ring slots of the held-row backward: as many as shared_bytes take beside w (a 16-bit
    chunk each of x and dy a slot), at least a row's chunks; 0 if even those do not fit."""
    chunks = cdiv(n, HELD_BACKWARD_CHUNK)
    free = shared_bytes - chunks * HELD_BACKWARD_CHUNK * 2 - HELD_ROW_SCRATCH_BYTES
    ring = free // (HELD_BACKWARD_CHUNK * 4)
    return ring if ring >= chunks else 0


def _held_group_fits_device(device: torch.device, n: int, config: HeldGroupBackward) -> bool:
    """A Hopper-class device (_hopper_class) that gives a program of the configuration its shared memory (_held_group_backward_programs_per_sm
    at least 1), with no more slices in a row than SMs: a row's exchanged words then stay at one
    a thread or fewer (held_group_words), as in every case the GPU tests ran, and the groups
    always have the program slots (per_sm x SMs) for a row each."""
    if not _hopper_class(device):
        return False
    index = device.index or 0
    fits_program = _held_group_backward_programs_per_sm(index, config) > 0
    return fits_program and cdiv(n, config.slice_n) <= _sm_count(index)


def _held_group_backward_shared_bytes(config: HeldGroupBackward) -> int:
    """A grouped backward program's shared memory: its ring (x and dy, 16-bit), w's slice and
    scratch."""
    return (config.ring * 4 + config.chunks * 2) * config.chunk + HELD_ROW_SCRATCH_BYTES


@functools.cache
def _held_group_backward_programs_per_sm(device_index: int, config: HeldGroupBackward) -> int:
    """config.per_sm, or as many fewer as the SM's shared memory holds (0 if a program's does
    not fit in what a program may ask for)."""
    program_bytes = _held_group_backward_shared_bytes(config)
    if _shared_bytes_per_block(device_index) < program_bytes:
        return 0
    return _programs_sm_shared_holds(device_index, program_bytes, config.per_sm)


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
    per_sm = _held_group_backward_programs_per_sm(x.device.index or 0, config)
    groups = _group_count(m, group, x.device, per_sm)
    rows_per_chunk, chunks = held_group_row_chunks(m, groups, _sm_count(x.device.index or 0))
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
    direct.launch(gluon_kernels.rmsnorm_bwd_held_group_kernel, (groups * group,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_bwd_held_group_kernel"] = {
        **constexprs, "PROGRAMS_PER_SM": per_sm, "num_warps": config.warps, **cap,
    }  # fmt: skip
    _reduce_partials(dw_partial, dw)


def held_group_row_chunks(m: int, groups: int, sms: int) -> tuple[int, int]:
    """(rows a chunk, chunks) of the grouped backward's m rows: about as many chunks as groups,
    or HELD_GROUP_CHUNKS_PER_GROUP times that where the SM count allows (so that groups that
    start late, beside other kernels, leave less behind), never more than m (at least a row
    each) nor, past groups, than sms (the dw partials: at most max(groups, sms) x N fp32);
    fewer where the rows a chunk round up."""
    per_group = max(1, min(HELD_GROUP_CHUNKS_PER_GROUP, sms // max(groups, 1)))
    rows_per_chunk = cdiv(m, min(m, groups * per_group))
    return rows_per_chunk, cdiv(m, rows_per_chunk)


def _register_cap(programs_per_sm: int, warps: int) -> dict:
    """The launch option that lets programs_per_sm programs of `warps` warps share an SM's
    registers (fewer would be resident at once otherwise): a thread's share of REGISTERS_PER_SM,
    rounded down to the hardware's allocation unit of 8 and at most 255 (a thread's limit);
    none for one program."""
    if programs_per_sm <= 1:
        return {}
    share = REGISTERS_PER_SM // (programs_per_sm * warps * 32)
    return {"maxnreg": min(255, share // 8 * 8)}


@functools.cache
def _held_group_backward_path(config: HeldGroupBackward):
    """The grouped backward in one configuration: a path of its own (one object a
    configuration, as the measured paths' key holds the paths)."""
    return functools.partial(_backward_held_group, config=config)


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
    direct.launch(gluon_kernels.rmsnorm_bwd_held_row_kernel, (programs,), args, meta,
                  x.get_device())  # fmt: skip
    _LAUNCHED["rmsnorm_bwd_held_row_kernel"] = {**config, "num_warps": warps}
    _reduce_partials(dw_partial, dw)


#: The held-row backward at each of its warp counts: paths of their own, measured at the first
#: call beside the wide path (16 warps ran 2-10% faster at most shapes, 32 at others).
_HELD_ROW_BACKWARDS = tuple(
    functools.partial(_backward_held_row, warps=warps) for warps in HELD_BACKWARD_WARPS
)


# ---- replays: later calls of a signature skip the Python launch path -------------------------
# Where kernels take a few microseconds the host sets the pace, and on the H200's host most of a
# launcher call went to this module's path: checks, path choice, the tuning lookup, the direct
# launch's key (perf log, "Host: replays"). So a single-tile call records its launches (its first
# call, after any tuning) and later calls with the same replay key repeat them with
# fresh outputs. The key holds everything that decides the launches and their specialization:
# shapes, row strides, dtypes, each input's 16-byte alignment, the device; outputs and scratch are
# new contiguous allocations, as at recording.

#: Per thread, while a call is recorded: each launch, as (kernel, grid, args, meta, device,
#: tuned config or None).
_RECORDING = threading.local()
#: replay key -> (the Replays, their configurations for take_launch_configs, extra values).
_REPLAYS: dict[tuple, tuple] = {}
#: At most this many signatures are recorded (M that changes every call would grow the table
#: without bound); later new signatures take the path above.
REPLAY_CAP = 4096
#: RMSNORM_TRITON_REPLAY=0, set before import, turns replays off (every call then takes the
#: path above). Under the interpreter a replay relaunches through Triton's path (there is no
#: compiled kernel): the CPU tests cover replays' keys, arguments and allocations that way.
_REPLAYABLE = os.environ.get("RMSNORM_TRITON_REPLAY", "1") != "0"


def _forget_replays() -> None:
    """Replays hold the tables' choices of their time: forgotten when the tables change."""
    _REPLAYS.clear()


dispatch.ON_CHANGE.append(_forget_replays)


def _note_launch(kernel, grid, args: tuple, meta: dict, config: dict | None = None) -> None:
    """While a call is recorded, note one of its launches."""
    recording = getattr(_RECORDING, "launches", None)
    if recording is not None:
        recording.append((kernel, grid, args, meta, args[0].get_device(), config))


def _is_current(device_index: int) -> bool:
    """x's device is the current CUDA device (always true for the interpreter's CPU tensors)."""
    return device_index < 0 or torch.cuda.current_device() == device_index


def _record(key: tuple, call, args: tuple, launches: tuple, extra=None) -> None:
    """call(*args), remembering its launches under key when it made one of the expected numbers
    of them and each can be replayed (went direct, or runs under the interpreter). A key already
    known is not recorded again (x on another device than the current one runs here every
    call), nor is one past REPLAY_CAP."""
    if key in _REPLAYS or len(_REPLAYS) >= REPLAY_CAP:
        call(*args)
        return
    outer = getattr(_RECORDING, "launches", None)
    _RECORDING.launches = recorded = []
    generation = dispatch.GENERATION[0]
    try:
        call(*args)
    finally:
        _RECORDING.launches = outer
    if dispatch.GENERATION[0] != generation:
        return  # the call tuned (its launches were the tuning's), or the tables changed
    through_triton = interpreting()
    replays = [direct.replay_of(*launch[:5], through_triton=through_triton) for launch in recorded]
    if len(replays) not in launches or None in replays:
        return
    configs = {launch[0].fn.__name__: launch[5] for launch in recorded if launch[5] is not None}
    _REPLAYS[key] = (replays, configs, extra)


def _forward_replay_key(x, weight, out_dtype) -> tuple:
    return (
        "fwd", x.shape, x.stride(0), x.dtype, weight.dtype, out_dtype,
        x.data_ptr() & 15, weight.data_ptr() & 15, x.is_cuda, x.get_device(),
    )  # fmt: skip


def _replay_forward(replayed: tuple, x, weight, eps, offset, out_dtype):
    (replay,), configs, _ = replayed
    _LAUNCHED.update(configs)
    m, n = x.shape
    y = x.new_empty((m, n)) if out_dtype is None else x.new_empty((m, n), dtype=out_dtype)
    rstd = x.new_empty((m,), dtype=torch.float32)
    stride = x.stride(0)
    strides = (stride, n, stride, stride)
    replay(
        x.get_device(), *_single_tile_forward_args(x, weight, y, rstd, x, x, strides, eps, offset)
    )
    return y, rstd, None


def _backward_replay_key(dy, x, weight, rstd, dh_out) -> tuple:
    dh = None if dh_out is None else (dh_out.dtype, dh_out.stride(0), dh_out.data_ptr() & 15)
    return (
        "bwd", x.shape, x.stride(0), dy.stride(0), x.dtype, weight.dtype, dy.dtype, rstd.dtype,
        dh, x.data_ptr() & 15, weight.data_ptr() & 15, dy.data_ptr() & 15, rstd.data_ptr() & 15,
        x.is_cuda, x.get_device(),
    )  # fmt: skip


def _replay_backward(replayed: tuple, dy, x, weight, rstd, offset, dh_out):
    """The recorded single-tile backward again: two launches (the main kernel and the dw
    reduction), or one (the two-role kernel)."""
    launches, configs, (programs, rows_per_program) = replayed
    _LAUNCHED.update(configs)
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
