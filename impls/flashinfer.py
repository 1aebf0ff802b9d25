"""FlashInfer's norm kernels (pip install flashinfer-python; forward only).

What vLLM, SGLang (whose sgl-kernel derives from it) and TensorRT-LLM call. Read from
flashinfer-python 0.7.2.post1 (``flashinfer/norm/__init__.py``):

- ``rmsnorm(x, w, eps)``: y = x * rstd * w in fp32, rounded once; a 3-D [tokens, heads,
  head_dim] input (per-head QK-norm) goes to ``qk_rmsnorm_cute``, which takes any strides with a
  unit last stride, so the qk-norm preset's strided views run without a copy.
- ``gemma_rmsnorm(x, w, eps)``: y = x * rstd * (1 + w), the Gemma form (weight_offset = 1).
- ``fused_add_rmsnorm(x, r, w, eps)``: in place: r <- x + r (h, rounded for storage), x <- y,
  where y normalizes the unrounded fp32 sum (``kernels/fused_add_rmsnorm.py``: h stays fp32 in
  registers), so ``add_normalizes="exact_sum"``.

Two kernel families: CuTe DSL (the default) and CUDA kernels JIT-built with nvcc on first use
(``FLASHINFER_USE_CUDA_NORM=1``). The environment variable is read once, at import, into the
module global ``flashinfer.norm._USE_CUDA_NORM``, which ``_use_cuda_norm()`` reads on every call;
so both families run in one process: the ``flashinfer-cuda`` rows set that global for the
duration of their call (imported without the variable, both families' modules are loaded).
Neither family has a backward.

Both families launch with programmatic dependent launch (PDL) on Hopper unless told not to
(``enable_pdl`` None means ``device_support_pdl``: compute capability >= 9): each kernel waits
on ``griddepcontrol.wait`` at its start and triggers its dependents at its end, so a call's
launch and prologue overlap the previous kernel's tail. In a run of back-to-back calls (the
harness's timed graphs) that hides part of each launch; in a model it does so only behind a
kernel that triggers it. The ``flashinfer-nopdl`` row is the CuTe DSL kernel with
``enable_pdl=False``: the gap between the two rows is what PDL is worth at each shape.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch

from impls import AddRMSNormFn, Backend, RMSNormFn


@functools.cache
def _unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (FlashInfer's norm kernels run on CUDA only)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"needs compute capability >= 8.0, this GPU is {major}.{minor}"
    try:
        import flashinfer.norm  # noqa: F401
    except Exception as exc:  # missing package or dependency: a reason, never a crash
        return (
            f"flashinfer-python does not import ({type(exc).__name__}: {exc}); "
            "pip install flashinfer-python (needs nvidia-cutlass-dsl, apache-tvm-ffi, cuda-tile, "
            "nvidia-cudnn-frontend)"
        )
    return None


@functools.cache
def _unavailable_cute() -> str | None:
    reason = _unavailable()
    if reason is not None:
        return reason
    import flashinfer.norm as norm

    if getattr(norm, "_USE_CUDA_NORM", False):
        # Set at import by FLASHINFER_USE_CUDA_NORM=1, or because the CuTe DSL did not import.
        return (
            "flashinfer.norm selected its CUDA kernels at import (FLASHINFER_USE_CUDA_NORM=1 set, "
            "or nvidia-cutlass-dsl missing): the CuTe DSL row would run the CUDA kernels"
        )
    return None


@functools.cache
def _unavailable_cuda() -> str | None:
    reason = _unavailable()
    if reason is not None:
        return reason
    import flashinfer.norm as norm

    if not hasattr(norm, "_USE_CUDA_NORM"):
        return "this flashinfer.norm has no _USE_CUDA_NORM switch (read from 0.7.2.post1)"
    return None


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    if len(shape) > 3:
        return f"{len(shape)}-D input: FlashInfer takes [M, N] or [tokens, heads, head_dim]"
    return None


def _unsupported_add(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    if len(shape) != 2:
        return "fused_add_rmsnorm takes [M, N] rows only"
    return None


@contextlib.contextmanager
def _cuda_kernels() -> Iterator[None]:
    """FlashInfer's CUDA kernels for the calls inside (what FLASHINFER_USE_CUDA_NORM=1 selects)."""
    import flashinfer.norm as norm

    before = norm._USE_CUDA_NORM
    norm._USE_CUDA_NORM = True
    try:
        yield
    finally:
        norm._USE_CUDA_NORM = before


def _build() -> RMSNormFn:
    from flashinfer.norm import rmsnorm

    def flashinfer_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps)

    return flashinfer_rmsnorm


def _build_nopdl() -> RMSNormFn:
    from flashinfer.norm import rmsnorm

    def flashinfer_rmsnorm_nopdl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps, enable_pdl=False)

    return flashinfer_rmsnorm_nopdl


def _build_cuda() -> RMSNormFn:
    from flashinfer.norm import rmsnorm

    def flashinfer_cuda_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        with _cuda_kernels():
            return rmsnorm(x, weight, eps)

    return flashinfer_cuda_rmsnorm


def _build_gemma() -> RMSNormFn:
    from flashinfer.norm import gemma_rmsnorm

    def flashinfer_gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return gemma_rmsnorm(x, weight, eps)

    return flashinfer_gemma_rmsnorm


def _build_add(cuda: bool = False) -> AddRMSNormFn:
    from flashinfer.norm import fused_add_rmsnorm

    def flashinfer_add_rmsnorm(x, residual, weight, eps):
        # In place (Backend.in_place): the harness passes buffers of this backend's own.
        with _cuda_kernels() if cuda else contextlib.nullcontext():
            fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    return flashinfer_add_rmsnorm


_COMMON = dict(numerics="fused_fp32", own_backward=False, has_backward=False)

BACKENDS = (
    Backend(
        name="flashinfer",
        label="FlashInfer rmsnorm (CuTe DSL, PDL on; 3-D input: qk_rmsnorm)",
        build=_build,
        unavailable=_unavailable_cute,
        unsupported=_unsupported,
        **_COMMON,
    ),
    Backend(
        name="flashinfer-nopdl",
        label="FlashInfer rmsnorm (CuTe DSL), PDL off (enable_pdl=False; on by default)",
        build=_build_nopdl,
        unavailable=_unavailable_cute,
        unsupported=_unsupported,
        **_COMMON,
    ),
    Backend(
        name="flashinfer-cuda",
        label="FlashInfer rmsnorm (CUDA kernels, FLASHINFER_USE_CUDA_NORM)",
        build=_build_cuda,
        unavailable=_unavailable_cuda,
        unsupported=_unsupported,
        **_COMMON,
    ),
    Backend(
        name="flashinfer-gemma",
        label="FlashInfer gemma_rmsnorm (x_hat * (1 + w), CuTe DSL)",
        build=_build_gemma,
        unavailable=_unavailable_cute,
        unsupported=_unsupported,
        weight_offset=1.0,
        **_COMMON,
    ),
    Backend(
        name="flashinfer-add",
        label="FlashInfer fused_add_rmsnorm (in place; normalizes the unrounded x + r)",
        build=_build_add,
        op="add_rmsnorm",
        add_normalizes="exact_sum",
        in_place=True,
        unavailable=_unavailable_cute,
        unsupported=_unsupported_add,
        **_COMMON,
    ),
    Backend(
        name="flashinfer-cuda-add",
        label="FlashInfer fused_add_rmsnorm (in place, CUDA kernels)",
        build=functools.partial(_build_add, cuda=True),
        op="add_rmsnorm",
        add_normalizes="exact_sum",
        in_place=True,
        unavailable=_unavailable_cuda,
        unsupported=_unsupported_add,
        **_COMMON,
    ),
)
