"""The grouped kernels in Gluon: GROUP programs hold each 16-bit row, a slice each, and exchange
their slice sums through global memory (gluon_group_exchange.py says how; held_paths.py offers
them; docs/held-group-progress.md says why their progress and their bits are certain)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .gluon_common import _async_load, _backward_chunk, _stage_chunk, _upcast_pairs
from .gluon_group_exchange import (
    CHAIN,
    _chain_row,
    _claim,
    _dot_values_from_global,
    _first_claims,
    _following_row,
    _group_total,
    _join_group,
    _link,
    _load_sums,
    _publish_sum,
    _read_sums,
    _stage_slice,
    _staged_dot_lines,
    _staged_sumsq,
    _sumsq_values_from_global,
)


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
