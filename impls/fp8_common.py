"""What the rmsnorm_fp8 backends share: the call signature and the unsupported-case signal.

fn(x, weight, eps, *, scaling, scale, residual, fp8_dtype) -> (q, scales, h, dy_port):
scaling "per_token" | "per_tensor" (scale: one fp32 on x's device) | "block" (1 x 128); h is
x + r with a residual, else None; dy_port the tensor whose gradient is the dequantized y's
(None for forward-only backends). A case a backend cannot run raises Fp8Unsupported.
"""

from __future__ import annotations


class Fp8Unsupported(Exception):
    """This backend cannot run this (scaling, residual, shape, fp8 dtype) case; the message says
    why."""
