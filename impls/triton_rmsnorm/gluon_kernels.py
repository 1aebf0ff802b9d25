"""Kernels in Gluon (triton.experimental.gluon): Triton's lower-level language, with explicit
layouts and shared memory, which Triton's own language does not expose.

Imported only where Gluon is (launch.py falls back without it); launched only on NVIDIA GPUs
(cp.async, inline PTX), never under the interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .kernels import BF16X2_TO_FP32_PTX, FP16X2_TO_FP32_PTX

#: cp.async from a tensor of pointers into a shared buffer: Triton 3.6 calls it
#: async_copy_global_to_shared, later versions async_load (and raise on the old name).
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _upcast_opaque(v):
    """v (bf16 or fp16) to fp32 in inline PTX, which the compiler cannot merge with an earlier
    conversion of v (kernels._upcast_opaque, in Gluon)."""
    if v.dtype == gl.bfloat16:
        out = gl.inline_asm_elementwise(
            BF16X2_TO_FP32_PTX, "=r,=r,r", [v], dtype=gl.float32, is_pure=False, pack=2
        )
    else:
        out = gl.inline_asm_elementwise(
            FP16X2_TO_FP32_PTX, "=r,=r,r", [v], dtype=gl.float32, is_pure=False, pack=2
        )
    return out


@gluon.jit
def _upcast_pairs(v):
    """v (bf16, fp16 or fp32) to fp32, bits unchanged; bf16 in inline PTX, two values a 32-bit
    register, a shift and a mask a pair. Triton's own conversion takes each bf16 value from its
    register and shifts it: in rmsnorm_bwd_held_group_kernel at 1048576 columns 979 SHF, PRMT
    and IMAD against fp16's 44 with 600 HADD2.F32, 5559 SASS lines against 4951; 4983 with the
    pairs (Triton 3.6, sm_90a: `probes/2026-11-30-76541bfb6a7d-upcast-sass-counts.txt`). Pure,
    unlike _upcast_opaque: placed wherever the compiler likes. Where it is used is measured
    (v26, `probes/2026-11-30-b27e0609074b-upcast-pairs-ab*`, bf16, before/after): the held-row
    backward 1.02-1.04x, the grouped forward 1.00-1.03x, the grouped backward 1.01-1.02x at 4-16
    words a row but 0.88x at 64 (64x1048576), the held-row forward 0.92x at 512x131072; so not
    in the last two (_upcast). The grouped backward takes it up to 32 words a row, the tensor
    every warp holds whole (17-32 words, 262145-524288 columns, not measured)."""
    if v.dtype == gl.bfloat16:
        out = gl.inline_asm_elementwise(
            BF16X2_TO_FP32_PTX, "=r,=r,r", [v], dtype=gl.float32, is_pure=True, pack=2
        )
    else:
        out = v.to(gl.float32)
    return out


@gluon.jit
def _upcast(v, PAIRS: gl.constexpr):
    """v to fp32: _upcast_pairs if PAIRS, else Triton's own conversion."""
    return _upcast_pairs(v) if PAIRS else v.to(gl.float32)


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
def _stage_chunk(X_RING, DY_RING, slot, X, DY, stride_x_row, stride_dy_row, row, row_end, cols,
                 N: gl.constexpr):  # fmt: skip
    """One cp.async group: a chunk of a row's x and dy into ring slot `slot` (zeros outside
    the row, and for rows past the program's last, whose group still counts)."""
    mask = (cols < N) & (row < row_end)
    _async_load(X_RING.index(slot), X + row * stride_x_row + cols, mask=mask)
    _async_load(DY_RING.index(slot), DY + row * stride_dy_row + cols, mask=mask)
    async_copy.commit_group()


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
def _backward_chunk(
    X_RING, DY_RING, slot, W_HELD, k, DX, DH_OUT, row, stride_dx_row, stride_dh_row, cols, rstd,
    mean_gx, offset, dw_acc, layout: gl.constexpr, N: gl.constexpr, HAS_DH_OUT: gl.constexpr,
    PAIRS: gl.constexpr,
):  # fmt: skip
    """The second pass over one staged chunk: its dx stored, its dw contribution added to
    dw_acc (returned), from x and dy read again from the ring."""
    in_row = cols < N
    x_hat = _upcast(X_RING.index(slot).load(layout), PAIRS) * rstd
    dy = _upcast(DY_RING.index(slot).load(layout), PAIRS)
    w = _upcast(W_HELD.index(k).load(layout), PAIRS) + offset
    dx = (w * dy - x_hat * mean_gx) * rstd
    if HAS_DH_OUT:
        dx += gl.load(DH_OUT + row * stride_dh_row + cols, mask=in_row, other=0.0).to(gl.float32)
    gl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=in_row)
    return dw_acc + dy * x_hat


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


@gluon.jit
def rmsnorm_bwd_held_group_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT, SUMS,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, rows_per_group, offset,
    tag_offset,
    N: gl.constexpr,  # at most GROUP slices of CHUNKS * CHUNK columns
    GROUP: gl.constexpr,  # programs a row: each owns one slice of its columns
    GROUP_PADDED: gl.constexpr,  # the words' tensor: launch.held_group_words(GROUP, WARPS)
    CHUNK: gl.constexpr,
    CHUNKS: gl.constexpr,  # chunks a slice: 1 or 2 (one dw accumulator in registers each)
    RING: gl.constexpr,  # ring slots, at least 2 * CHUNKS
    HAS_DH_OUT: gl.constexpr,
    WARPS: gl.constexpr,
    SPIN_LIMIT: gl.constexpr,  # a program's polls, all rows together (then it sums rows alone)
):  # fmt: skip
    """RMSNorm backward of 16-bit rows too wide for one SM (and, where the row fills its slices,
    of 24576-32768 columns, beside the held row), x and dy read from HBM once: GROUP
    programs share each row, program `member` of its group owning columns [member * SLICE,
    (member + 1) * SLICE), SLICE = CHUNKS * CHUNK, and doing on its slice what
    rmsnorm_bwd_held_row_kernel does on a row (x and dy staged in a shared-memory ring, w's
    slice staged once, the slice's dw accumulator in registers; a group walks a contiguous chunk
    of rows, its dw partial row in DW_PARTIAL[group]).

    mean(g * x_hat) needs the whole row: the slices' sums are exchanged through SUMS, one word
    a (row, member) carrying the sum and the row's tag (_publish_sum, _read_sums). The first
    pass runs one row ahead: a program publishes row j + 1 before it needs row j (the ring holds
    two rows' slices), so its partners have a pass's time to publish, and it loads row j's words
    before that pass, so the load's round trip overlaps the pass; it loads them again only if a
    partner's is missing. The launch must be cooperative (every program resident at once;
    launch.py). Each warp has SPIN_LIMIT polls for all its rows; a row whose group it finds
    incomplete once they are spent it sums whole from global memory, alone and in another order
    (_read_sums: no barrier where warps may part): never stuck for long, correct, its mean
    possibly apart from its partners' (and its program's other warps') in the last bits. The
    program publishes its own sums all the same, so its partners never wait on it.

    The sequence of staged chunks and its cp.async groups as in rmsnorm_bwd_held_row_kernel, the
    first pass of row j + 1 waiting with RING - 1 - CHUNKS - k later groups allowed pending.
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    UPCAST_PAIRS: gl.constexpr = GROUP_PADDED <= 32  # bf16 in pairs up to 32 words (_upcast_pairs)
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # (_read_sums)
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(CHUNKS <= 2)
    gl.static_assert(RING >= 2 * CHUNKS)
    gl.static_assert(N <= GROUP * CHUNKS * CHUNK)
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, CHUNK], shared_layout)
    dy_ring = gl.allocate_shared_memory(DY.dtype.element_ty, [RING, CHUNK], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [CHUNKS, CHUNK], shared_layout)
    chunk_cols = gl.arange(0, CHUNK, layout=layout)
    pid = gl.program_id(0)
    member = pid % GROUP
    group = pid // GROUP
    slice_start = member * (CHUNKS * CHUNK)
    row_start = group.to(gl.int64) * rows_per_group
    row_end = gl.minimum(row_start + rows_per_group, M)
    for k in gl.static_range(CHUNKS):  # w's slice, once: one group, older than every chunk's
        cols = slice_start + k * CHUNK + chunk_cols
        _async_load(w_held.index(k), W + cols, mask=cols < N)
    async_copy.commit_group()
    for s in gl.static_range(RING):
        _stage_chunk(x_ring, dy_ring, s, X, DY, stride_x_row, stride_dy_row,
                     row_start + s // CHUNKS, row_end,
                     slice_start + (s % CHUNKS) * CHUNK + chunk_cols, N)  # fmt: skip
    # the first row's first pass
    dot = _staged_dot(x_ring, dy_ring, w_held, 0, slice_start, chunk_cols, offset,
                      layout, N, CHUNK, CHUNKS, RING, RING - 1, UPCAST_PAIRS)  # fmt: skip
    _publish_sum(SUMS, row_start, member, dot, GROUP)  # every group has a row
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    gl.static_assert((GROUP_PADDED <= 32) | (GROUP_PADDED >= 32 * WARPS))  # (_read_sums)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    warp_cols = gl.arange(0, 256, layout=layout)  # every warp the same 256 (_read_sums)
    polls = 0  # each warp's own, over all of the program's rows: once spent, no row waits
    for row in range(row_start, row_end):
        j = row - row_start
        first_slot = (j * CHUNKS % RING).to(gl.int32)
        next_slot = ((j + 1) * CHUNKS % RING).to(gl.int32)
        words = _load_sums(SUMS, row, part_ids, GROUP)  # in flight over the next row's pass
        dot = _staged_dot(x_ring, dy_ring, w_held, next_slot, slice_start, chunk_cols, offset,
                          layout, N, CHUNK, CHUNKS, RING, RING - 1 - CHUNKS, UPCAST_PAIRS)  # fmt: skip
        if row + 1 < row_end:
            _publish_sum(SUMS, row + 1, member, dot, GROUP)
        complete, total, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls, GROUP,
                                            SPIN_LIMIT)  # fmt: skip
        if complete == 0:  # partners absent: the whole row from global memory
            total = _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, warp_cols,
                                         offset, N)  # fmt: skip
        rstd = gl.load(RSTD + row)
        mean_gx = total * rstd / N
        for k in gl.static_range(CHUNKS):  # second pass: dx and dw, then restage the slot
            args = (x_ring, dy_ring, w_held, k, first_slot, X, DY, DX, DH_OUT, row, row_end,
                    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, slice_start,
                    chunk_cols, rstd, mean_gx, offset)  # fmt: skip
            if k == 0:
                dw_0 = _second_pass_chunk(
                    *args, dw_0, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
            else:
                dw_1 = _second_pass_chunk(
                    *args, dw_1, layout, N, CHUNK, CHUNKS, RING, HAS_DH_OUT, UPCAST_PAIRS
                )
    async_copy.wait_group(0)
    partial = DW_PARTIAL + group.to(gl.int64) * N + slice_start + chunk_cols
    gl.store(partial, dw_0, mask=slice_start + chunk_cols < N)
    if CHUNKS > 1:
        gl.store(partial + CHUNK, dw_1, mask=slice_start + CHUNK + chunk_cols < N)


@gluon.jit
def _publish_sum(SUMS, row, member, value, GROUP: gl.constexpr):
    """This slice's fp32 sum for the row, published as one 64-bit word: the row's tag (row + 1)
    above the sum's bits, at SUMS[row * GROUP + member], by a relaxed exchange (single-copy
    atomic). A reader that sees the tag has the sum with it and reads nothing else, so neither
    side needs release or acquire ordering. SUMS is zeroed by the caller (no tag is 0)."""
    bits = value.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF
    gl.atomic_xchg(SUMS + row * GROUP + member, bits | ((row + 1) << 32), sem="relaxed",
                   scope="gpu")  # fmt: skip


@gluon.jit
def _load_sums(SUMS, row, part_ids, GROUP: gl.constexpr):
    """The row's GROUP published words (volatile: partners write them while this program runs)."""
    return gl.load(SUMS + row * GROUP + part_ids, mask=part_ids < GROUP, other=0, volatile=True)


@gluon.jit
def _sums_complete(words, row, tag_offset, part_ids, GROUP: gl.constexpr):
    """1 if every member's word carries the row's tag (plus tag_offset: 0, or, in the tests,
    an offset no writer uses, so that no group is ever complete), else 0."""
    tagged = ((words >> 32) == row + 1 + tag_offset) | (part_ids >= GROUP)
    return gl.min(tagged.to(gl.int32), axis=0)


@gluon.jit
def _read_sums(SUMS, words, row, tag_offset, part_ids, polls, GROUP: gl.constexpr,
               SPIN_LIMIT: gl.constexpr):  # fmt: skip
    """(complete, total, polls): words, the row's words as first loaded, loaded again while a
    member's is missing and polls (all the program's rows together) are below SPIN_LIMIT;
    total, the sum of the group's values in one fixed order (every member gets the same bits),
    meaningful when complete is 1.

    part_ids' layout is one element a thread. Up to 32 words (GROUP_PADDED <= 32) every warp
    holds them all: each warp loads, polls, counts its polls and reduces on its own, with no
    barrier, and a warp whose polls ran out may find a row incomplete that another warp of its
    program found complete. That is harmless because the branch a warp then takes, the
    fallback (_row_dot_from_global, _row_sumsq_from_global), has no barrier either: each warp
    reads the whole row alone (a decision shared through shared memory cost a barrier a row:
    4-5% of the backward at 65536-262144 columns). Past 32 words the tensor has at least one
    element a thread (GROUP_PADDED >= 32 x WARPS, the rest masked), so no warp holds another's
    words: each word is loaded once, every reduction here crosses warps through shared memory,
    and every warp gets the same result from the same loads, so they poll as many times and
    decide alike. (Between 32 and 32 x WARPS words some warps would repeat others' words with
    loads of their own, and Triton 3.9's cross-warp step lets repeated warps write the same
    shared slot, the last writer winning: the decision and the sum could then come from
    different loads, one of them before a partner published.)"""
    complete = _sums_complete(words, row, tag_offset, part_ids, GROUP)
    while (complete == 0) & (polls < SPIN_LIMIT):
        words = _load_sums(SUMS, row, part_ids, GROUP)
        complete = _sums_complete(words, row, tag_offset, part_ids, GROUP)
        polls += 1
    values = (words & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
    return complete, gl.sum(gl.where(part_ids < GROUP, values, 0.0), axis=0), polls


@gluon.jit
def _row_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, warp_cols, offset,
                         N: gl.constexpr):  # fmt: skip
    """The whole row's sum of w * dy * x, read from global memory by each warp alone (the
    group's fallback): warp_cols, 256 columns that every warp holds whole, so the sums need no
    barrier (_read_sums); summed in fp64 (a warp's many short steps would otherwise round more
    than the exchange's two-level sum), rounded to fp32 once."""
    dot = gl.zeros([], gl.float64)
    for start in range(0, N, warp_cols.shape[0]):
        cols = start + warp_cols
        mask = cols < N
        w = gl.load(W + cols, mask=mask, other=0.0).to(gl.float32) + offset
        x = gl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(gl.float32)
        dy = gl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(gl.float32)
        dot += gl.sum(gl.where(mask, w * dy * x, 0.0).to(gl.float64), axis=0)
    return dot.to(gl.float32)


@gluon.jit
def _stage_slice(X_RING, slot, X, stride_x_row, row, row_end, cols, N: gl.constexpr):
    """One cp.async group: a row's slice of x into ring slot `slot` (zeros outside the row, and
    for rows past the program's last, whose group still counts)."""
    _async_load(
        X_RING.index(slot), X + row * stride_x_row + cols, mask=(cols < N) & (row < row_end)
    )
    async_copy.commit_group()


@gluon.jit
def _staged_sumsq(X_RING, slot, cols, layout: gl.constexpr, N: gl.constexpr,
                  PENDING: gl.constexpr):  # fmt: skip
    """The sum of squares of the slice in ring slot `slot`, once at most PENDING later cp.async
    groups are still in flight."""
    async_copy.wait_group(PENDING)
    x = _upcast_pairs(X_RING.index(slot).load(layout))
    return gl.sum(gl.where(cols < N, x * x, 0.0), axis=0)


@gluon.jit
def _row_sumsq_from_global(X, row, stride_x_row, warp_cols, N: gl.constexpr):
    """The whole row's sum of squares, read from global memory by each warp alone (the group's
    fallback; as _row_dot_from_global, in fp64)."""
    total = gl.zeros([], gl.float64)
    for start in range(0, N, warp_cols.shape[0]):
        cols = start + warp_cols
        x = gl.load(X + row * stride_x_row + cols, mask=cols < N, other=0.0).to(gl.float32)
        total += gl.sum((x * x).to(gl.float64), axis=0)
    return total.to(gl.float32)


@gluon.jit
def rmsnorm_fwd_held_group_kernel(
    X, W, Y, RSTD, SUMS, stride_x_row, stride_y_row, M, eps, offset, tag_offset,
    N: gl.constexpr,  # at most GROUP slices of SLICE columns
    GROUP: gl.constexpr,  # programs a row: each owns one slice of its columns
    GROUP_PADDED: gl.constexpr,  # the words' tensor: launch.held_group_words(GROUP, WARPS)
    SLICE: gl.constexpr,  # columns a program owns (and a ring slot holds)
    RING: gl.constexpr,  # ring slots: this row's slice, the next row's, and more
    WARPS: gl.constexpr,  # the launch's num_warps (the layout needs it as a constant)
    SPIN_LIMIT: gl.constexpr,  # a program's polls, all rows together (then it sums rows alone)
):  # fmt: skip
    """RMSNorm forward of 16-bit rows too wide for one SM, read from HBM once: GROUP programs
    share each row, program `member` of its group owning columns [member * SLICE, (member + 1)
    * SLICE); its slice of each row staged in a shared-memory ring (cp.async, one group a slot,
    restaged with its group's row RING rows on once its y is written), w's slice staged once.
    The rows are dealt out in turn: group g of G takes rows g, g + G, g + 2G, ..., so the rows
    in flight at once are neighbours (1.01-1.07x contiguous chunks of rows, which put them all
    over the input: `probes/2026-11-30-d1891c3c1f47-held-group-row-order-ab.txt`).

    The sum of squares needs the whole row: the exchange of rmsnorm_bwd_held_group_kernel (one
    word a slice through SUMS, tagged with its row; _publish_sum, _read_sums). A program
    publishes its group's next row before it needs this one, so its partners have a row's time
    to publish, and loads this row's words before that, then sums the group's values in one
    fixed order (every member gets the same bits; member 0 stores rstd) and writes its slice of
    y. The launch must
    be cooperative (every program resident at once; launch.py). Each warp has SPIN_LIMIT polls
    for all its rows; a row whose group it finds incomplete once they are spent it sums whole
    from global memory, alone (_read_sums; another order: its rstd possibly apart from its
    partners' and its program's other warps' in the last bits), and the program publishes its
    own sums all the same.

    Before the loop the first row's slice is waited for with RING - 1 later groups allowed
    pending; in the loop the next row's with RING - 2 (a slot is restaged, one group, after its
    y is written). Each thread reads back only the shared elements its own copies wrote (one
    layout for both), so waiting on its own groups is enough. Same formula as
    rmsnorm_fwd_kernel: rstd = 1 / sqrt_rn(sum(x^2) / N + eps) in fp32, y = x * rstd * (w +
    offset) rounded once; the sum is ordered differently (slice by slice).
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # (_read_sums)
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(RING >= 2)
    gl.static_assert(N <= GROUP * SLICE)
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, SLICE], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [SLICE], shared_layout)
    pid = gl.program_id(0)
    member = pid % GROUP
    group = pid // GROUP
    slice_cols = gl.arange(0, SLICE, layout=layout)
    cols = member * SLICE + slice_cols
    in_row = cols < N
    groups = gl.num_programs(0) // GROUP  # at most M: every group has a row
    row_start = group.to(gl.int64)
    _async_load(w_held, W + cols, mask=in_row)  # w's slice, once: the oldest group
    async_copy.commit_group()
    for s in gl.static_range(RING):
        _stage_slice(x_ring, s, X, stride_x_row, row_start + s * groups, M, cols, N)
    sumsq = _staged_sumsq(x_ring, 0, cols, layout, N, RING - 1)
    _publish_sum(SUMS, row_start, member, sumsq, GROUP)  # every group has a row
    gl.static_assert((GROUP_PADDED <= 32) | (GROUP_PADDED >= 32 * WARPS))  # (_read_sums)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    warp_cols = gl.arange(0, 256, layout=layout)  # every warp the same 256 (_read_sums)
    polls = 0  # each warp's own, over all of the program's rows: once spent, no row waits
    for row in range(row_start, M, groups):
        j = (row - row_start) // groups
        slot = (j % RING).to(gl.int32)
        words = _load_sums(SUMS, row, part_ids, GROUP)  # in flight over the next row's sum
        sumsq = _staged_sumsq(x_ring, ((j + 1) % RING).to(gl.int32), cols, layout, N, RING - 2)
        if row + groups < M:
            _publish_sum(SUMS, row + groups, member, sumsq, GROUP)
        complete, total, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls, GROUP,
                                            SPIN_LIMIT)  # fmt: skip
        if complete == 0:  # partners absent: the whole row from global memory
            total = _row_sumsq_from_global(X, row, stride_x_row, warp_cols, N)
        rstd = 1.0 / gl.sqrt_rn(total / N + eps)
        if member == 0:
            gl.store(RSTD + row, rstd)
        x = _upcast_pairs(x_ring.index(slot).load(layout))
        w = _upcast_pairs(w_held.load(layout)) + offset
        gl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=in_row)
        _stage_slice(x_ring, slot, X, stride_x_row, row + RING * groups, M, cols, N)
    async_copy.wait_group(0)  # the last (masked) copies land before the program ends
