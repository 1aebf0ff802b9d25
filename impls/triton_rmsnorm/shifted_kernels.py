"""Triton kernels of the single tile for rows that do not start on 16 bytes (odd N and the
like): the plain kernels' math (kernels.py) in a frame shifted per residue class of rows, so
that every load and store is a 16-byte vector but at the rows' ends."""

import triton
import triton.language as tl

from .upcast import _upcast_opaque


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_fwd_shifted_kernel(
    X, W, Y, RSTD, R, H,
    stride_x_row, stride_y_row, stride_r_row, stride_h_row, M,
    N: tl.constexpr,  # a compile-time constant, as in rmsnorm_fwd_kernel
    eps, offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    VEC: tl.constexpr,  # elements in 16 bytes
    PERIOD: tl.constexpr,  # rows after which the rows' alignment repeats
    MAY_WRAP: tl.constexpr,  # N + the largest shift > BLOCK_N
    LOOP_STAGES: tl.constexpr,
    HOLD_STORAGE_FORM: tl.constexpr = False,
    STORE_RSTD: tl.constexpr = True,  # as in rmsnorm_fwd_kernel
):  # fmt: skip
    """rmsnorm_fwd_kernel for rows that do not start on 16 bytes (N odd, say), in
    rmsnorm_bwd_shifted_kernel's frame (see there): every load and store of x, r, h and y a
    16-byte vector but at the rows' ends. Program pid takes tiles of BLOCK_M rows of one residue
    class, pid % PERIOD: that class's tiles pid // PERIOD, + programs / PERIOD, ... (the grid is
    PERIOD times the programs per class), with the tile loop pipelined as the persistent
    rmsnorm_fwd_kernel's, and w loaded once in the class's frame. Same formulas as
    rmsnorm_fwd_kernel; the sum of squares runs in another order.
    """
    pid = tl.program_id(0)
    row_class, shift, class_rows = _row_class(pid, M, stride_x_row, PERIOD, VEC)
    lanes, cols, in_row, whole, near, wraps, unwrapped = _shifted_frame(shift, N, BLOCK_N, VEC)
    w = tl.load(W + cols, mask=in_row, other=0.0).to(tl.float32) + offset

    tiles = (class_rows + BLOCK_M - 1) // BLOCK_M
    per_class = tl.num_programs(0) // PERIOD
    for tile in tl.range(pid // PERIOD, tiles, per_class, num_stages=LOOP_STAGES):
        # tile * BLOCK_M + BLOCK_M - 1 stays below 2**31 (as in _fwd_tile_reduce); rows: int64
        index = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = index < class_rows
        rows = row_class + index * PERIOD
        x = _load_shifted(X, rows, stride_x_row, shift, lanes, row_mask, near, wraps, unwrapped,
                          BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
        if HAS_RESIDUAL:
            r = _load_shifted(R, rows, stride_r_row, shift, lanes, row_mask, near, wraps,
                              unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
            x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
            _store_shifted(H, x, rows, stride_h_row, shift, lanes, row_mask, in_row, whole,
                           unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
        # lanes outside the row hold other rows' values (any, inf included): kept out of the sum
        x_fp32 = tl.where(in_row[None, :], x.to(tl.float32), 0.0)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x_fp32 * x_fp32, axis=1) / N + eps)
        if HOLD_STORAGE_FORM:
            x_fp32 = _upcast_opaque(x)
        y = x_fp32 * rstd[:, None] * w[None, :]
        _store_shifted(Y, y.to(Y.dtype.element_ty), rows, stride_y_row, shift, lanes, row_mask,
                       in_row, whole, unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
        if STORE_RSTD:
            tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_bwd_shifted_kernel(
    X, W, DY, RSTD, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, N, rows_per_program, offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VEC: tl.constexpr,  # elements in 16 bytes
    PERIOD: tl.constexpr,  # rows after which the rows' alignment repeats (VEC / gcd(stride, VEC))
    MAY_WRAP: tl.constexpr,  # N + the largest shift > BLOCK_N (see below)
    HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    HOLD_STORAGE_FORM: tl.constexpr = False,
):  # fmt: skip
    """rmsnorm_bwd_kernel for rows that do not start on 16 bytes (N odd, say), whose element
    loads the plain kernel cannot widen, nor its row loop stage through cp.async (4 bytes at
    least), so the plain kernel runs such rows far below the copy (docs/design.md, Backward).

    The launcher guarantees 16-byte aligned bases and row strides equal modulo VEC, so row r
    starts (r * stride) % VEC elements past a 16-byte boundary in every tensor: its shift,
    which repeats every PERIOD rows. Program pid takes rows of one residue class,
    r = pid % PERIOD + PERIOD * i, a contiguous chunk of i each: one shift per program.

    Its tile holds lane j at column (j - shift) mod BLOCK_N, so that lanes read and write the
    row in aligned groups of VEC: whole 16-byte vectors, which the row loop stages through
    cp.async. The groups at the row's two ends are read whole too, taking in up to VEC - 1
    elements of the neighbouring rows (past the last row: the rest of its last aligned 16
    bytes, which no page boundary splits; compute-sanitizer's memcheck may report those reads
    where the last row ends an allocation of exactly its size, as without PyTorch's caching
    allocator), and those lanes are kept out of every sum and never stored. Where the row's last
    columns pass lane BLOCK_N (MAY_WRAP: N within VEC - 1 of BLOCK_N) they wrap round to group
    0's first lanes, which then take a second aligned vector, from past lane BLOCK_N. dx is
    stored in whole vectors, and element by element in the two end groups; w and the dw
    accumulator are held in the same frame, once per program. The math is rmsnorm_bwd_kernel's.
    """
    pid = tl.program_id(0)
    row_class, shift, class_rows = _row_class(pid, M, stride_x_row, PERIOD, VEC)
    lanes, cols, in_row, whole, near, wraps, unwrapped = _shifted_frame(shift, N, BLOCK_N, VEC)

    w = tl.load(W + cols, mask=in_row, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)

    first = (pid // PERIOD).to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, class_rows)
    for step in tl.range(first, last, BLOCK_M, num_stages=LOOP_STAGES):
        index = step + tl.arange(0, BLOCK_M)
        row_mask = index < last
        rows = row_class + index * PERIOD
        x_loaded = _load_shifted(X, rows, stride_x_row, shift, lanes, row_mask, near, wraps,
                                 unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
        dy_loaded = _load_shifted(DY, rows, stride_dy_row, shift, lanes, row_mask, near, wraps,
                                  unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)

        dy = dy_loaded.to(tl.float32)
        x_hat = x_loaded.to(tl.float32) * rstd[:, None]
        g = w[None, :] * dy
        # lanes outside the row hold other rows' values (any, inf included): kept out of the
        # sum; their dx and dw are never stored
        mean_gx = tl.sum(tl.where(in_row[None, :], g * x_hat, 0.0), axis=1) / N
        if HOLD_STORAGE_FORM:  # second pass: from the values as loaded, upcast again
            x_hat = _upcast_opaque(x_loaded) * rstd[:, None]
            dy = _upcast_opaque(dy_loaded)
            g = w[None, :] * dy
        dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
        if HAS_DH_OUT:
            dh = _load_shifted(DH_OUT, rows, stride_dh_row, shift, lanes, row_mask, near, wraps,
                               unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip
            dx += dh.to(tl.float32)
        _store_shifted(DX, dx.to(DX.dtype.element_ty), rows, stride_dx_row, shift, lanes,
                       row_mask, in_row, whole, unwrapped, BLOCK_N, VEC, MAY_WRAP)  # fmt: skip

        dw_acc += dy * x_hat  # (rows past the chunk's end load zeros)

    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=in_row)


@triton.jit
def _row_class(pid, M, stride_row, PERIOD: tl.constexpr, VEC: tl.constexpr):
    """The shifted kernels' rows for program pid: its residue class of rows modulo PERIOD, their
    shift (elements past 16 bytes at which each starts) and how many rows of M the class has."""
    row_class = pid % PERIOD
    shift = row_class * (stride_row % VEC) % VEC  # (not row_class * stride_row: int32)
    class_rows = tl.where(row_class < M, (M - 1 - row_class) // PERIOD + 1, 0)  # no overflow
    return row_class, shift, class_rows


@triton.jit
def _shifted_frame(shift, N, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """The shifted kernels' frame for rows that start `shift` elements past 16 bytes: lane j
    holds column (j - shift) mod BLOCK_N. Returns the lanes; their columns; in_row, the lanes
    that hold a column of the row; whole, those in groups of VEC lanes that lie inside the row;
    near, the groups read in place (any lane in the row); wraps, group 0 where the row's last
    columns come round the end to it (N + shift > BLOCK_N); unwrapped, the lanes not come round.
    Every mask but in_row is constant over each group of VEC lanes, which is what lets Triton
    move a group as one 16-byte vector."""
    lanes = tl.arange(0, BLOCK_N)
    group = lanes // VEC * VEC  # each lane's group's first lane
    cols = tl.where(lanes >= shift, lanes - shift, lanes - shift + BLOCK_N)
    in_row = cols < N
    whole = (group >= shift) & (group + VEC <= shift + N)
    near = (group + VEC > shift) & (group < shift + N)
    wraps = (group == 0) & (shift + N > BLOCK_N + group)
    unwrapped = lanes >= shift
    return lanes, cols, in_row, whole, near, wraps, unwrapped


@triton.jit
def _store_shifted(
    PTR, value, rows, stride_row, shift, lanes, row_mask, in_row, whole, unwrapped,
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, MAY_WRAP: tl.constexpr,
):  # fmt: skip
    """A shifted tile of rows to PTR: whole groups as 16-byte vectors, the end groups' lanes
    that hold a column of the row one by one, at the same addresses (come-round lanes BLOCK_N
    further); nothing outside the rows."""
    at = PTR + tl.multiple_of(rows * stride_row - shift, VEC)[:, None] + lanes[None, :]
    tl.store(at, value, mask=row_mask[:, None] & whole[None, :])
    ends = row_mask[:, None] & (in_row & ~whole)[None, :]
    tl.store(at, value, mask=ends & unwrapped[None, :])
    if MAY_WRAP:
        tl.store(at + BLOCK_N, value, mask=ends & ~unwrapped[None, :])


@triton.jit
def _load_shifted(
    PTR, rows, stride_row, shift, lanes, row_mask, near, wraps, unwrapped,
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, MAY_WRAP: tl.constexpr,
):  # fmt: skip
    """A shifted tile of rows from PTR (_shifted_frame), in aligned 16-byte vectors, as loaded. Lanes of the end groups outside the row
    hold the neighbouring elements; rows past row_mask and groups outside the row, zeros."""
    at = PTR + tl.multiple_of(rows * stride_row - shift, VEC)[:, None] + lanes[None, :]
    v = tl.load(at, mask=row_mask[:, None] & near[None, :], other=0.0)
    if MAY_WRAP:
        wrapped = tl.load(at + BLOCK_N, mask=row_mask[:, None] & wraps[None, :], other=0.0)
        v = tl.where(unwrapped[None, :], v, wrapped)
    return v
