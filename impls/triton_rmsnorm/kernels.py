"""Triton kernels of the fused RMSNorm: the math, nothing about grids or allocation.

    y = x * rstd * (offset + w),   rstd = 1 / sqrt(mean(x^2) + eps)   over the last dimension.

offset is 0 for Llama-style RMSNorm and 1 for Gemma's. x, w and y may each be fp16, bf16 or fp32,
independently. Every reduction and product runs in fp32: values are upcast on load and rounded
once, at the final store.

With HAS_RESIDUAL (pre-norm residual add), the forward first forms h = x + r, rounds it once to
the storage dtype and writes it (the new residual stream), then normalizes that h, exactly as
the unfused code would. The backward then reads h in place of x, and with HAS_DH_OUT adds the
gradient arriving on h to dx (which is also the residual's gradient).

The single-tile kernels hold whole rows in one [BLOCK_M, BLOCK_N] tile (BLOCK_N =
next_power_of_2(N); BLOCK_M rows at a time, 1 for wide rows, more for narrow ones, so that each
program moves enough bytes) and serve rows up to launch.SINGLE_TILE_MAX_N (forward) and
launch.BACKWARD_SINGLE_TILE_MAX_N (backward); the looped kernels at the end of this file serve
wider rows. Row offsets are computed in int64, so M * N may exceed 2**31; column indices
are int32.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_fwd_kernel(
    X,  # [M, N] input, rows strided by stride_x_row, last dim contiguous (HEADS: two levels)
    W,  # [N] weight
    Y,  # [M, N] output, in the caller's output dtype
    RSTD,  # [M] fp32: 1 / sqrt(mean(x^2) + eps), saved for the backward
    R,  # [M, N] residual (HAS_RESIDUAL only)
    H,  # [M, N] output h = x + r, dtype of X (HAS_RESIDUAL only)
    stride_x_row,
    stride_y_row,
    stride_r_row,
    stride_h_row,
    M,
    N: tl.constexpr,  # a compile-time constant (see below)
    eps,
    offset,  # added to the weight: 0.0, or 1.0 for Gemma
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_M: tl.constexpr,  # rows per tile (1 for wide rows, more for narrow ones)
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PERSISTENT: tl.constexpr,  # False: one program per tile; True: programs walk the tiles
    LOOP_STAGES: tl.constexpr,  # software pipelining of the tile loop (see rmsnorm_bwd_kernel)
    ROWS_CONTIGUOUS: tl.constexpr = False,  # every row stride is N: the strides are ignored
    HOLD_STORAGE_FORM: tl.constexpr = False,  # wide rows on a GPU only (inline PTX; see below)
    W_EARLY: tl.constexpr = False,  # one program per tile: load w with x (see below)
    HEADS: tl.constexpr = 1,  # > 1: x's rows in two levels (see below; no residual)
    STRIDE_X_OUTER: tl.constexpr = 0,  # HEADS > 1 only: x's stride between groups of HEADS rows
    STORE_RSTD: tl.constexpr = True,  # False: rstd not written (no backward will read it)
    WAIT_FOR_PRIOR_GRID: tl.constexpr = False,  # launched with PDL: griddepcontrol.wait first
):
    """BLOCK_M whole rows per tile: read x (and r) once, write y (and h) once, one fp32 rstd
    per row (STORE_RSTD; a forward no backward follows writes none, and RSTD is any pointer).
    With BLOCK_M = 1 and one program per tile this is the seed design, one program per row.

    One program per tile (PERSISTENT False) runs the tile straight through, with no loop, and
    loads w after the row's reduction, so that the fp32 w is not live in registers while x is
    loaded and reduced. Both ran faster than a loop that runs once and than w loaded first
    (docs/design.md, Forward).

    A persistent grid of a few programs per SM (PERSISTENT True) walks tiles pid,
    pid + programs, ...; with LOOP_STAGES >= 3 the loop keeps the next tiles' loads in flight
    (cp.async into shared memory) while a tile computes, as QuACK stages x through shared
    memory. Each program loads w once, before its loop.

    W_EARLY (one program per tile) loads w before x's reduction instead of after it: where the
    grid is at most one program an SM (decode-sized M), no other program hides a memory
    latency, and loading w after the reduction puts a second one on the critical path. The
    launcher sets it from the grid (configs._kernel_grid_and_meta); the arithmetic is the same,
    so the bits are too.

    N is a compile-time constant, and so are the row strides when ROWS_CONTIGUOUS: a power-of-two
    N's column mask folds away and the row offsets become constant arithmetic. mean(x^2) is the
    sum times the correctly rounded constant 1/N (with a runtime N it was the hardware's
    approximate reciprocal: the last bit may differ for N not a power of two). Faster than a
    runtime N and strides (docs/design.md, Forward); the cost is a binary per hidden size rather
    than per padded width.

    With HOLD_STORAGE_FORM a tile holds x (or h) as loaded between its reduction and its
    scaling, and upcasts it again for the scaling through inline PTX, as rmsnorm_bwd_kernel
    does: half the registers for 16-bit rows, which at 65536 columns ends the spills (ptxas,
    sm_90). Same formula on the same values.

    With HEADS > 1, x is a [M / HEADS, HEADS, N] view whose rows no one stride describes (the
    per-head norm of a packed QKV projection's [tokens, heads, head_dim] view): row r sits at
    (r // HEADS) * STRIDE_X_OUTER + (r % HEADS) * stride_x_row, read in place; y and rstd are
    [M, N] and [M] as always (ROWS_CONTIGUOUS then says stride_x_row, the head stride, is N).
    Both are compile-time constants, as N is: a binary per (heads, outer stride), and constant
    row arithmetic. HEADS = 1 compiles to the plain kernel's code. Not with HAS_RESIDUAL.

    WAIT_FOR_PRIOR_GRID: the kernel is launched with programmatic dependent launch (PDL), so it
    may be scheduled before the kernel ahead of it in the stream has finished; it waits first
    thing (griddepcontrol.wait) until that kernel has completed and its memory is visible, before
    any load or store. It never triggers its dependents early. Same arithmetic, same bits.
    """
    if WAIT_FOR_PRIOR_GRID:
        tl.extra.cuda.gdc_wait()
    if ROWS_CONTIGUOUS:
        stride_x_row = N
        stride_y_row = N
        stride_r_row = N
        stride_h_row = N
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if PERSISTENT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        tiles = (M - 1) // BLOCK_M + 1  # not tl.cdiv: M + BLOCK_M - 1 overflows int32 near 2**31
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=LOOP_STAGES):
            rows, x, rstd = _fwd_tile_reduce(
                tile, X, R, H, stride_x_row, stride_r_row, stride_h_row, M, N, eps, cols,
                BLOCK_M, HAS_RESIDUAL, HOLD_STORAGE_FORM, HEADS, STRIDE_X_OUTER,
            )  # fmt: skip
            _fwd_tile_store(
                Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, HOLD_STORAGE_FORM, STORE_RSTD
            )
    else:
        tile = tl.program_id(0).to(tl.int64)  # tile * BLOCK_M passes 2**31 for M >= 2**31 rows
        if W_EARLY:
            w_early = tl.load(W + cols, mask=col_mask, other=0.0)
        rows, x, rstd = _fwd_tile_reduce(
            tile, X, R, H, stride_x_row, stride_r_row, stride_h_row, M, N, eps, cols,
            BLOCK_M, HAS_RESIDUAL, HOLD_STORAGE_FORM, HEADS, STRIDE_X_OUTER,
        )  # fmt: skip
        if W_EARLY:
            w = w_early.to(tl.float32) + offset
        else:
            w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        _fwd_tile_store(
            Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, HOLD_STORAGE_FORM, STORE_RSTD
        )


@triton.jit
def _fwd_tile_reduce(
    tile, X, R, H, stride_x_row, stride_r_row, stride_h_row, M, N, eps, cols,
    BLOCK_M: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HOLD_STORAGE_FORM: tl.constexpr,
    HEADS: tl.constexpr, STRIDE_X_OUTER: tl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_kernel's first half for one tile: load x (with HAS_RESIDUAL, form, round and
    write h = x + r, and go on with h; with HEADS > 1, x's rows in two levels), and reduce.
    Returns the tile's int64 row indices, its rows (in fp32, or as loaded with
    HOLD_STORAGE_FORM) and their rstd."""
    # tile is int64 (one program per tile) or the tile loop's index, which has M's width: in
    # int32 (M < 2**31), tile * BLOCK_M + BLOCK_M - 1 stays below 2**31 (BLOCK_M divides 2**31)
    rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if HEADS == 1:
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    else:
        x_at = _two_level_rows(rows, stride_x_row, HEADS, STRIDE_X_OUTER)
        x = tl.load(X + x_at[:, None] + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r_row + cols[None, :], mask=mask, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h_row + cols[None, :], h, mask=mask)
        x = h
    x_fp32 = x.to(tl.float32)
    mean_sq = tl.sum(x_fp32 * x_fp32, axis=1) / N
    rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
    if not HOLD_STORAGE_FORM:
        x = x_fp32
    return rows, x, rstd


@triton.jit
def _fwd_tile_store(
    Y, RSTD, rows, cols, x, rstd, w, stride_y_row, M, N, HOLD_STORAGE_FORM: tl.constexpr,
    STORE_RSTD: tl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_kernel's second half for one tile: y = x * rstd * w, rounded once; rstd
    (STORE_RSTD)."""
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    if HOLD_STORAGE_FORM:
        x = _upcast_opaque(x)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y_row + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _two_level_rows(rows, stride_row, HEADS: tl.constexpr, STRIDE_OUTER: tl.constexpr):
    """The element offsets of rows (int64) in a [M / HEADS, HEADS, N] view: row r is head
    r % HEADS of group r // HEADS (rmsnorm_fwd_kernel's HEADS)."""
    return (rows // HEADS) * STRIDE_OUTER + (rows % HEADS) * stride_row


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_bwd_kernel(
    X,  # [M, N] forward input
    W,  # [N] weight
    DY,  # [M, N] upstream gradient
    RSTD,  # [M] fp32, from the forward
    DX,  # [M, N] output gradient, dtype of X
    DW_PARTIAL,  # [programs, N] fp32: this program's share of dw
    DH_OUT,  # [M, N] gradient arriving on the residual output h (HAS_DH_OUT only)
    stride_x_row,
    stride_dy_row,
    stride_dx_row,
    stride_dh_row,
    M,
    N,
    rows_per_program,
    offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    BLOCK_M: tl.constexpr,  # rows per step: more bytes in flight for narrow rows
    BLOCK_N: tl.constexpr,
    HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,  # software pipelining of the row loop (1: none; see below)
    HOLD_STORAGE_FORM: tl.constexpr = False,  # wide rows on a GPU only (inline PTX; see below)
    HEADS: tl.constexpr = 1,  # > 1: x's rows in two levels, as in rmsnorm_fwd_kernel
    STRIDE_X_OUTER: tl.constexpr = 0,  # HEADS > 1 only: x's stride between groups of HEADS rows
):
    """Each program walks a contiguous chunk of rows, BLOCK_M rows per step, and owns one fp32
    dw accumulator.

    With LOOP_STAGES = S >= 3 the loads of the next S - 2 steps are in flight (cp.async into
    shared memory) while a step computes: with one program per SM, the loop itself is what keeps
    bytes in flight (at S = 2 Triton issues the next step's loads only after this step's
    stores). Triton pipelines a loop without dot products only when the loop asks for it
    (tl.range's num_stages); the launch's num_stages alone leaves it unpipelined.

    With x_hat = x * rstd and g = (offset + w) * dy:
        dx = rstd * (g - x_hat * mean(g * x_hat))
        dw = sum over rows of dy * x_hat
    dx and the dw contribution come from the same loads of x and dy; rstd is read back, not
    recomputed. No atomics: the caller sums the [programs, N] partials once.

    A step makes two passes over its rows, mean(g * x_hat) and then dx and dw, and between them
    holds x and dy upcast to fp32 beside w and the accumulator: at BLOCK_N = 16384 that spills
    (ptxas, Triton 3.6, sm_90, bf16: 168 bytes at 16 warps, 104 at 32). With HOLD_STORAGE_FORM
    it holds them as loaded (half the registers for 16-bit dtypes) and the second pass upcasts
    them again, through inline PTX so that the compiler cannot merge the two conversions and
    keep the fp32 values live after all. At 16384 that ends the spills for bf16 and cuts them
    for fp16 (48-72 bytes, from 100-204), with a residual's gradient (48, from 192) and with one
    of x and dy in fp32. Same formulas on the same values: dw is bitwise the plain kernel's; dx
    may differ in its last bit, since the compiler contracts g - x_hat * mean into a different
    fma once g is recomputed.

    With HEADS > 1, x (only: dy, dx and dh_out are [M, N]) is read in two levels as in
    rmsnorm_fwd_kernel: the forward's [M / HEADS, HEADS, N] view, not a copy of it.
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N

    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)

    # int64 row indices: row * stride may pass 2**31 for large M * N.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for block_start in tl.range(row_start, row_end, BLOCK_M, num_stages=LOOP_STAGES):
        rows = block_start + tl.arange(0, BLOCK_M)
        dy, x_hat = _bwd_rows_dx(
            X, DY, RSTD, DX, DH_OUT, w, rows, rows < row_end, cols, col_mask,
            stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, N,
            HAS_DH_OUT, HOLD_STORAGE_FORM, HEADS, STRIDE_X_OUTER,
        )  # fmt: skip
        dw_acc += dy * x_hat

    tl.store(DW_PARTIAL + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


@triton.jit
def _bwd_rows_dx(
    X, DY, RSTD, DX, DH_OUT, w, rows, row_mask, cols, col_mask,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, N,
    HAS_DH_OUT: tl.constexpr, HOLD_STORAGE_FORM: tl.constexpr,
    HEADS: tl.constexpr, STRIDE_X_OUTER: tl.constexpr,
):  # fmt: skip
    """dx of a [BLOCK_M, BLOCK_N] tile of rows (w: offset + w in fp32; x's rows in two levels
    with HEADS > 1); returns dy and x_hat in fp32, the factors of the tile's dw contribution (a
    caller that does not use them costs nothing: the compiler drops what is not used)."""
    mask = row_mask[:, None] & col_mask[None, :]
    if HEADS == 1:
        x_loaded = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    else:
        x_at = _two_level_rows(rows, stride_x_row, HEADS, STRIDE_X_OUTER)
        x_loaded = tl.load(X + x_at[:, None] + cols[None, :], mask=mask, other=0.0)
    dy_loaded = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
    dy = dy_loaded.to(tl.float32)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)

    x_hat = x_loaded.to(tl.float32) * rstd[:, None]
    g = w[None, :] * dy
    mean_gx = tl.sum(g * x_hat, axis=1) / N
    if HOLD_STORAGE_FORM:  # second pass: from the values as loaded, upcast again
        x_hat = _upcast_opaque(x_loaded) * rstd[:, None]
        dy = _upcast_opaque(dy_loaded)
        g = w[None, :] * dy
    dx = (g - x_hat * mean_gx[:, None]) * rstd[:, None]
    if HAS_DH_OUT:
        dh = tl.load(DH_OUT + rows[:, None] * stride_dh_row + cols[None, :], mask=mask, other=0.0)
        dx += dh.to(tl.float32)
    tl.store(
        DX + rows[:, None] * stride_dx_row + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask
    )
    return dy, x_hat


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def rmsnorm_bwd_two_role_kernel(
    X, W, DY, RSTD, DX, DW, DH_OUT,
    stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, M, N, rows_per_program, offset,
    ROWS_BUCKET,  # bit length of M: part of the autotuning key only, unused here
    row_programs,  # after rmsnorm_bwd_kernel's arguments, which come first in the same order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DH_OUT: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    COL_BLOCK: tl.constexpr, COL_ROWS: tl.constexpr, COL_STAGES: tl.constexpr,
):  # fmt: skip
    """The small backward in one launch, without dw partials: two roles by program id.

    Programs below row_programs write dx for a contiguous chunk of rows, as rmsnorm_bwd_kernel
    does, and accumulate nothing. Each program from row_programs on owns COL_BLOCK columns and
    walks every row, COL_ROWS at a time, for dw = sum over rows of dy * x_hat, in fp32 and in a
    fixed order (bitwise reproducible), rounded once to the weight's dtype. dw needs nothing
    the row programs compute (rstd comes from the forward), so the roles run side by side: no
    partials, no second launch, no atomics. x and dy are read by both roles; the launch offers
    this kernel only where they fit in L2 twice over, so the second read is mostly a hit.
    """
    pid = tl.program_id(0)
    if pid < row_programs:
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < N
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
        row_start = pid.to(tl.int64) * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, M)
        for block_start in tl.range(row_start, row_end, BLOCK_M, num_stages=LOOP_STAGES):
            rows = block_start + tl.arange(0, BLOCK_M)
            _bwd_rows_dx(
                X, DY, RSTD, DX, DH_OUT, w, rows, rows < row_end, cols, col_mask,
                stride_x_row, stride_dy_row, stride_dx_row, stride_dh_row, N, HAS_DH_OUT, False,
                1, 0,
            )  # fmt: skip
    else:
        _dw_of_columns(
            X, DY, RSTD, DW, stride_x_row, stride_dy_row, M, N, pid - row_programs,
            COL_BLOCK, COL_ROWS, COL_STAGES,
        )  # fmt: skip


@triton.jit
def _dw_of_columns(
    X, DY, RSTD, DW, stride_x_row, stride_dy_row, M, N, column_block,
    COL_BLOCK: tl.constexpr, COL_ROWS: tl.constexpr, COL_STAGES: tl.constexpr,
):  # fmt: skip
    """dw of one block of COL_BLOCK columns over all M rows (rmsnorm_bwd_two_role_kernel)."""
    cols = column_block * COL_BLOCK + tl.arange(0, COL_BLOCK)
    col_mask = cols < N
    acc = tl.zeros([COL_ROWS, COL_BLOCK], dtype=tl.float32)
    for start in tl.range(0, M, COL_ROWS, num_stages=COL_STAGES):
        rows = start + tl.arange(0, COL_ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        r64 = rows[:, None].to(tl.int64)
        x = tl.load(X + r64 * stride_x_row + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + r64 * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        acc += dy.to(tl.float32) * (x.to(tl.float32) * rstd[:, None])
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=col_mask)


#: _upcast_opaque's inline PTX, two 16-bit values (one 32-bit register) to two fp32; the Gluon
#: kernels (gluon_kernels.py) use the same. A bf16 is the top half of its fp32.
BF16X2_TO_FP32_PTX: tl.constexpr = tl.constexpr("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000;")
FP16X2_TO_FP32_PTX: tl.constexpr = tl.constexpr(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }"
)


@triton.jit
def _upcast_opaque(v):
    """v upcast to fp32 in inline PTX for 16-bit dtypes (two values a 32-bit register), which
    the compiler cannot merge with another conversion of v; fp32 passes through. NVIDIA only,
    and not under the interpreter. is_pure=False on purpose: a pure asm may be hoisted back next
    to the load, where it would keep the fp32 values live again."""
    if v.dtype == tl.bfloat16:
        out = tl.inline_asm_elementwise(
            BF16X2_TO_FP32_PTX, "=r,=r,r", [v], dtype=tl.float32, is_pure=False, pack=2
        )
    elif v.dtype == tl.float16:
        out = tl.inline_asm_elementwise(
            FP16X2_TO_FP32_PTX, "=r,=r,r", [v], dtype=tl.float32, is_pure=False, pack=2
        )
    else:
        out = v.to(tl.float32)
    return out


# ---- rows not 16-byte aligned: odd N and the like ---------------------------------------------


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


# ---- wide rows: N above what one tile holds in registers --------------------------------------


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
