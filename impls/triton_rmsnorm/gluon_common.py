"""The Gluon pieces that the held-row and the grouped kernels share: the cp.async load, the
upcasts to fp32, and the backward's staging of a row's chunks of x and dy into a shared-memory
ring and its second pass over one staged chunk."""

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
def _stage_chunk(X_RING, DY_RING, slot, X, DY, stride_x_row, stride_dy_row, row, row_end, cols,
                 N: gl.constexpr):  # fmt: skip
    """One cp.async group: a chunk of a row's x and dy into ring slot `slot` (zeros outside
    the row, and for rows past the program's last, whose group still counts)."""
    mask = (cols < N) & (row < row_end)
    _async_load(X_RING.index(slot), X + row * stride_x_row + cols, mask=mask)
    _async_load(DY_RING.index(slot), DY + row * stride_dy_row + cols, mask=mask)
    async_copy.commit_group()


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
