"""How the grouped kernels (gluon_group_kernels.py) share a row among GROUP programs: their
places, the work they claim, the slice sums they exchange and the fallback that computes them
alone.

The grouped kernels share each row among GROUP programs, each holding one slice of it. Nothing
about them assumes that every program is resident at once (the launch is an ordinary one):
- a program's place is its start order, not its program id: a ticket from CTRL[0]
  (_join_group), group ticket // GROUP, member ticket % GROUP. Every group is then made of
  programs that started, in order; the only group that can lack members is the one with the
  latest tickets, and it waits only on programs that start as soon as any earlier one exits.
- work is taken, not dealt: fixed chunks of rows_per_chunk rows, claimed from CTRL[1] by
  member 0's first thread and linked for its partners through CTRL (_claim, _link,
  _following_row), so that every member walks the same rows and groups that start late find
  less work. Member 0 claims only once its group has all its tickets (or nothing is left to
  claim, or, the last resort where fewer than GROUP programs can be resident at all, its
  polls are spent: _wait_for_group).
- the bits of a row do not depend on who computes its sums: a slice's sum is taken line by
  line (256 columns, within one warp) and then over its lines in one fixed order in every
  thread (_lines_total); a program whose partners' words do not come recomputes every
  slice's sum from global memory by the same code (_slice_sumsq_from_global,
  _slice_dot_from_global), and the group's total is the same fixed-order sum either way.

CTRL (int32, zeroed by the caller for each launch): [0] tickets, [1] chunks claimed,
[2 + g] group g's first chunk + 1 (its head), [2 + groups + c] the chunk its group takes
after chunk c, + 1 (0: not yet written). Rows past M stand for "none".
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .gluon_common import _async_load, _upcast, _upcast_pairs

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
