"""Triton kernel of RMSNorm with fp8 output: the norm and its quantization in one pass.

    y = x * rstd * (offset + w),   rstd = 1 / sqrt(mean(x^2) + eps)   (fp32, as kernels.py)
    q = sat(rn(y / scale)),        dequantized: q * scale

scale is one fp32 per row (SCALING 0, per token: amax(|y|) over the row / FP8_MAX), the
caller's one fp32 (SCALING 1, per tensor, read from device memory: no host sync), or one fp32
per GROUP columns of a row (SCALING 2, 1 x 128 blocks: amax over the group / FP8_MAX). A
dynamic scale is floored at FLT_MIN (2**-126), so that an all-zero row or block quantizes to
zeros, not 0 / 0. The division is correctly rounded (div_rn), the saturation explicit (|v| >
FP8_MAX -> +-FP8_MAX; NaN compares false and stays NaN), and the amax propagates NaN: a row
(block) holding a NaN gets a NaN scale and NaN codes.

One tile of BLOCK_M whole rows (BLOCK_N = the row padded to a power of two, at least GROUP
with block scaling): x (and r) read once, q (and h) written once, one rstd per row for the
backward, which is the plain op's (launch.rmsnorm_backward): the quantization is straight
through. Padding columns load as 0, so they never raise an amax.

CAST_IN_KERNEL False stores v = sat(y / scale) in fp32 instead of its fp8 code, for the
launcher to convert with torch: Triton's CPU interpreter (3.9) converts fp32 -> fp8 wrongly
(ties away from even, a rounding carry lost into the exponent, NaN and overflow wrapped, fp8
subnormals flushed; see fp8.py), so the CPU tests check everything but the cast instruction
itself, which the GPU tests check bitwise.
"""

import triton
import triton.language as tl

FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # 2**-126, the smallest normal fp32


@triton.jit
def _max_propagating_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _sum_and_max(sum_a, max_a, sum_b, max_b):
    return sum_a + sum_b, _max_propagating_nan(max_a, max_b)


@triton.jit
def _dynamic_scale(amax, FP8_MAX: tl.constexpr):
    """amax / FP8_MAX, correctly rounded, floored at FLT_MIN (NaN stays NaN)."""
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32))
    return tl.where(scale < FLT_MIN, FLT_MIN, scale)


@triton.jit
def _saturated(v, FP8_MAX: tl.constexpr):
    """Clamped to +-FP8_MAX; NaN compares false and stays NaN."""
    v = tl.where(v > FP8_MAX, FP8_MAX, v)
    return tl.where(v < -FP8_MAX, -FP8_MAX, v)


@triton.jit
def _tile_source(X, R, H, rows, cols, mask, stride_x_row, stride_r_row, stride_h_row,
                 HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """One tile of the normalized input in fp32: x, or h = x + r rounded to H's dtype (stored)."""
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r_row + cols[None, :], mask=mask, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h_row + cols[None, :], h, mask=mask)
        x = h
    return x.to(tl.float32)


@triton.jit
def _row_sum(v, SCALAR: tl.constexpr):
    """v summed across each row: [BLOCK_M] values, or (SCALAR, one row a tile) a scalar, in no
    layout, which the two tiles of a split row combine without converting either."""
    if SCALAR:  # noqa: SIM108 (a constexpr branch: one side is built)
        total = tl.sum(v)
    else:
        total = tl.sum(v, axis=1)
    return total


@triton.jit
def _row_amax(v, SCALAR: tl.constexpr):
    """max |v| across each row (NaN propagates), as _row_sum shapes it."""
    if SCALAR:
        amax = tl.reduce(tl.abs(v), None, _max_propagating_nan)
    else:
        amax = tl.reduce(tl.abs(v), 1, _max_propagating_nan)
    return amax


@triton.jit
def _row_sum_and_amax(a, b, SCALAR: tl.constexpr):
    """(sum a, max |b|) across each row in one reduction, as _row_sum shapes it."""
    total, amax = tl.reduce((a, tl.abs(b)), 1, _sum_and_max)
    if SCALAR:  # the one row's values to scalars (axis None: Triton's interpreter refuses tuples)
        total, amax = tl.reduce((total, amax), 0, _sum_and_max)
    return total, amax


@triton.jit
def _column(v, SCALAR: tl.constexpr):
    """A per-row value broadcast along the row."""
    if SCALAR:  # noqa: SIM108 (a constexpr branch: one side is built)
        column = v
    else:
        column = v[:, None]
    return column


@triton.jit
def _store_per_row(ptrs, v, row_mask, BLOCK_M: tl.constexpr, SCALAR: tl.constexpr):
    if SCALAR:
        v = v + tl.zeros([BLOCK_M], tl.float32)
    tl.store(ptrs, v, mask=row_mask)


@triton.jit
def _weight_row(W, cols, N, AS_ROW: tl.constexpr):
    """w over cols as a [1, WIDTH] row: loaded as that row, in x's layout (AS_ROW), or as a
    vector in a layout of its own, then broadcast (Triton converts it through shared memory
    where x's layout holds more elements a thread than a 16-byte load of w)."""
    if AS_ROW:
        return tl.load(W + cols[None, :], mask=(cols < N)[None, :], other=0.0)
    return tl.load(W + cols, mask=cols < N, other=0.0)[None, :]


@triton.jit
def _weight(W, cols, N, offset, early, EARLY: tl.constexpr, AS_ROW: tl.constexpr):
    """offset + w over cols in fp32, as a [1, WIDTH] row: from the row loaded early (EARLY:
    _weight_row's, issued with x), else loaded here."""
    if EARLY:  # noqa: SIM108 (a constexpr branch: one side is built)
        w = early
    else:
        w = _weight_row(W, cols, N, AS_ROW)
    return w.to(tl.float32) + offset


@triton.jit
def _block_values(y, rows, row_mask, first_group, SCALES, stride_s_row, stride_s_col, N,
                  FP8_MAX: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                  WIDTH: tl.constexpr, RECIPROCAL: tl.constexpr):  # fmt: skip
    """y / scale for a tile of WIDTH columns starting at group first_group, one scale per GROUP
    columns (amax / FP8_MAX, stored; groups past N are not)."""
    y3 = tl.reshape(y, [BLOCK_M, WIDTH // GROUP, GROUP])
    scale = _dynamic_scale(tl.reduce(tl.abs(y3), 2, _max_propagating_nan), FP8_MAX)
    groups = first_group + tl.arange(0, WIDTH // GROUP)
    group_mask = row_mask[:, None] & (groups < (N + GROUP - 1) // GROUP)[None, :]
    offsets = rows[:, None] * stride_s_row + groups[None, :] * stride_s_col
    tl.store(SCALES + offsets, scale, mask=group_mask)
    if RECIPROCAL:
        inverse = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
        return tl.reshape(y3 * inverse[:, :, None], [BLOCK_M, WIDTH])
    return tl.reshape(tl.math.div_rn(y3, scale[:, :, None]), [BLOCK_M, WIDTH])


@triton.jit
def _store_codes(v, Q, rows, cols, mask, stride_q_row, FP8_MAX: tl.constexpr,
                 CAST_IN_KERNEL: tl.constexpr, SATURATE: tl.constexpr,
                 NARROW_CODES: tl.constexpr = False):  # fmt: skip
    """NARROW_CODES: the columns written so that Triton's axis analysis sees runs of 8 (the same
    offsets): its coalescing then stores 8 codes a thread, in 8-byte vectors, the layout of a
    16-bit tile's 16-byte vectors, instead of 16 codes a thread."""
    if SATURATE or not CAST_IN_KERNEL:
        v = _saturated(v, FP8_MAX)
    if NARROW_CODES:
        cols = (cols // 8) * 8 + cols % 8
    q_ptrs = Q + rows[:, None] * stride_q_row + cols[None, :]
    if CAST_IN_KERNEL:
        tl.store(q_ptrs, v.to(Q.dtype.element_ty), mask=mask)
    else:
        tl.store(q_ptrs, v, mask=mask)


@triton.jit
def rmsnorm_fp8_fwd_kernel(
    X,  # [M, N] input, rows strided by stride_x_row, last dim contiguous
    W,  # [N] weight
    Q,  # [M, N] output: fp8 codes (CAST_IN_KERNEL) or fp32 saturated values
    SCALES,  # per token [M] / block [M, ceil(N / GROUP)] fp32 output (unused per tensor)
    RSTD,  # [M] fp32, saved for the backward
    R,  # [M, N] residual (HAS_RESIDUAL only)
    H,  # [M, N] output h = x + r, dtype of X (HAS_RESIDUAL only)
    STATIC_SCALE,  # [1] fp32, the caller's scale (per tensor only)
    stride_x_row,
    stride_q_row,
    stride_r_row,
    stride_h_row,
    stride_s_row,  # SCALES' strides: row-major or column-major block scales
    stride_s_col,
    M,
    N: tl.constexpr,
    eps,
    offset,
    FP8_MAX: tl.constexpr,  # the fp8 format's largest finite value (448 e4m3fn, 57344 e5m2)
    SCALING: tl.constexpr,  # 0 per token, 1 per tensor, 2 blocks of GROUP columns
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,  # BLOCK_N // GROUP (block scaling)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    CAST_IN_KERNEL: tl.constexpr,
    ROWS_CONTIGUOUS: tl.constexpr = False,  # every row stride is N: the strides are ignored
    RECIPROCAL: tl.constexpr = False,  # y * rn(1 / scale) instead of rn(y / scale) (see below)
    W_EARLY: tl.constexpr = False,  # load w with x: grids of at most one program an SM
    WAIT_FOR_PRIOR_GRID: tl.constexpr = False,  # launched with PDL: griddepcontrol.wait first
    SATURATE: tl.constexpr = True,  # clamp to +-FP8_MAX before the cast (see below)
    TAIL_N: tl.constexpr = 0,  # > 0: columns BLOCK_N.. in a second tile of TAIL_N (see below)
    AMAX_WITH_SUM: tl.constexpr = False,  # per token: the amax in the sum's reduction (below)
    W_AS_ROW: tl.constexpr = False,  # load w as a [1, BLOCK_N] row in x's layout (_weight_row)
    ROW_SCALARS: tl.constexpr = False,  # BLOCK_M 1 and TAIL_N: a row's values as scalars
    # (_row_sum): the two tiles' sums then meet without converting a tile between layouts
    NARROW_CODES: tl.constexpr = False,  # the codes stored 8 a thread (_store_codes; below)
):
    """RECIPROCAL divides once per scale (a row, a block, the tensor) and multiplies each
    element: rn(y * rn(1 / s)) is within 2 roundings (2**-23 relative) of y / s, so a code can
    differ from the exact division's only next to a tie, inside the oracle's window (its
    5-ulp constant term). A per-element div.rn.f32 is a long instruction sequence, which at
    16-bit row widths may cost more than the memory traffic. A static scale whose reciprocal
    overflows (s < 2**-126) is divided exactly, so that 0 / s stays 0 rather than 0 * inf.

    WAIT_FOR_PRIOR_GRID: as kernels.rmsnorm_fwd_kernel's (programmatic dependent launch: wait on
    the kernel ahead before any load or store).

    SATURATE False leaves the clamp to the cast: on sm_89 and later the fp32 -> fp8 conversion is
    cvt.rn.satfinite, which clamps to +-FP8_MAX and keeps NaN, as the explicit clamp does (two
    compares and two selects an element fewer). Only with CAST_IN_KERNEL: torch's conversion of
    the stored fp32 values does not saturate.

    TAIL_N > 0 splits the row in two tiles instead of padding it: columns 0..BLOCK_N (BLOCK_N <= N,
    no padding) and BLOCK_N..BLOCK_N + TAIL_N (padded past N), e.g. 4608 = 4096 + 512 where the
    one tile would be 8192 wide. Every element is computed once, as in one tile; the sum of
    squares adds the two tiles' sums (another order than one tile's: its own bits), the amax
    takes the larger, and per block the tail's groups follow the main tile's (BLOCK_N and
    TAIL_N multiples of GROUP).

    NARROW_CODES: with a residual, h's 16-bit store takes 8 elements a thread (its 16-byte
    vectors) while the codes' store takes 16, so Triton converts the tile through shared memory
    between them (4 KB a row at 2048 columns, 2 barriers more). Stored 8 a thread, the codes
    share h's layout: no conversion, twice the store instructions (8-byte vectors). The tile's
    layout also orders the sum of squares, so the bits may differ from the 16-a-thread form's.

    AMAX_WITH_SUM (per token): y = (x * w) * rstd instead of (x * rstd) * w, so that amax|y| =
    rn(amax|x * w| * rstd) exactly (rounding is monotonic; rstd > 0 and finite: with eps = 0, a
    row whose squares all underflow gets an inf scale here and a NaN one the other way, NaN
    codes both ways), and max|x * w| rides in
    the sum of squares' reduction: one reduction across the row instead of two. w is loaded
    with x. y's bits can differ from the other order's by an ulp, so a code next to a tie may
    differ (within the oracle's window)."""
    if WAIT_FOR_PRIOR_GRID:
        tl.extra.cuda.gdc_wait()
    if ROWS_CONTIGUOUS:  # constant row offsets, as rmsnorm_fwd_kernel's
        stride_x_row = N
        stride_q_row = N
        stride_r_row = N
        stride_h_row = N
    tile = tl.program_id(0).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    if TAIL_N > 0:
        mask = row_mask[:, None] & (cols < BLOCK_N)[None, :]  # every column real: rows only
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_mask = row_mask[:, None] & (tail_cols < N)[None, :]
    else:
        mask = row_mask[:, None] & (cols < N)[None, :]
    w_early = None
    w_tail_early = None
    if W_EARLY:  # as kernels.rmsnorm_fwd_kernel's: no other program hides w's latency
        w_early = _weight_row(W, cols, N, W_AS_ROW)
        if TAIL_N > 0:
            w_tail_early = _weight_row(W, tail_cols, N, W_AS_ROW)
    x = _tile_source(X, R, H, rows, cols, mask, stride_x_row, stride_r_row, stride_h_row,
                     HAS_RESIDUAL)  # fmt: skip
    if TAIL_N > 0:
        x_tail = _tile_source(X, R, H, rows, tail_cols, tail_mask, stride_x_row, stride_r_row,
                              stride_h_row, HAS_RESIDUAL)  # fmt: skip
    if AMAX_WITH_SUM:  # w first: x * w enters the reduction
        w = _weight(W, cols, N, offset, w_early, W_EARLY, W_AS_ROW)
        xw = x * w
        sum_sq, amax_xw = _row_sum_and_amax(x * x, xw, ROW_SCALARS)
        if TAIL_N > 0:
            w_tail = _weight(W, tail_cols, N, offset, w_tail_early, W_EARLY, W_AS_ROW)
            xw_tail = x_tail * w_tail
            tail_sum, tail_amax = _row_sum_and_amax(x_tail * x_tail, xw_tail, ROW_SCALARS)
            sum_sq += tail_sum
            amax_xw = _max_propagating_nan(amax_xw, tail_amax)
        rstd = 1.0 / tl.sqrt_rn(sum_sq / N + eps)
        y = xw * _column(rstd, ROW_SCALARS)
        if TAIL_N > 0:
            y_tail = xw_tail * _column(rstd, ROW_SCALARS)
    else:
        if ROW_SCALARS:
            sum_sq = _row_sum(x * x, True) + _row_sum(x_tail * x_tail, True)
        else:
            sum_sq = tl.sum(x * x, axis=1)
            if TAIL_N > 0:
                sum_sq += tl.sum(x_tail * x_tail, axis=1)
        mean_sq = sum_sq / N
        rstd = 1.0 / tl.sqrt_rn(mean_sq + eps)
        w = _weight(W, cols, N, offset, w_early, W_EARLY, W_AS_ROW)
        y = x * _column(rstd, ROW_SCALARS) * w
        if TAIL_N > 0:
            w_tail = _weight(W, tail_cols, N, offset, w_tail_early, W_EARLY, W_AS_ROW)
            y_tail = x_tail * _column(rstd, ROW_SCALARS) * w_tail
    if SCALING == 0:
        if AMAX_WITH_SUM:
            amax = amax_xw * rstd  # = max|y|: rn is monotonic and rstd > 0
        else:
            amax = _row_amax(y, ROW_SCALARS)
            if TAIL_N > 0:
                amax = _max_propagating_nan(amax, _row_amax(y_tail, ROW_SCALARS))
        scale = _dynamic_scale(amax, FP8_MAX)
        _store_per_row(SCALES + rows * stride_s_row, scale, row_mask, BLOCK_M, ROW_SCALARS)
        if RECIPROCAL:  # scale >= FLT_MIN: 1 / scale <= 2**126, finite (or NaN with the scale)
            inverse = _column(tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale),
                              ROW_SCALARS)  # fmt: skip
            v = y * inverse
            if TAIL_N > 0:
                v_tail = y_tail * inverse
        elif ROW_SCALARS:
            v = tl.math.div_rn(y, tl.full(y.shape, 0.0, tl.float32) + scale)
            v_tail = tl.math.div_rn(y_tail, tl.full(y_tail.shape, 0.0, tl.float32) + scale)
        else:
            v = tl.math.div_rn(y, scale[:, None])
            if TAIL_N > 0:
                v_tail = tl.math.div_rn(y_tail, scale[:, None])
    elif SCALING == 1:
        scale = tl.load(STATIC_SCALE)
        if RECIPROCAL:
            inverse = tl.math.div_rn(scale * 0.0 + 1.0, scale)  # one division, a scalar
            if inverse < float("inf"):  # False for inf and NaN: those divide exactly
                v = y * inverse
                if TAIL_N > 0:
                    v_tail = y_tail * inverse
            else:
                v = tl.math.div_rn(y, tl.full(y.shape, 0.0, tl.float32) + scale)
                if TAIL_N > 0:
                    v_tail = tl.math.div_rn(y_tail, tl.full(y_tail.shape, 0.0, tl.float32) + scale)
        else:
            v = tl.math.div_rn(y, tl.full(y.shape, 0.0, tl.float32) + scale)
            if TAIL_N > 0:
                v_tail = tl.math.div_rn(y_tail, tl.full(y_tail.shape, 0.0, tl.float32) + scale)
    else:
        v = _block_values(y, rows, row_mask, 0, SCALES, stride_s_row, stride_s_col, N, FP8_MAX,
                          GROUP, BLOCK_M, BLOCK_N, RECIPROCAL)  # fmt: skip
        if TAIL_N > 0:
            v_tail = _block_values(y_tail, rows, row_mask, GROUPS, SCALES, stride_s_row,
                                   stride_s_col, N, FP8_MAX, GROUP, BLOCK_M, TAIL_N, RECIPROCAL)  # fmt: skip
    _store_codes(v, Q, rows, cols, mask, stride_q_row, FP8_MAX, CAST_IN_KERNEL, SATURATE,
                 NARROW_CODES)  # fmt: skip
    if TAIL_N > 0:
        _store_codes(v_tail, Q, rows, tail_cols, tail_mask, stride_q_row, FP8_MAX,
                     CAST_IN_KERNEL, SATURATE, NARROW_CODES)  # fmt: skip
    _store_per_row(RSTD + rows, rstd, row_mask, BLOCK_M, ROW_SCALARS)


@triton.jit
def _fp8_source_chunk(X, R, x_row, r_row, c, mask, HAS_RESIDUAL: tl.constexpr, H_TY):
    """A chunk of the normalized input in fp32: x, or h = x + r rounded to H's dtype (the
    single-tile kernel's h), recomputed from x and r at each pass."""
    x = tl.load(X + x_row + c, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + r_row + c, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(H_TY)
    return x.to(tl.float32)


@triton.jit
def rmsnorm_fp8_fwd_looped_kernel(
    X, W, Q, SCALES, RSTD, R, H, STATIC_SCALE,
    stride_x_row, stride_q_row, stride_r_row, stride_h_row, stride_s_row, stride_s_col,
    M, N, eps, offset,
    FP8_MAX: tl.constexpr,
    SCALING: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,  # columns a step, a multiple of GROUP
    HAS_RESIDUAL: tl.constexpr,
    CAST_IN_KERNEL: tl.constexpr,
    RECIPROCAL: tl.constexpr = False,
):  # fmt: skip
    """rmsnorm_fp8_fwd_kernel's result for rows wider than one tile holds: one program a row,
    the row walked in CHUNK-column steps. Pass 1 sums x^2 (and writes h); per token, pass 2
    takes amax(|y|) (a maximum: the same scale as one tile's, in any order); the last pass
    quantizes (per block, each GROUP's scale from its own step). x (and r) are read two or
    three times, the later passes mostly from L2; q written once. The sum of squares runs in
    chunk order (fp32, rounded once), not the single tile's order: no N has both kernels."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CHUNK)
    x_row = row * stride_x_row
    r_row = row * stride_r_row
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for start in range(0, N, CHUNK):
        c = start + cols
        mask = c < N
        x = _fp8_source_chunk(X, R, x_row, r_row, c, mask, HAS_RESIDUAL, H.dtype.element_ty)
        if HAS_RESIDUAL:
            tl.store(H + row * stride_h_row + c, x.to(H.dtype.element_ty), mask=mask)
        acc += x * x
    rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps)
    if SCALING == 0:
        amax = tl.zeros([CHUNK], dtype=tl.float32)
        for start in range(0, N, CHUNK):
            c = start + cols
            mask = c < N
            x = _fp8_source_chunk(X, R, x_row, r_row, c, mask, HAS_RESIDUAL, H.dtype.element_ty)
            w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32) + offset
            amax = _max_propagating_nan(amax, tl.abs(x * rstd * w))
        scale = _dynamic_scale(tl.reduce(amax, 0, _max_propagating_nan), FP8_MAX)
        tl.store(SCALES + row * stride_s_row, scale)
        inverse = tl.math.div_rn(scale * 0.0 + 1.0, scale)
    elif SCALING == 1:
        scale = tl.load(STATIC_SCALE)
        inverse = tl.math.div_rn(scale * 0.0 + 1.0, scale)
    groups = tl.arange(0, CHUNK // GROUP)
    for start in range(0, N, CHUNK):
        c = start + cols
        mask = c < N
        x = _fp8_source_chunk(X, R, x_row, r_row, c, mask, HAS_RESIDUAL, H.dtype.element_ty)
        w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32) + offset
        y = x * rstd * w
        if SCALING == 2:
            y2 = tl.reshape(y, [CHUNK // GROUP, GROUP])
            block_scale = _dynamic_scale(tl.reduce(tl.abs(y2), 1, _max_propagating_nan), FP8_MAX)
            group = start // GROUP + groups
            tl.store(SCALES + row * stride_s_row + group * stride_s_col, block_scale,
                     mask=group < (N + GROUP - 1) // GROUP)  # fmt: skip
            if RECIPROCAL:
                block_inverse = tl.math.div_rn(tl.full(block_scale.shape, 1.0, tl.float32),
                                               block_scale)  # fmt: skip
                v = tl.reshape(y2 * block_inverse[:, None], [CHUNK])
            else:
                v = tl.reshape(tl.math.div_rn(y2, block_scale[:, None]), [CHUNK])
        elif SCALING == 0 and RECIPROCAL:  # a dynamic scale: 1 / scale finite, or NaN with it
            v = y * inverse
        elif RECIPROCAL:
            if inverse < float("inf"):  # False for a static scale < 2**-126 (or inf, NaN)
                v = y * inverse
            else:
                v = tl.math.div_rn(y, tl.full([CHUNK], 0.0, tl.float32) + scale)
        else:
            v = tl.math.div_rn(y, tl.full([CHUNK], 0.0, tl.float32) + scale)
        v = _saturated(v, FP8_MAX)
        q_ptrs = Q + row * stride_q_row + c
        if CAST_IN_KERNEL:
            tl.store(q_ptrs, v.to(Q.dtype.element_ty), mask=mask)
        else:
            tl.store(q_ptrs, v, mask=mask)
    tl.store(RSTD + row, rstd)
