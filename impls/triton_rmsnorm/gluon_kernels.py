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
