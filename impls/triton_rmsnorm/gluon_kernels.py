"""Kernels in Gluon (triton.experimental.gluon): Triton's lower-level language, with explicit
layouts and shared memory, which Triton's own language does not expose.

Imported only where Gluon is (held_paths.py falls back without it); launched only on NVIDIA GPUs
(cp.async, inline PTX), never under the interpreter.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .upcast import BF16X2_TO_FP32_PTX, FP16X2_TO_FP32_PTX

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
    register and shifts it, several instructions a value. Pure, unlike _upcast_opaque: placed
    wherever the compiler likes. Used where it measured faster: the held-row backward, the
    grouped forward and the grouped backward up to 32 words a row (the tensor every warp holds
    whole); not in the held-row forward nor the grouped backward's wider rows, where _upcast
    takes Triton's own conversion (docs/design.md, Gluon upcast)."""
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


# ---- a group of programs a row --------------------------------------------------------------
#
# The grouped kernels share each row among GROUP programs, each holding one slice of it. Nothing
# about them assumes that every program is resident at once (the launch is an ordinary one):
# - a program's place is its start order, not its program id: a ticket from CTRL[0]
#   (_join_group), group ticket // GROUP, member ticket % GROUP. Every group is then made of
#   programs that started, in order; the only group that can lack members is the one with the
#   latest tickets, and it waits only on programs that start as soon as any earlier one exits.
# - work is taken, not dealt: fixed chunks of rows_per_chunk rows, claimed from CTRL[1] by
#   member 0's first thread and linked for its partners through CTRL (_claim, _link,
#   _following_row), so that every member walks the same rows and groups that start late find
#   less work. Member 0 claims only once its group has all its tickets (or nothing is left to
#   claim, or, the last resort where fewer than GROUP programs can be resident at all, its
#   polls are spent: _wait_for_group).
# - the bits of a row do not depend on who computes its sums: a slice's sum is taken line by
#   line (256 columns, within one warp) and then over its lines in one fixed order in every
#   thread (_lines_total); a program whose partners' words do not come recomputes every
#   slice's sum from global memory by the same code (_slice_sumsq_from_global,
#   _slice_dot_from_global), and the group's total is the same fixed-order sum either way.
#
# CTRL (int32, zeroed by the caller for each launch): [0] tickets, [1] chunks claimed,
# [2 + g] group g's first chunk + 1 (its head), [2 + groups + c] the chunk its group takes
# after chunk c, + 1 (0: not yet written). Rows past M stand for "none".

#: Positions of a group's row sequence a program keeps (_chain_row): a power of two.
CHAIN = gl.constexpr(8)


@gluon.jit
def _join_group(CTRL, GROUP: gl.constexpr):
    """(group, member) of this program by its start order: a ticket from CTRL[0]."""
    ticket = gl.atomic_add(CTRL, 1, sem="relaxed", scope="gpu").to(gl.int32)
    return ticket // GROUP, ticket % GROUP


@gluon.jit
def _group_forming(CTRL, group, chunks, GROUP: gl.constexpr):
    """Whether member 0 should wait before claiming: some of its group's tickets not yet taken
    while chunks are still unclaimed."""
    tickets = gl.load(CTRL, volatile=True)
    claimed = gl.load(CTRL + 1, volatile=True)
    return (tickets < (group + 1) * GROUP) & (claimed < chunks)


@gluon.jit
def _wait_for_group(CTRL, group, chunks, GROUP: gl.constexpr, SPIN_LIMIT: gl.constexpr):
    """Member 0, before its group's first claim: until every member has its ticket, or every
    chunk is claimed (the group then takes none and ends), or SPIN_LIMIT polls are spent (fewer
    program slots than GROUP: the group goes on with the members it has)."""
    polls = 0
    forming = _group_forming(CTRL, group, chunks, GROUP)
    while forming & (polls < SPIN_LIMIT):
        forming = _group_forming(CTRL, group, chunks, GROUP)
        polls += 1


@gluon.jit
def _claim(CTRL, count, mask, lane_zero):
    """count chunks claimed from CTRL[1] by the thread that mask selects (the first of member
    0): the first one's index, meaningful in that thread (no barrier: the others learn it
    through the link, _link and _read_link)."""
    counts = lane_zero + count
    return gl.atomic_add(CTRL + 1 + lane_zero, counts, mask=mask, sem="relaxed", scope="gpu")


@gluon.jit
def _link(LINK, chunk, mask):
    """Publishes a claimed chunk (chunk + 1) at LINK, by the claiming thread: single-copy
    atomic, as the sums (the readers need nothing else from the writer)."""
    gl.atomic_xchg(LINK, chunk + 1, mask=mask, sem="relaxed", scope="gpu")


@gluon.jit
def _read_link(LINK):
    """The chunk published at LINK, polled until written. Its writer, member 0, started before
    any partner (tickets) and writes every link a program reads before it waits on anything of
    theirs, so this always ends."""
    v = gl.load(LINK, volatile=True)
    while v == 0:
        v = gl.load(LINK, volatile=True)
    return v - 1


@gluon.jit
def _chain_row(chain, chain_ids, position):
    """The row at a position of the group's row sequence (chain: the positions kept, by
    position % CHAIN, every thread holding all of them)."""
    return gl.sum(gl.where(chain_ids == position % CHAIN, chain, 0), axis=0).to(gl.int64)


@gluon.jit
def _following_row(newest, batch_end, v, needs, LINK, rows_per_chunk, chunks, M):
    """(row, batch_end) of the position after the newest known one: the next row of its chunks
    (batch_end: the row after the newest's claimed chunks), else, at their end (needs), the
    first row of the chunk linked there (v: that link as first loaded, polled again while
    unwritten), M past the last chunk or the last row."""
    while needs & (v == 0):
        v = gl.load(LINK, volatile=True)
    chunk = v - 1
    linked = gl.where(chunk < chunks, chunk * rows_per_chunk, M)
    row = gl.where(needs, linked.to(gl.int64), gl.where(newest + 1 < M, newest + 1, M))
    end = gl.where(needs, gl.minimum((chunk + 1) * rows_per_chunk, M).to(gl.int64), batch_end)
    return row, end


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
    """(complete, values, polls): words, the row's words as first loaded, loaded again while a
    member's is missing and polls (all the program's rows together) are below SPIN_LIMIT;
    values, the members' sums (meaningful when complete is 1), one a word.

    part_ids' layout is one element a thread. Up to 32 words (GROUP_PADDED <= 32) every warp
    holds them all: each warp loads, polls, counts its polls and reduces on its own, with no
    barrier, and a warp whose polls ran out may find a row incomplete that another warp of its
    program found complete. That is harmless: the branch a warp then takes, the fallback
    (_slice_sumsq_from_global, _slice_dot_from_global), has no barrier either (each warp
    recomputes every slice alone), and it gives the same bits as the words. Past 32 words the
    tensor has at least one element a thread (GROUP_PADDED >= 32 x WARPS, the rest masked), so
    no warp holds another's words: each word is loaded once, every reduction here crosses warps
    through shared memory, and every warp gets the same result from the same loads, so they
    poll as many times and decide alike. (Between 32 and 32 x WARPS words some warps would
    repeat others' words with loads of their own, and Triton 3.9's cross-warp step lets
    repeated warps write the same shared slot, the last writer winning: the decision and the
    sum could then come from different loads, one of them before a partner published.)"""
    complete = _sums_complete(words, row, tag_offset, part_ids, GROUP)
    while (complete == 0) & (polls < SPIN_LIMIT):
        words = _load_sums(SUMS, row, part_ids, GROUP)
        complete = _sums_complete(words, row, tag_offset, part_ids, GROUP)
        polls += 1
    values = (words & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
    return complete, values, polls


@gluon.jit
def _group_total(values, part_ids, GROUP: gl.constexpr):
    """The group's total: its members' sums added in one fixed order (every member, and every
    warp, the same bits)."""
    return gl.sum(gl.where(part_ids < GROUP, values, 0.0), axis=0)


@gluon.jit
def _lines_total(line_sums, LINES_LAYOUT: gl.constexpr):
    """A slice's (or chunk's) sum from its line sums: each warp holding them all, a line a lane
    (LINES_LAYOUT), added by the same shuffles whoever computed them."""
    return gl.sum(gl.convert_layout(line_sums, LINES_LAYOUT), axis=0)


@gluon.jit
def _line_sums(terms, LINES: gl.constexpr):
    """Each 256-column line's sum of terms (a slice's or chunk's, in the layout the kernels
    stage them in: 8 consecutive columns a thread, 32 threads a line, the lines over the warps;
    or one line, [1, 256], in every warp), within one warp."""
    return gl.sum(gl.reshape(terms, [LINES, 256]), axis=1)


@gluon.jit
def _line_sumsq(x, cols, N: gl.constexpr, LINES: gl.constexpr):
    """_line_sums of x^2 (columns past N counted 0)."""
    return _line_sums(gl.where(cols < N, x * x, 0.0), LINES)


@gluon.jit
def _line_dot(w, dy, x, cols, N: gl.constexpr, LINES: gl.constexpr):
    """_line_sums of w * dy * x (columns past N counted 0)."""
    return _line_sums(gl.where(cols < N, w * dy * x, 0.0), LINES)


@gluon.jit
def _slice_sumsq_from_global(X, row, stride_x_row, member, line_cols, line_ids,
                             LINES_LAYOUT: gl.constexpr, N: gl.constexpr, SLICE: gl.constexpr):  # fmt: skip
    """A member's slice's sum of x^2 read from global memory by each warp alone: line by line
    ([1, 256], the same lines, threads and order as its owner's staged slice), then
    _lines_total: the owner's bits."""
    LINES: gl.constexpr = SLICE // 256
    line_sums = gl.zeros([LINES], gl.float32, LINES_LAYOUT)
    for k in range(LINES):
        cols = member * SLICE + k * 256 + line_cols
        x = gl.load(X + row * stride_x_row + cols, mask=cols < N, other=0.0).to(gl.float32)
        line = gl.sum(_line_sumsq(x, cols, N, 1), axis=0)
        line_sums = gl.where(line_ids == k, line, line_sums)
    return _lines_total(line_sums, LINES_LAYOUT)


@gluon.jit
def _sumsq_values_from_global(X, row, stride_x_row, part_ids, line_cols, line_ids,
                              LINES_LAYOUT: gl.constexpr, N: gl.constexpr, SLICE: gl.constexpr,
                              GROUP: gl.constexpr):  # fmt: skip
    """Every member's slice sum of the row (the fallback), in part_ids' layout."""
    values = part_ids.to(gl.float32) * 0.0
    for m in range(GROUP):
        s = _slice_sumsq_from_global(X, row, stride_x_row, m, line_cols, line_ids,
                                     LINES_LAYOUT, N, SLICE)  # fmt: skip
        values = gl.where(part_ids == m, s, values)
    return values


@gluon.jit
def _slice_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, member, offset,
                           line_cols, line_ids, LINES_LAYOUT: gl.constexpr, N: gl.constexpr,
                           CHUNK: gl.constexpr, CHUNKS: gl.constexpr):  # fmt: skip
    """A member's slice's sum of w * dy * x read from global memory by each warp alone, chunk by
    chunk and line by line as its owner sums it staged (_staged_dot_lines): the owner's bits."""
    LINES: gl.constexpr = CHUNK // 256
    dot = 0.0
    for k in gl.static_range(CHUNKS):
        line_sums = gl.zeros([LINES], gl.float32, LINES_LAYOUT)
        for i in range(LINES):
            cols = member * (CHUNKS * CHUNK) + k * CHUNK + i * 256 + line_cols
            mask = cols < N
            w = gl.load(W + cols, mask=mask, other=0.0).to(gl.float32) + offset
            x = gl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(gl.float32)
            dy = gl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(gl.float32)
            line = gl.sum(_line_dot(w, dy, x, cols, N, 1), axis=0)
            line_sums = gl.where(line_ids == i, line, line_sums)
        dot += _lines_total(line_sums, LINES_LAYOUT)
    return dot


@gluon.jit
def _dot_values_from_global(X, W, DY, row, stride_x_row, stride_dy_row, offset, part_ids,
                            line_cols, line_ids, LINES_LAYOUT: gl.constexpr, N: gl.constexpr,
                            CHUNK: gl.constexpr, CHUNKS: gl.constexpr, GROUP: gl.constexpr):  # fmt: skip
    """Every member's slice dot of the row (the fallback), in part_ids' layout."""
    values = part_ids.to(gl.float32) * 0.0
    for m in range(GROUP):
        s = _slice_dot_from_global(X, W, DY, row, stride_x_row, stride_dy_row, m, offset,
                                   line_cols, line_ids, LINES_LAYOUT, N, CHUNK, CHUNKS)  # fmt: skip
        values = gl.where(part_ids == m, s, values)
    return values


@gluon.jit
def _staged_dot_lines(X_RING, DY_RING, W_HELD, first_slot, col_start, cols, offset,
                      layout: gl.constexpr, LINES_LAYOUT: gl.constexpr, N: gl.constexpr,
                      CHUNK: gl.constexpr, CHUNKS: gl.constexpr, RING: gl.constexpr,
                      WAIT_BASE: gl.constexpr, PAIRS: gl.constexpr):  # fmt: skip
    """The first pass over a row's staged chunks of this slice (columns col_start on, ring
    slots first_slot on): the sum of w * dy * x, chunk by chunk, each by lines (_line_dot,
    _lines_total), waiting before chunk k until at most WAIT_BASE - k later cp.async groups
    are pending."""
    LINES: gl.constexpr = CHUNK // 256
    dot = 0.0
    for k in gl.static_range(CHUNKS):
        async_copy.wait_group(WAIT_BASE - k)
        slot = (first_slot + k) % RING
        chunk_cols = col_start + k * CHUNK + cols
        w = _upcast(W_HELD.index(k).load(layout), PAIRS) + offset
        x = _upcast(X_RING.index(slot).load(layout), PAIRS)
        dy = _upcast(DY_RING.index(slot).load(layout), PAIRS)
        dot += _lines_total(_line_dot(w, dy, x, chunk_cols, N, LINES), LINES_LAYOUT)
    return dot


@gluon.jit
def _stage_slice(X_RING, slot, X, stride_x_row, row, M, cols, N: gl.constexpr):
    """One cp.async group: a row's slice of x into ring slot `slot` (zeros outside the row, and
    for rows past M, whose group still counts)."""
    _async_load(X_RING.index(slot), X + row * stride_x_row + cols, mask=(cols < N) & (row < M))
    async_copy.commit_group()


@gluon.jit
def _staged_sumsq(X_RING, slot, cols, layout: gl.constexpr, LINES_LAYOUT: gl.constexpr,
                  N: gl.constexpr, PENDING: gl.constexpr):  # fmt: skip
    """The sum of squares of the slice in ring slot `slot` (_line_sumsq, _lines_total), once at
    most PENDING later cp.async groups are still in flight."""
    async_copy.wait_group(PENDING)
    x = _upcast_pairs(X_RING.index(slot).load(layout))
    return _lines_total(_line_sumsq(x, cols, N, X_RING.shape[1] // 256), LINES_LAYOUT)


@gluon.jit
def _first_claims(CTRL, group, member, chunks, first_chunks, one, lane_zero,
                  GROUP: gl.constexpr, SPIN_LIMIT: gl.constexpr):  # fmt: skip
    """Member 0: once its group has formed (_wait_for_group), its first first_chunks chunks,
    claimed at once and linked at the group's head; every member: the first of them (read from
    the head). Returns (first chunk, the last chunk claimed in the claiming thread)."""
    last = lane_zero
    if member == 0:
        _wait_for_group(CTRL, group, chunks, GROUP, SPIN_LIMIT)
        first = _claim(CTRL, first_chunks, one, lane_zero)
        _link(CTRL + 2 + group + lane_zero, first, one)
        last = first + first_chunks - 1
    return _read_link(CTRL + 2 + group), last


@gluon.jit
def rmsnorm_fwd_held_group_kernel(
    X, W, Y, RSTD, SUMS, CTRL, stride_x_row, stride_y_row, M, eps, offset, tag_offset,
    rows_per_chunk, chunks,
    N: gl.constexpr,  # at most GROUP slices of SLICE columns
    GROUP: gl.constexpr,  # programs a row: each owns one slice of its columns
    GROUP_PADDED: gl.constexpr,  # the words' tensor: launch.held_group_words(GROUP, WARPS)
    SLICE: gl.constexpr,  # columns a program owns (and a ring slot holds): 256-column lines
    RING: gl.constexpr,  # ring slots: this row's slice, the next row's, and more
    WARPS: gl.constexpr,  # the launch's num_warps (the layout needs it as a constant)
    SPIN_LIMIT: gl.constexpr,  # a warp's polls, all rows together (then it sums rows alone)
):  # fmt: skip
    """RMSNorm forward of 16-bit rows too wide for one SM, read from HBM once: GROUP programs
    share each row, program `member` of its group owning columns [member * SLICE, (member + 1)
    * SLICE) (groups and members by start order, rows claimed in chunks of rows_per_chunk:
    the section's comment above); its slice of each row staged in a shared-memory ring
    (cp.async, one group a slot, restaged with the group's row RING positions on once its y is
    written), w's slice staged once. The launch is an ordinary one: any number of its programs
    may be resident at once.

    The sum of squares needs the whole row: one word a slice through SUMS, tagged with its row
    (_publish_sum, _read_sums). A program publishes its group's next row before it needs this
    one, so its partners have a row's time to publish, and loads this row's words before that,
    then sums the group's values in one fixed order (every member gets the same bits; member 0
    stores rstd) and writes its slice of y. Each warp has SPIN_LIMIT polls for all its rows; a
    row whose group it finds incomplete once they are spent it sums from global memory, every
    slice as its owner does (_sumsq_values_from_global): the same bits.

    Before the loop the first row's slice is waited for with RING - 1 later groups allowed
    pending; in the loop the next row's with RING - 2 (a slot is restaged, one group, after its
    y is written). Each thread reads back only the shared elements its own copies wrote (one
    layout for both), so waiting on its own groups is enough. Same formula as
    rmsnorm_fwd_kernel: rstd = 1 / sqrt_rn(sum(x^2) / N + eps) in fp32, y = x * rstd * (w +
    offset) rounded once; the sum is ordered differently (line by line, slice by slice).
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])  # line i in warp i % WARPS
    lines_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, WARPS], [1, 0])
    LINES_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # a line a lane
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # (_read_sums)
    chain_layout: gl.constexpr = gl.BlockedLayout([CHAIN], [32], [WARPS], [0])
    LINES: gl.constexpr = SLICE // 256
    AHEAD: gl.constexpr = RING + 3  # positions member 0 keeps claimed past the current one
    gl.static_assert(SLICE % 256 == 0)
    gl.static_assert(LINES <= 32)  # a line a lane (_lines_total)
    gl.static_assert(RING >= 2)
    gl.static_assert(RING + 2 <= CHAIN)
    gl.static_assert(N <= GROUP * SLICE)
    gl.static_assert((GROUP_PADDED <= 32) | (GROUP_PADDED >= 32 * WARPS))  # (_read_sums)
    shared_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, SLICE], shared_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [SLICE], shared_layout)
    group, member = _join_group(CTRL, GROUP)
    NEXT = CTRL + 2 + gl.num_programs(0) // GROUP
    cols = member * SLICE + gl.arange(0, SLICE, layout=layout)
    in_row = cols < N
    _async_load(w_held, W + cols, mask=in_row)  # w's slice, once: the oldest group
    async_copy.commit_group()
    line_cols = gl.arange(0, 256, gl.SliceLayout(0, lines_layout))[None, :]  # (the fallback's)
    line_ids = gl.arange(0, LINES, LINES_LAYOUT)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    lane_ids = gl.arange(0, 32 * WARPS, layout=parts_layout)
    lane_zero = lane_ids * 0
    claimer = (lane_ids == 0) & (member == 0)
    first_chunks = (AHEAD + rows_per_chunk - 1) // rows_per_chunk
    first, last = _first_claims(CTRL, group, member, chunks, first_chunks, claimer, lane_zero,
                                GROUP, SPIN_LIMIT)  # fmt: skip
    covered = first_chunks * rows_per_chunk  # positions claimed (member 0's count)
    start = gl.where(first < chunks, first * rows_per_chunk, M).to(gl.int64)
    batch_end = gl.minimum(start + first_chunks * rows_per_chunk, M)
    chain_ids = gl.arange(0, CHAIN, layout=chain_layout)
    chain = gl.where(start + chain_ids < batch_end, start + chain_ids, M).to(gl.int32)
    newest = start + RING  # position RING's row (or past batch_end: M)
    newest = gl.where(newest < batch_end, newest, M)
    for s in gl.static_range(RING):
        _stage_slice(x_ring, s, X, stride_x_row, _chain_row(chain, chain_ids, s), M, cols, N)
    row = _chain_row(chain, chain_ids, 0)
    sumsq = _staged_sumsq(x_ring, 0, cols, layout, LINES_LAYOUT, N, RING - 1)
    if row < M:
        _publish_sum(SUMS, row, member, sumsq, GROUP)
    polls = 0  # each warp's own, over all of the program's rows: once spent, no row waits
    j = 0
    while row < M:
        slot = j % RING
        claiming = claimer & (covered < j + AHEAD) & (last < chunks - 1)
        claimed = _claim(CTRL, 1, claiming, lane_zero)  # linked at the end of the iteration
        covered += gl.where((member == 0) & (covered < j + AHEAD), rows_per_chunk, 0)
        needs = (newest + 1 < M) & (newest + 1 >= batch_end)
        link = NEXT + gl.maximum((batch_end - 1) // rows_per_chunk, 0)
        v = gl.load(link, mask=needs, other=1, volatile=True)  # resolved at the end
        words = _load_sums(SUMS, row, part_ids, GROUP)  # in flight over the next row's sum
        following = _chain_row(chain, chain_ids, j + 1)
        sumsq = _staged_sumsq(x_ring, (j + 1) % RING, cols, layout, LINES_LAYOUT, N, RING - 2)
        if following < M:
            _publish_sum(SUMS, following, member, sumsq, GROUP)
        complete, values, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls,
                                             GROUP, SPIN_LIMIT)  # fmt: skip
        if complete == 0:  # partners absent: every slice from global memory, as its owner
            values = _sumsq_values_from_global(X, row, stride_x_row, part_ids, line_cols,
                                               line_ids, LINES_LAYOUT, N, SLICE, GROUP)  # fmt: skip
        total = _group_total(values, part_ids, GROUP)
        rstd = 1.0 / gl.sqrt_rn(total / N + eps)
        if member == 0:
            gl.store(RSTD + row, rstd)
        x = _upcast_pairs(x_ring.index(slot).load(layout))
        w = _upcast_pairs(w_held.load(layout)) + offset
        gl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=in_row)
        _stage_slice(x_ring, slot, X, stride_x_row, newest, M, cols, N)  # position j + RING
        newest, batch_end = _following_row(newest, batch_end, v, needs, link, rows_per_chunk,
                                           chunks, M)  # fmt: skip
        chain = gl.where(chain_ids == (j + RING + 1) % CHAIN, newest.to(gl.int32), chain)
        _link(NEXT + last, claimed, claiming)
        last = gl.where(claiming, claimed, last)
        j += 1
        row = _chain_row(chain, chain_ids, j)
    async_copy.wait_group(0)  # the last (masked) copies land before the program ends


@gluon.jit
def rmsnorm_bwd_held_group_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT, SUMS, CTRL,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, rows_per_chunk, chunks,
    offset, tag_offset,
    N: gl.constexpr,  # at most GROUP slices of CHUNKS * CHUNK columns
    GROUP: gl.constexpr,  # programs a row: each owns one slice of its columns
    GROUP_PADDED: gl.constexpr,  # the words' tensor: launch.held_group_words(GROUP, WARPS)
    CHUNK: gl.constexpr,  # columns a ring slot holds: 256-column lines
    CHUNKS: gl.constexpr,  # chunks a slice: 1 or 2 (one dw accumulator in registers each)
    RING: gl.constexpr,  # ring slots, at least 2 * CHUNKS
    HAS_DH_OUT: gl.constexpr,
    WARPS: gl.constexpr,
    SPIN_LIMIT: gl.constexpr,  # a warp's polls, all rows together (then it sums rows alone)
):  # fmt: skip
    """RMSNorm backward of 16-bit rows too wide for one SM (and, where the row fills its slices,
    of 24576-32768 columns, beside the held row), x and dy read from HBM once: GROUP
    programs share each row, program `member` of its group owning columns [member * SLICE,
    (member + 1) * SLICE), SLICE = CHUNKS * CHUNK (groups and members by start order, row
    chunks claimed: the section's comment above), and doing on its slice what
    rmsnorm_bwd_held_row_kernel does on a row (x and dy staged in a shared-memory ring, w's
    slice staged once, the slice's dw accumulator in registers). The launch is an ordinary one.

    dw stays deterministic whoever takes a chunk: a chunk's dw partial row, DW_PARTIAL[chunk],
    is its rows' dy * x_hat summed in row order by the group that took it (each member its
    slice), and backward_launch.py sums the partial rows in a fixed order.

    mean(g * x_hat) needs the whole row: the slices' sums are exchanged through SUMS, one word
    a (row, member) carrying the sum and the row's tag (_publish_sum, _read_sums). The first
    pass runs one row ahead: a program publishes the group's next row before it needs this one
    (the ring holds two rows' slices), so its partners have a pass's time to publish, and it
    loads this row's words before that pass, so the load's round trip overlaps the pass; it
    loads them again only if a partner's is missing. Each warp has SPIN_LIMIT polls for all its
    rows; a row whose group it finds incomplete once they are spent it sums from global memory,
    every slice as its owner does (_dot_values_from_global): the same bits.

    The sequence of staged chunks and its cp.async groups as in rmsnorm_bwd_held_row_kernel, the
    first pass of the next row waiting with RING - 1 - CHUNKS - k later groups allowed pending.
    """
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])  # line i in warp i % WARPS
    lines_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, WARPS], [1, 0])
    LINES_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # a line a lane
    UPCAST_PAIRS: gl.constexpr = GROUP_PADDED <= 32  # bf16 in pairs up to 32 words (_upcast_pairs)
    parts_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # (_read_sums)
    chain_layout: gl.constexpr = gl.BlockedLayout([CHAIN], [32], [WARPS], [0])
    LINES: gl.constexpr = CHUNK // 256
    REACH: gl.constexpr = (CHUNKS - 1 + RING) // CHUNKS  # the furthest position staged ahead
    AHEAD: gl.constexpr = REACH + 3  # positions member 0 keeps claimed past the current one
    SLICE: gl.constexpr = CHUNKS * CHUNK
    gl.static_assert(CHUNK % 256 == 0)
    gl.static_assert(LINES <= 32)  # a line a lane (_lines_total)
    gl.static_assert(CHUNKS <= 2)
    gl.static_assert(RING >= 2 * CHUNKS)
    gl.static_assert(REACH + 2 <= CHAIN)
    gl.static_assert(N <= GROUP * SLICE)
    gl.static_assert((GROUP_PADDED <= 32) | (GROUP_PADDED >= 32 * WARPS))  # (_read_sums)
    ring_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    x_ring = gl.allocate_shared_memory(X.dtype.element_ty, [RING, CHUNK], ring_layout)
    dy_ring = gl.allocate_shared_memory(DY.dtype.element_ty, [RING, CHUNK], ring_layout)
    w_held = gl.allocate_shared_memory(W.dtype.element_ty, [CHUNKS, CHUNK], ring_layout)
    group, member = _join_group(CTRL, GROUP)
    NEXT = CTRL + 2 + gl.num_programs(0) // GROUP
    cols = gl.arange(0, CHUNK, layout=layout)
    slice_start = member * SLICE
    for k in gl.static_range(CHUNKS):  # w's slice, once: one group, older than every chunk's
        w_cols = slice_start + k * CHUNK + cols
        _async_load(w_held.index(k), W + w_cols, mask=w_cols < N)
    async_copy.commit_group()
    line_cols = gl.arange(0, 256, gl.SliceLayout(0, lines_layout))[None, :]  # (the fallback's)
    line_ids = gl.arange(0, LINES, LINES_LAYOUT)
    part_ids = gl.arange(0, GROUP_PADDED, layout=parts_layout)
    lane_ids = gl.arange(0, 32 * WARPS, layout=parts_layout)
    lane_zero = lane_ids * 0
    claimer = (lane_ids == 0) & (member == 0)
    first_chunks = (AHEAD + rows_per_chunk - 1) // rows_per_chunk
    first, last = _first_claims(CTRL, group, member, chunks, first_chunks, claimer, lane_zero,
                                GROUP, SPIN_LIMIT)  # fmt: skip
    covered = first_chunks * rows_per_chunk  # positions claimed (member 0's count)
    start = gl.where(first < chunks, first * rows_per_chunk, M).to(gl.int64)
    batch_end = gl.minimum(start + first_chunks * rows_per_chunk, M)
    chain_ids = gl.arange(0, CHAIN, layout=chain_layout)
    chain = gl.where(start + chain_ids < batch_end, start + chain_ids, M).to(gl.int32)
    newest = start + REACH  # position REACH's row (or past batch_end: M)
    newest = gl.where(newest < batch_end, newest, M)
    for s in gl.static_range(RING):
        _stage_chunk(x_ring, dy_ring, s, X, DY, stride_x_row, stride_dy_row,
                     _chain_row(chain, chain_ids, s // CHUNKS), M,
                     slice_start + (s % CHUNKS) * CHUNK + cols, N)  # fmt: skip
    row = _chain_row(chain, chain_ids, 0)
    # the first row's first pass
    dot = _staged_dot_lines(x_ring, dy_ring, w_held, 0, slice_start, cols, offset, layout,
                            LINES_LAYOUT, N, CHUNK, CHUNKS, RING, RING - 1, UPCAST_PAIRS)  # fmt: skip
    if row < M:
        _publish_sum(SUMS, row, member, dot, GROUP)
    dw_0 = gl.zeros([CHUNK], gl.float32, layout)
    dw_1 = gl.zeros([CHUNK], gl.float32, layout)
    polls = 0  # each warp's own, over all of the program's rows: once spent, no row waits
    j = 0
    while row < M:
        first_slot = (j * CHUNKS) % RING
        next_slot = ((j + 1) * CHUNKS) % RING
        claiming = claimer & (covered < j + AHEAD) & (last < chunks - 1)
        claimed = _claim(CTRL, 1, claiming, lane_zero)  # linked at the end of the iteration
        covered += gl.where((member == 0) & (covered < j + AHEAD), rows_per_chunk, 0)
        needs = (newest + 1 < M) & (newest + 1 >= batch_end)
        link = NEXT + gl.maximum((batch_end - 1) // rows_per_chunk, 0)
        v = gl.load(link, mask=needs, other=1, volatile=True)  # resolved at the end
        words = _load_sums(SUMS, row, part_ids, GROUP)  # in flight over the next row's pass
        following = _chain_row(chain, chain_ids, j + 1)
        dot = _staged_dot_lines(x_ring, dy_ring, w_held, next_slot, slice_start, cols, offset,
                                layout, LINES_LAYOUT, N, CHUNK, CHUNKS, RING,
                                RING - 1 - CHUNKS, UPCAST_PAIRS)  # fmt: skip
        if following < M:
            _publish_sum(SUMS, following, member, dot, GROUP)
        complete, values, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls,
                                             GROUP, SPIN_LIMIT)  # fmt: skip
        if complete == 0:  # partners absent: every slice from global memory, as its owner
            values = _dot_values_from_global(X, W, DY, row, stride_x_row, stride_dy_row,
                                             offset, part_ids, line_cols, line_ids,
                                             LINES_LAYOUT, N, CHUNK, CHUNKS, GROUP)  # fmt: skip
        total = _group_total(values, part_ids, GROUP)
        rstd = gl.load(RSTD + row)
        mean_gx = total * rstd / N
        for k in gl.static_range(CHUNKS):  # second pass: dx and dw, then restage the slot
            slot = (first_slot + k) % RING
            chunk_cols = slice_start + k * CHUNK + cols
            args = (x_ring, dy_ring, slot, w_held, k, DX, DH_OUT, row, stride_dx_row,
                    stride_dh_row, chunk_cols, rstd, mean_gx, offset)  # fmt: skip
            if k == 0:
                dw_0 = _backward_chunk(*args, dw_0, layout, N, HAS_DH_OUT, UPCAST_PAIRS)
            else:
                dw_1 = _backward_chunk(*args, dw_1, layout, N, HAS_DH_OUT, UPCAST_PAIRS)
            # the slot takes the chunk RING places later in the sequence
            _stage_chunk(x_ring, dy_ring, slot, X, DY, stride_x_row, stride_dy_row,
                         _chain_row(chain, chain_ids, j + (k + RING) // CHUNKS), M,
                         slice_start + ((k + RING) % CHUNKS) * CHUNK + cols, N)  # fmt: skip
        if ((row + 1) % rows_per_chunk == 0) | (row + 1 == M):  # the chunk's last row
            partial = DW_PARTIAL + (row // rows_per_chunk) * N + slice_start + cols
            gl.store(partial, dw_0, mask=slice_start + cols < N)
            dw_0 = gl.zeros([CHUNK], gl.float32, layout)
            if CHUNKS > 1:
                gl.store(partial + CHUNK, dw_1, mask=slice_start + CHUNK + cols < N)
                dw_1 = gl.zeros([CHUNK], gl.float32, layout)
        newest, batch_end = _following_row(newest, batch_end, v, needs, link, rows_per_chunk,
                                           chunks, M)  # fmt: skip
        chain = gl.where(chain_ids == (j + REACH + 1) % CHAIN, newest.to(gl.int32), chain)
        _link(NEXT + last, claimed, claiming)
        last = gl.where(claiming, claimed, last)
        j += 1
        row = _chain_row(chain, chain_ids, j)
    async_copy.wait_group(0)
