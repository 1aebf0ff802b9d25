"""Triton kernels of wide rows, N above what one tile holds in registers: the looped forward and
backward (each row in chunks, read twice), the split kernels (fewer rows than SMs: several
programs a row), and the dw partials' sum every backward ends with. The math: kernels.py."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_fwd_looped_kernel(
    X, W, Y, RSTD, R, H,
    stride_x_row, stride_y_row, stride_r_row, stride_h_row, M, N, eps, offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,  # sets the grid (launch.py): rows in flight at once
    LOOP_STAGES: tl.constexpr,  # software pipelining of the chunk loops (see the backward's)
):  # fmt: skip
    """Persistent: each program walks rows pid, pid + programs, ...; each row in BLOCK_N chunks,
    twice: sum of squares, then y.

    The second pass re-reads x (h with a residual, as written by the first pass) and walks the
    chunks backwards, so that it starts with those read last, the likeliest still in L2. How
    much of it L2 serves depends on the bytes read between the two reads of a chunk, i.e. on
    how many rows are in flight: the grid (PROGRAMS_PER_SM per SM) is tuned.
    """
    chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):  # int64 row offsets
        x_row = X + row * stride_x_row
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=LOOP_STAGES):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(R + row * stride_r_row + cols, mask=cols < N, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
                tl.store(H + row * stride_h_row + cols, x, mask=cols < N)
            x = x.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps)
        if HAS_RESIDUAL:
            x_row = H + row * stride_h_row
            tl.debug_barrier()  # h written above by other threads of this program
        for i in tl.range(0, chunks, num_stages=LOOP_STAGES):
            cols = (chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
            y = (x * rstd * w).to(Y.dtype.element_ty)
            tl.store(Y + row * stride_y_row + cols, y, mask=mask)
        tl.store(RSTD + row, rstd)


@triton.jit
def rmsnorm_bwd_row_dot_kernel(
    X, W, DY, RSTD, MEAN_GX,
    stride_x_row, stride_dy_row, N, offset,
    BLOCK_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr,  # software pipelining of the chunk loop (see rmsnorm_bwd_kernel)
):  # fmt: skip
    """Wide-row backward, step 1: one program per row, mean(g * x_hat) with g = (offset + w) * dy."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N, num_stages=LOOP_STAGES):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
        acc += w * dy * x
    rstd = tl.load(RSTD + row)
    tl.store(MEAN_GX + row, tl.sum(acc, axis=0) * rstd / N)


@triton.jit
def rmsnorm_bwd_columns_kernel(
    X, W, DY, RSTD, MEAN_GX, DX, DW_PARTIAL, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, N, rows_per_program, offset,
    BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,  # software pipelining of the row loop (see rmsnorm_bwd_kernel)
):  # fmt: skip
    """Wide-row backward, step 2: program (column block, row group) writes dx for its block of
    its rows and owns the fp32 dw accumulator of that block: no atomics, as in the narrow path."""
    col_block = tl.program_id(0)
    row_group = tl.program_id(1)
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = row_group.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for row in tl.range(row_start, row_end, num_stages=LOOP_STAGES):
        x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        mean_gx = tl.load(MEAN_GX + row)
        x_hat = x * rstd
        dx = (w * dy - x_hat * mean_gx) * rstd
        if HAS_DH_OUT:
            dx += tl.load(DH_OUT + row * stride_dh_row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + row_group.to(tl.int64) * N + cols, dw_acc, mask=mask)


# ---- dw: the partials' sum ---------------------------------------------------------------------


@triton.jit
def rmsnorm_dw_reduce_kernel(
    DW_PARTIAL,  # [rows, N] fp32, one row per backward program
    DW,  # [N] in the weight's dtype
    rows,
    N,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dw = the partials summed over their rows, in fp32 and in a fixed order (bitwise
    reproducible), rounded once to the weight's dtype: one launch where sum + cast took two."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_ROWS, BLOCK_N], dtype=tl.float32)
    for start in range(0, rows, BLOCK_ROWS):
        r = start + tl.arange(0, BLOCK_ROWS)
        mask = (r < rows)[:, None] & col_mask[None, :]
        acc += tl.load(
            DW_PARTIAL + r[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0
        )
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_mask)


# ---- wide rows, few of them: several programs per row --------------------------------------------
# With fewer rows than SMs, one program per row leaves SMs idle (64 programs at N = 1M). These
# split each row into BLOCK_N chunks, one program per (chunk, row), in two launches: per-chunk
# sums of squares, then the scaling. x is read twice, as in the looped kernels.


@triton.jit
def rmsnorm_fwd_split_sumsq_kernel(
    X, R, H, PARTIAL, stride_x_row, stride_r_row, stride_h_row, N, splits,
    BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): the chunk's sum of x^2 into PARTIAL[row, chunk] (fp32). With a
    residual it forms h = x + r, rounds and writes it, and sums h^2 (what the scaling reads)."""
    chunk = tl.program_id(0)  # axis 0: up to 2**31 - 1 chunks (axis 1 stops at 65535)
    row = tl.program_id(1).to(tl.int64)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r_row + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        tl.store(H + row * stride_h_row + cols, x, mask=mask)
    x = x.to(tl.float32)
    tl.store(PARTIAL + row * splits + chunk, tl.sum(x * x, axis=0))


@triton.jit
def rmsnorm_fwd_split_scale_kernel(
    X, W, Y, RSTD, PARTIAL, stride_x_row, stride_y_row, N, splits, eps, offset,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Program (row, chunk): rstd from the row's partial sums (summed in a fixed order, the same
    in every program of the row), then y for the chunk; chunk 0 stores rstd. Programs take the
    (row, chunk) pairs in the reverse of the sum-of-squares launch's order, so that the first
    to run re-read the chunks read last, the likeliest still in L2."""
    chunk = splits - 1 - tl.program_id(0)  # axis 0: up to 2**31 - 1 chunks (axis 1: 65535)
    row = (tl.num_programs(1) - 1 - tl.program_id(1)).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    partial = tl.load(PARTIAL + row * splits + s, mask=s < splits, other=0.0)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(partial, axis=0) / N + eps)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(Y + row * stride_y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    if chunk == 0:
        tl.store(RSTD + row, rstd)


@triton.jit
def rmsnorm_bwd_split_dot_kernel(
    X, W, DY, PARTIAL, stride_x_row, stride_dy_row, N, splits, offset, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Wide-row backward, step 1 for few rows: program (row, chunk) writes the chunk's
    sum of g * x with g = (offset + w) * dy into PARTIAL[row, chunk]."""
    chunk = tl.program_id(0)  # axis 0: up to 2**31 - 1 chunks (axis 1 stops at 65535)
    row = tl.program_id(1).to(tl.int64)
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(PARTIAL + row * splits + chunk, tl.sum(w * dy * x, axis=0))


@triton.jit
def rmsnorm_bwd_split_finish_kernel(
    PARTIAL, RSTD, MEAN_GX, N, splits, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """One program per row: mean(g * x_hat) = (sum of the row's partials, fixed order) * rstd / N,
    what rmsnorm_bwd_columns_kernel reads."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    partial = tl.load(PARTIAL + row * splits + s, mask=s < splits, other=0.0)
    tl.store(MEAN_GX + row, tl.sum(partial, axis=0) * tl.load(RSTD + row) / N)
