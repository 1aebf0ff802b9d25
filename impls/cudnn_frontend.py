"""cuDNN's RMSNorm through the cuDNN frontend (pip install nvidia-cudnn-frontend).

``cudnn.ops.norm.rms_norm(input, weight, bias=None, eps=1e-5)`` (read from
nvidia-cudnn-frontend 1.32.0, ``cudnn/ops/norm/rmsnorm.py``): a torch custom op
(``torch.ops.cudnn.rmsnorm``, with ``rmsnorm_bwd`` registered as its autograd) that builds one
cuDNN graph per (shape, strides, dtype), cached, with fp32 intermediate and compute types, so
y is rounded once and dscale is an fp32 sum rounded once to the weight dtype. It reshapes the
input to a contiguous [rows, N, 1, 1] tensor: a strided input (the qk-norm preset) is copied
inside the call, and that copy is in its time. This is the cuDNN path TransformerEngine selects.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import Backend, RMSNormFn


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (cuDNN runs on CUDA only)"
    try:
        from cudnn.ops.norm import rms_norm  # noqa: F401
    except Exception as exc:  # missing wheel or libcudnn: a reason, never a crash
        return (
            f"cudnn.ops.norm does not import ({type(exc).__name__}: {exc}); "
            "pip install nvidia-cudnn-frontend (>= 1.32 has cudnn.ops.norm)"
        )
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    return None


def _build() -> RMSNormFn:
    from cudnn.ops.norm import rms_norm

    def cudnn_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps=eps)

    return cudnn_rmsnorm


BACKEND = Backend(
    name="cudnn",
    label="cuDNN frontend rms_norm (graph API)",
    build=_build,
    numerics="fused_fp32",
    own_backward=True,
    unavailable=_unavailable,
    unsupported=_unsupported,
)
