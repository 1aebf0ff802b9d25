"""The kernels' inline-PTX upcast of 16-bit values to fp32, two a 32-bit register, which the
compiler cannot merge with another conversion of the same values: the single-tile kernels hold
rows as loaded and upcast them again with it (kernels.py, shifted_kernels.py), and the Gluon
kernels use the same PTX (gluon_kernels.py). NVIDIA only, not under the interpreter
(common._inline_ptx_runs)."""

import triton
import triton.language as tl

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
