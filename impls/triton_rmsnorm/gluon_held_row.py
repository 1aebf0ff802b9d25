"""The held-row kernels in Gluon: one program holds each 16-bit row on chip and reads it from
global memory once: the forward in registers and shared memory (w read per row), the backward
x and dy staged in a shared-memory ring with w held there too (held_paths.py offers them)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .gluon_common import _async_load, _backward_chunk, _stage_chunk, _upcast, _upcast_opaque


@gluon.jit
def rmsnorm_fwd_held_row_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, eps, offset,
    N: gl.constexpr,  # REG < N <= REG + SHARED_CHUNKS * CHUNK
    REG: gl.constexpr,  # a row's first REG elements are held in registers
    SHARED_CHUNKS: gl.constexpr,  # the rest in shared memory, CHUNK elements a buffer
    CHUNK: gl.constexpr,
    WARPS: gl.constexpr,  # the launch's num_warps (the layout needs it as a constant)
):  # fmt: skip
    """RMSNorm forward of 16-bit rows too wide for the register file, read from HBM once: each
    row held on one SM, REG elements in registers (as loaded, 16-bit) and the rest in shared
    memory (cp.async). Persistent, one program per SM: while it writes a row's y it already
    loads its next row, the register part once that part's y is written, each shared buffer
    once its y is written (one cp.async group a buffer, waited for in order). Each thread reads
    back only the shared elements its own copies wrote (the same layout for both), so waiting
    on its own groups is enough.

    Same formula as rmsnorm_fwd_kernel: rstd = 1 / sqrt_rn(sum(x^2) / N + eps) in fp32, y = x *
    rstd * (w + offset) rounded once; the sum of squares is ordered differently (registers
    first, then each buffer), so rstd may differ from the single tile's in its last bits.
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(REG < N)
    gl.static_assert(N <= REG + SHARED_CHUNKS * CHUNK)
    reg_cols = gl.arange(0, REG, layout=layout)
    chunk_cols = gl.arange(0, CHUNK, layout=layout)
    held = gl.allocate_shared_memory(X.dtype.element_ty, [SHARED_CHUNKS, CHUNK], shared_layout)
    first = gl.program_id(0).to(gl.int64)  # the grid is at most M: every program has a row
    programs = gl.num_programs(0)
    x_first = X + first * stride_x_row
    for c in gl.static_range(SHARED_CHUNKS):
        cols = REG + c * CHUNK + chunk_cols
        _async_load(held.index(c), x_first + cols, mask=cols < N)  # masked: zero-filled
        async_copy.commit_group()
    x_reg = gl.load(x_first + reg_cols)
    for row in range(first, M, programs):
        x32 = x_reg.to(gl.float32)
        acc = gl.sum(x32 * x32, axis=0)
        for c in gl.static_range(SHARED_CHUNKS):
            async_copy.wait_group(SHARED_CHUNKS - 1 - c)  # buffers 0..c have landed
            xs = held.index(c).load(layout).to(gl.float32)
            xs = gl.where(REG + c * CHUNK + chunk_cols < N, xs, 0.0)  # not only the copy's zeros
            acc += gl.sum(xs * xs, axis=0)
        rstd = 1.0 / gl.sqrt_rn(acc / N + eps)
        y_row = Y + row * stride_y_row
        w = gl.load(W + reg_cols).to(gl.float32) + offset
        gl.store(y_row + reg_cols, (_upcast_opaque(x_reg) * rstd * w).to(Y.dtype.element_ty))
        following = row + programs
        more = following < M
        x_next = X + following * stride_x_row
        x_reg = gl.load(x_next + reg_cols, mask=(reg_cols < REG) & more)
        for c in gl.static_range(SHARED_CHUNKS):
            cols = REG + c * CHUNK + chunk_cols
            in_row = cols < N
            xs = held.index(c).load(layout).to(gl.float32)
            w = gl.load(W + cols, mask=in_row, other=0.0).to(gl.float32) + offset
            gl.store(y_row + cols, (xs * rstd * w).to(Y.dtype.element_ty), mask=in_row)
            _async_load(held.index(c), x_next + cols, mask=in_row & more)
            async_copy.commit_group()
        gl.store(RSTD + row, rstd)
    async_copy.wait_group(0)  # the last row's (masked) copies land before the program ends


@gluon.jit
def _staged_dot(X_RING, DY_RING, W_HELD, first_slot, col_start, chunk_cols, offset,
                layout: gl.constexpr, N: gl.constexpr, CHUNK: gl.constexpr,
                CHUNKS: gl.constexpr, RING: gl.constexpr, WAIT_BASE: gl.constexpr,
                PAIRS: gl.constexpr):  # fmt: skip
    """The first pass over a row's staged chunks (columns col_start on, from ring slot
    first_slot on): the sum of w * dy * x, chunk by chunk, waiting before chunk k until at most
    WAIT_BASE - k later cp.async groups are pending (upcasts: _upcast)."""
    dot = 0.0
    for k in gl.static_range(CHUNKS):
        async_copy.wait_group(WAIT_BASE - k)
        slot = (first_slot + k) % RING
        cols = col_start + k * CHUNK + chunk_cols
        w = _upcast(W_HELD.index(k).load(layout), PAIRS) + offset
        x = _upcast(X_RING.index(slot).load(layout), PAIRS)
        dy = _upcast(DY_RING.index(slot).load(layout), PAIRS)
        dot += gl.sum(gl.where(cols < N, w * dy * x, 0.0), axis=0)
    return dot


@gluon.jit
def _second_pass_chunk(
    X_RING, DY_RING, W_HELD, k, first_slot, X, DY, DX, DH_OUT, row, row_end, stride_x_row,
    stride_dy_row, stride_dx_row, stride_dh_row, col_start, chunk_cols, rstd, mean_gx, offset,
    dw_acc, layout: gl.constexpr, N: gl.constexpr, CHUNK: gl.constexpr, CHUNKS: gl.constexpr,
    RING: gl.constexpr, HAS_DH_OUT: gl.constexpr, PAIRS: gl.constexpr,
):  # fmt: skip
    """The second pass over chunk k of a row's staged chunks (columns col_start on): dx and dw
    (_backward_chunk, dw_acc returned), then its slot restaged with the chunk RING places later
    in the sequence (chunk (k + RING) % CHUNKS of the row (k + RING) // CHUNKS rows on)."""
    slot = (first_slot + k) % RING
    dw_acc = _backward_chunk(X_RING, DY_RING, slot, W_HELD, k, DX, DH_OUT, row, stride_dx_row,
                             stride_dh_row, col_start + k * CHUNK + chunk_cols, rstd, mean_gx,
                             offset, dw_acc, layout, N, HAS_DH_OUT, PAIRS)  # fmt: skip
    _stage_chunk(X_RING, DY_RING, slot, X, DY, stride_x_row, stride_dy_row,
                 row + (k + RING) // CHUNKS, row_end,
                 col_start + ((k + RING) % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    return dw_acc


@gluon.jit
def rmsnorm_bwd_held_row_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, rows_per_program, offset,
    N: gl.constexpr,  # (CHUNKS - 1) * CHUNK < N <= CHUNKS * CHUNK
    CHUNK: gl.constexpr,  # columns a ring slot holds
    CHUNKS: gl.constexpr,  # chunks a row: 1 to 4 (one dw accumulator in registers each)
    RING: gl.constexpr,  # ring slots (each a chunk of x and one of dy), at least CHUNKS
    HAS_DH_OUT: gl.constexpr,
    WARPS: gl.constexpr,  # the launch's num_warps (the layout needs it as a constant)
):  # fmt: skip
    """RMSNorm backward of 16-bit rows too wide for the single tile, x and dy read from HBM
    once: each row staged whole in shared memory, a ring of RING chunk slots filled by cp.async,
    while this program's dw accumulator (N fp32) stays in registers, CHUNK columns a variable.

    Each program walks a contiguous chunk of rows, as rmsnorm_bwd_kernel's. The chunks of its
    rows form one sequence s = row * CHUNKS + chunk, chunk s in slot s % RING; chunk s + RING is
    staged as soon as the second pass is done with chunk s, so the next rows' loads are in flight
    while this row computes. One cp.async group a chunk, committed in sequence order: before the
    first pass reads chunk k of a row, at most RING - 1 - k later groups may still be pending.
    Each thread reads back only the shared elements its own copies wrote (one layout for both),
    so waiting on its own groups is enough.

    Same formulas as rmsnorm_bwd_kernel, the sum of g * x_hat taken chunk by chunk (rounded
    differently from the single tile's). w (16-bit) is staged in shared memory once a program.
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    UPCAST_PAIRS: gl.constexpr = True  # bf16 in pairs (_upcast_pairs)
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(CHUNKS <= 4)
    gl.static_assert(RING >= CHUNKS)
    gl.static_assert((CHUNKS - 1) * CHUNK < N)
    gl.static_assert(N <= CHUNKS * CHUNK)
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, CHUNK], shared_layout)
    dy_ring = gl.allocate_shared_memory(DY.dtype.element_ty, [RING, CHUNK], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [CHUNKS, CHUNK], shared_layout)
    chunk_cols = gl.arange(0, CHUNK, layout=layout)
    pid = gl.program_id(0)
    row_start = pid.to(gl.int64) * rows_per_program
    row_end = gl.minimum(row_start + rows_per_program, M)
    for k in gl.static_range(CHUNKS):  # w, once: one group, older than every chunk's
        cols = k * CHUNK + chunk_cols
        _async_load(w_held.index(k), W + cols, mask=cols < N)
    async_copy.commit_group()
    for s in gl.static_range(RING):  # the first RING chunks of the sequence
        _stage_chunk(x_ring, dy_ring, s, X, DY, stride_x_row, stride_dy_row,
                     row_start + s // CHUNKS, row_end, (s % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    dw_2 = gl.zeros([CHUNK], gl.float32, layout)
    dw_3 = gl.zeros([CHUNK], gl.float32, layout)
    for row in range(row_start, row_end):
        first_slot = ((row - row_start) * CHUNKS % RING).to(gl.int32)
        rstd = gl.load(RSTD + row)
        # first pass
        dot = _staged_dot(x_ring, dy_ring, w_held, first_slot, 0, chunk_cols, offset,
                          layout, N, CHUNK, CHUNKS, RING, RING - 1, UPCAST_PAIRS)  # fmt: skip
        mean_gx = dot * rstd / N
        for k in gl.static_range(CHUNKS):  # second pass: dx and dw, then restage the slot
            args = (x_ring, dy_ring, w_held, k, first_slot, X, DY, DX, DH_OUT, row, row_end,
                    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, 0, chunk_cols,
                    rstd, mean_gx, offset)  # fmt: skip
            if k == 0:
                dw_0 = _second_pass_chunk(
                    *args, dw_0, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
            elif k == 1:
                dw_1 = _second_pass_chunk(
                    *args, dw_1, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
            elif k == 2:
                dw_2 = _second_pass_chunk(
                    *args, dw_2, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
            else:
                dw_3 = _second_pass_chunk(
                    *args, dw_3, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
    async_copy.wait_group(0)  # the last (masked) copies land before the program ends
    partial = DW_PARTIAL + pid.to(gl.int64) * N + chunk_cols
    gl.store(partial, dw_0, mask=chunk_cols < N)
    if CHUNKS > 1:
        gl.store(partial + CHUNK, dw_1, mask=CHUNK + chunk_cols < N)
    if CHUNKS > 2:
        gl.store(partial + 2 * CHUNK, dw_2, mask=2 * CHUNK + chunk_cols < N)
    if CHUNKS > 3:
        gl.store(partial + 3 * CHUNK, dw_3, mask=3 * CHUNK + chunk_cols < N)
