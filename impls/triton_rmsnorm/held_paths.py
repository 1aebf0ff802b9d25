"""The held paths (Gluon, gluon_kernels.py): their constants and configurations, and whether
each can serve a call (the tensors' conditions and what the device gives). Their launches are in
held_launch.py."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import backward_launch, common, forward_launch
from .common import cdiv, next_power_of_2

try:  # Triton's lower-level language; the held-row forward needs it
    from . import gluon_kernels
except ImportError:
    gluon_kernels = None

#: The held-row forward (gluon_kernels.rmsnorm_fwd_held_row_kernel): a row's first HELD_ROW_REG
#: elements in registers, the rest in shared buffers of HELD_ROW_CHUNK, at most
#: HELD_ROW_SHARED_CHUNKS (192 KB of 16-bit elements), HELD_ROW_WARPS warps, one program per SM.
#: x is read once: faster than the looped forward at these widths (docs/design.md, Forward).
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
#: forward_launch.SINGLE_TILE_MAX_N: a group of programs shares each row, each holding a slice, in an ordinary
#: launch (programs join groups in start order and claim rows: gluon_group_exchange.py's docstring);
#: the slices' sums exchanged as the grouped backward's. Each configuration here that
#: fits the device is a path of its own, offered beside the looped or split path and, up to
#: HELD_ROW_MAX_N, the held row; below 65537 columns every configuration trailed the single tile
#: (docs/design.md, Forward).
HELD_GROUP_FORWARDS = (
    HeldGroupForward(slice_n=4096, ring=3, per_sm=6, warps=4),
    HeldGroupForward(slice_n=8192, ring=2, per_sm=4, warps=8),
)
#: Shared memory an SM keeps for each resident program beyond what the program asks for.
SHARED_BYTES_RESERVED_PER_PROGRAM = 1024
#: The held-row backward (gluon_kernels.rmsnorm_bwd_held_row_kernel): a row's x and dy staged
#: whole in a shared-memory ring of HELD_BACKWARD_CHUNK-column slots (as many as fit, at least a
#: row's), w in shared memory, the program's dw accumulator in registers (one variable a chunk,
#: HELD_BACKWARD_MAX_CHUNKS at most), one program per SM, 16 or 32 warps, offered beside the wide
#: path: x and dy are read once, faster at many rows, slower at few (docs/design.md, Backward).
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
#: configuration here that fits the device is a path of its own, offered beside the wide path.
#: At 2 an SM the registers are capped at 128 (REGISTERS_PER_SM over 2 x 8 warps), which ptxas
#: met without spilling at 24576-1048576 columns (docs/design.md, Backward). A row's programs
#: are at most the SM count in either (_held_group_fits_device).
HELD_GROUP_BACKWARDS = (
    HeldGroupBackward(chunk=4096, chunks=2, ring=5, per_sm=2, warps=8),
    HeldGroupBackward(chunk=8192, chunks=2, ring=5, per_sm=1, warps=8),
)
#: 32-bit registers an SM on the Hopper-class GPUs the Gluon kernels run on.
REGISTERS_PER_SM = 65536
#: Chunks of rows a group of the grouped backward takes in a call, where the SM count allows
#: (held_group_row_chunks): groups that start late (beside a kernel on another stream) then
#: leave at most a quarter of a group's rows to the others.
HELD_GROUP_CHUNKS_PER_GROUP = 4


def forward_holds_row_on_chip(x: torch.Tensor, y: torch.Tensor, has_residual: bool) -> bool:
    """Whether the held-row forward can serve x: 16-bit rows of forward_launch.SINGLE_TILE_MAX_N < N <=
    HELD_ROW_MAX_N with N a multiple of 8 (the copies move 16-byte vectors), no residual, x and
    y at 16-byte addresses with row strides that divide by 16 elements (Triton marks an integer
    divisible by 16 or not at all, and the copies need the rows' 16-byte alignment proven),
    Gluon present (_held_forward_can_stage), a Hopper-class NVIDIA GPU (_held_row_fits_device)."""
    n = x.shape[1]
    return (
        forward_launch.SINGLE_TILE_MAX_N < n <= HELD_ROW_MAX_N
        and _held_forward_can_stage(x, y, has_residual)
        and _held_row_fits_device(x.device, n)
    )


def _held_forward_can_stage(x: torch.Tensor, y: torch.Tensor, has_residual: bool) -> bool:
    """The held forwards' conditions on the tensors (held_forward_staging)."""
    return all(holds() for holds, _why in held_forward_staging(x, y, has_residual))


def held_forward_staging(x: torch.Tensor, y: torch.Tensor, has_residual: bool) -> tuple:
    """The held forwards' conditions on the tensors, in order, each (test, why it fails):
    Gluon present, inline PTX runnable (an NVIDIA GPU, not the interpreter), no residual,
    16-bit x, N a multiple of 8 (the copies move 16-byte vectors), x's and y's rows on 16
    bytes (_rows_on_16_bytes). offers.py words the first that fails."""
    return (
        (lambda: gluon_kernels is not None, "Gluon is not available"),
        (common._inline_ptx_runs, "needs an NVIDIA GPU (inline PTX), not the interpreter"),
        (lambda: not has_residual, "no residual add"),
        (lambda: x.dtype in (torch.float16, torch.bfloat16), "16-bit x only"),
        (lambda: x.shape[1] % 8 == 0, "N a multiple of 8 only"),
        (lambda: _rows_on_16_bytes(x, y), "x's and y's rows must start on 16 bytes"),
    )  # fmt: skip


def _held_row_fits_device(device: torch.device, n: int) -> bool:
    """A Hopper-class device (common._hopper_class) that gives a program the held row's shared memory
    (the H100 and H200 give 227 KB)."""
    return common._hopper_class(device) and common._shared_bytes_per_block(
        device.index or 0
    ) >= _held_row_shared_bytes(n)


def _held_row_shared_chunks(n: int) -> int:
    return cdiv(n - HELD_ROW_REG, HELD_ROW_CHUNK)


def _held_row_shared_bytes(n: int) -> int:
    return _held_row_shared_chunks(n) * HELD_ROW_CHUNK * 2 + HELD_ROW_SCRATCH_BYTES


def held_group_forwards(x, y, weight, has_residual: bool) -> tuple[HeldGroupForward, ...]:
    """The configurations of HELD_GROUP_FORWARDS in which the grouped held-row forward can serve
    x (none, or those that fit the device): rows wider than forward_launch.SINGLE_TILE_MAX_N that the held
    forwards can stage (_held_forward_can_stage; N a multiple of 16 in effect, as y's rows are
    N apart and must start on 16 bytes), a 16-bit w at a 16-byte address (staged by cp.async),
    on a Hopper-class device where every slice of a row has a program slot
    (_held_group_forward_fits_device)."""
    n = x.shape[1]
    if not (
        n > forward_launch.SINGLE_TILE_MAX_N
        and _held_forward_can_stage(x, y, has_residual)
        and weight.dtype in (torch.float16, torch.bfloat16)
        and weight.data_ptr() % 16 == 0
    ):
        return ()
    return tuple(c for c in HELD_GROUP_FORWARDS if _held_group_forward_fits_device(x.device, n, c))


def _held_group_forward_fits_device(device: torch.device, n: int, config: HeldGroupForward) -> bool:
    """A Hopper-class device (common._hopper_class) that gives a program its ring and w's slice, with
    a program slot for each of a row's slices (_held_group_forward_programs_per_sm an SM)."""
    if not common._hopper_class(device):
        return False
    index = device.index or 0
    slots = _held_group_forward_programs_per_sm(index, config) * common._sm_count(index)
    fits_program = common._shared_bytes_per_block(index) >= _held_group_forward_shared_bytes(config)
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
    return min(wanted, common._shared_bytes_per_sm(device_index) // per_program)


def held_group_exchange(
    m: int, group: int, groups: int, chunks: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums, ctrl): the grouped kernels' exchange, one zeroed int64 allocation a launch (one
    memset, which a captured graph replays with the launch): sums, a word per (row, slice);
    ctrl, int32 from the next 16-byte boundary, the ticket and claim counters, a head a group
    and a link a chunk of rows (gluon_group_exchange.py's docstring)."""
    words = m * group
    start = words + words % 2
    ctrl = 2 + groups + chunks  # int32
    buffer = torch.zeros((start + (ctrl + 1) // 2,), dtype=torch.int64, device=device)
    return buffer[:words], buffer[start:].view(torch.int32)[:ctrl]


def held_group_words(group: int, warps: int) -> int:
    """The size of a grouped kernel's tensor of a row's exchanged words (one a member, the rest
    masked): group's next power of two up to 32, which every warp then holds whole (its
    reductions stay within the warp); past 32, at least one a thread (32 x warps), so that no
    warp repeats another's words (gluon_group_exchange._read_sums says why)."""
    words = next_power_of_2(group)
    return words if words <= 32 else max(words, 32 * warps)


def backward_holds_row_on_chip(x, dy, weight, dh_out) -> bool:
    """Whether the held-row backward can serve these tensors: rows of
    backward_launch.BACKWARD_SINGLE_TILE_MAX_N < N <= HELD_BACKWARD_MAX_N that it can stage
    (_held_backward_can_stage), on a Hopper-class NVIDIA GPU with the shared memory its ring
    needs (_held_row_backward_fits_device)."""
    n = x.shape[1]
    return (
        backward_launch.BACKWARD_SINGLE_TILE_MAX_N < n <= HELD_BACKWARD_MAX_N
        and _held_backward_can_stage(x, dy, weight, dh_out)
        and _held_row_backward_fits_device(x.device, n)
    )


def held_group_backwards(x, dy, weight, dh_out) -> tuple[HeldGroupBackward, ...]:
    """The configurations of HELD_GROUP_BACKWARDS in which the grouped held-row backward can
    serve these tensors: rows wider than HELD_BACKWARD_MAX_N, or at the held row's widths rows
    that fill the configuration's slices whole, that the held backwards can stage
    (_held_backward_can_stage), on a device where the configuration fits
    (_held_group_fits_device). No configuration is offered where its last slice would be
    part-filled: that ran slower than the held row (docs/design.md, Backward)."""
    n = x.shape[1]
    if n <= backward_launch.BACKWARD_SINGLE_TILE_MAX_N or not _held_backward_can_stage(
        x, dy, weight, dh_out
    ):
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
        and common._inline_ptx_runs()
    )


def _rows_on_16_bytes(*tensors: torch.Tensor) -> bool:
    """Every tensor at a 16-byte address with a row stride that divides by 16 elements: what the
    held kernels' 16-byte copies need proven (Triton marks an integer divisible by 16 or not at
    all)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in tensors)


def _held_row_backward_fits_device(device: torch.device, n: int) -> bool:
    """A Hopper-class device (common._hopper_class) whose shared memory takes the ring
    (_held_backward_ring)."""
    return common._hopper_class(device) and _held_backward_ring(n, device) > 0


def _held_backward_ring(n: int, device: torch.device) -> int:
    """held_backward_ring_slots for the device's shared memory a program."""
    return held_backward_ring_slots(n, common._shared_bytes_per_block(device.index or 0))


def held_backward_ring_slots(n: int, shared_bytes: int) -> int:
    """Ring slots of the held-row backward: as many as shared_bytes take beside w (a 16-bit
    chunk each of x and dy a slot), at least a row's chunks; 0 if even those do not fit."""
    chunks = cdiv(n, HELD_BACKWARD_CHUNK)
    free = shared_bytes - chunks * HELD_BACKWARD_CHUNK * 2 - HELD_ROW_SCRATCH_BYTES
    ring = free // (HELD_BACKWARD_CHUNK * 4)
    return ring if ring >= chunks else 0


def _held_group_fits_device(device: torch.device, n: int, config: HeldGroupBackward) -> bool:
    """A Hopper-class device (common._hopper_class) that gives a program of the configuration its shared memory (_held_group_backward_programs_per_sm
    at least 1), with no more slices in a row than SMs: a row's exchanged words then stay at one
    a thread or fewer (held_group_words), as in every case the GPU tests ran, and the groups
    always have the program slots (per_sm x SMs) for a row each."""
    if not common._hopper_class(device):
        return False
    index = device.index or 0
    fits_program = _held_group_backward_programs_per_sm(index, config) > 0
    return fits_program and cdiv(n, config.slice_n) <= common._sm_count(index)


def _held_group_backward_shared_bytes(config: HeldGroupBackward) -> int:
    """A grouped backward program's shared memory: its ring (x and dy, 16-bit), w's slice and
    scratch."""
    return (config.ring * 4 + config.chunks * 2) * config.chunk + HELD_ROW_SCRATCH_BYTES


@functools.cache
def _held_group_backward_programs_per_sm(device_index: int, config: HeldGroupBackward) -> int:
    """config.per_sm, or as many fewer as the SM's shared memory holds (0 if a program's does
    not fit in what a program may ask for)."""
    program_bytes = _held_group_backward_shared_bytes(config)
    if common._shared_bytes_per_block(device_index) < program_bytes:
        return 0
    return _programs_sm_shared_holds(device_index, program_bytes, config.per_sm)


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


#: Both answer from the shared memory and SM count: forgotten when a pretend_device block opens.
common.FACT_CACHES += [_held_group_forward_programs_per_sm, _held_group_backward_programs_per_sm]
