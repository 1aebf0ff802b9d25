"""Backends the H200 runs cannot carry: TransformerEngine, vLLM and SGLang.

They are registered so that tables and skips name them with the reason. The GPU machine reaches
no package registry, so every package travels as wheels in the working tree (64 MiB a call,
with the tree): TransformerEngine is a 729 MB wheel plus a torch extension built from source
against the local torch; vLLM's and SGLang's wheels (336-536 MB) are each built against one
torch release, not the machine's torch 2.11. Where one of them is installed, its row runs
(forward only: their norm ops have no backward):

- vLLM: ``vllm._custom_ops.rms_norm(out, x, weight, eps)`` (its CUDA kernel, fp32 statistics);
- SGLang: ``sgl_kernel.rmsnorm(x, weight, eps)`` (FlashInfer's CUDA kernel, vendored);
- TransformerEngine: ``transformer_engine.pytorch.RMSNorm``, a module that owns its weight; the
  row copies the suite's weight into it when a new weight arrives (the first call of a case,
  never a timed one: the harness warms up first) and times its forward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from impls import Backend, RMSNormFn

#: Why the committed H200 runs lack it (the module docstring has the sizes).
_H200 = "the committed H200 runs lack it: the machine they ran on installs only small wheels"

_WHY = {
    "transformer_engine": (
        "TransformerEngine is not installed (pip install transformer-engine[pytorch] to rank "
        f"it); {_H200}"
    ),
    "vllm": f"vLLM is not installed (pip install vllm, built for your torch, to rank it); {_H200}",
    "sgl_kernel": (
        f"SGLang's sgl-kernel is not installed (pip install sgl-kernel to rank it); {_H200}"
    ),
}


def _importer(module: str, attribute: str | None = None):
    @functools.cache
    def unavailable() -> str | None:
        try:
            mod = __import__(module, fromlist=["_"])
            if attribute is not None:
                getattr(mod, attribute)
        except Exception as exc:
            return f"{_WHY[module.split('.')[0]]} ({type(exc).__name__}: {exc})"
        if not torch.cuda.is_available():
            return "no CUDA device"
        return None

    return unavailable


def _unsupported(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    return None


def _unsupported_2d(shape: Sequence[int], dtype: torch.dtype, device: str) -> str | None:
    if device != "cuda":
        return "CUDA tensors only"
    if len(shape) != 2:
        return "[M, N] rows only"
    return None


def _build_vllm() -> RMSNormFn:
    from vllm import _custom_ops as ops

    def vllm_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        ops.rms_norm(out, x, weight, eps)
        return out

    return vllm_rmsnorm


def _build_sglang() -> RMSNormFn:
    from sgl_kernel import rmsnorm

    def sglang_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(x, weight, eps)

    return sglang_rmsnorm


def _build_te() -> RMSNormFn:
    import transformer_engine.pytorch as te

    modules: dict[tuple, torch.nn.Module] = {}
    loaded: dict[tuple, torch.Tensor] = {}

    def te_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        key = (weight.shape[0], weight.dtype, eps)
        if key not in modules:
            modules[key] = te.RMSNorm(weight.shape[0], eps=eps, params_dtype=weight.dtype).cuda()
        module = modules[key]
        if loaded.get(key) is not weight:
            with torch.no_grad():
                module.weight.copy_(weight)
            loaded[key] = weight
        return module(x)

    return te_rmsnorm


_COMMON = dict(own_backward=False, has_backward=False)

BACKENDS = (
    Backend(
        name="transformer-engine",
        label="TransformerEngine RMSNorm (not carried)",
        build=_build_te,
        numerics="fused_fp32",
        unavailable=_importer("transformer_engine.pytorch", "RMSNorm"),
        unsupported=_unsupported,
        **_COMMON,
    ),
    Backend(
        name="vllm",
        label="vLLM rms_norm (not carried)",
        build=_build_vllm,
        numerics="fused_fp32",
        unavailable=_importer("vllm._custom_ops", "rms_norm"),
        unsupported=_unsupported_2d,
        **_COMMON,
    ),
    Backend(
        name="sglang",
        label="SGLang sgl_kernel.rmsnorm (not carried)",
        build=_build_sglang,
        numerics="fused_fp32",
        unavailable=_importer("sgl_kernel", "rmsnorm"),
        unsupported=_unsupported_2d,
        **_COMMON,
    ),
)
