"""NVIDIA Apex FusedRMSNorm (apex.normalization.fused_rms_norm_affine).

Numerics: Apex's forward stores gamma * static_cast<T>(invvar * x) (csrc/layer_norm_cuda_kernel.cu,
cuApplyLayerNorm_): x_hat is rounded to the storage dtype before the weight multiply, which rounds
again. Its backward clamps |gamma| to at least eps (clamp_by_magnitude), wrong where |w| < eps.

Only an installed Apex is imported; nothing of Apex is part of this project. Apex is not on PyPI
(the PyPI package named ``apex`` is unrelated): build it from the NVIDIA/apex sources with its
CUDA extensions, e.g. ``APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation .``
in a clone of that repository.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import Backend, RMSNormFn

_HOW_TO_GET = (
    "build NVIDIA Apex from its GitHub sources with CUDA extensions "
    "(APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install --no-build-isolation .); "
    "PyPI's 'apex' is an unrelated package"
)


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (Apex's fused_layer_norm_cuda runs on CUDA only)"
    try:
        import fused_layer_norm_cuda  # noqa: F401
        from apex.normalization.fused_layer_norm import fused_rms_norm_affine  # noqa: F401
    except Exception as exc:  # any import failure (missing, wrong ABI) is a reason, not a crash
        return f"Apex with CUDA extensions does not import ({type(exc).__name__}: {exc}); " + (
            _HOW_TO_GET
        )
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    return None


def _build() -> RMSNormFn:
    from apex.normalization.fused_layer_norm import fused_rms_norm_affine

    def apex_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return fused_rms_norm_affine(x, weight, weight.shape, eps)

    return apex_rmsnorm


BACKEND = Backend(
    name="apex",
    label="NVIDIA Apex FusedRMSNorm",
    build=_build,
    numerics="two_roundings",
    own_backward=True,
    unavailable=_unavailable,
    unsupported=_unsupported,
)
