"""Launchers: grids, launch configurations and allocation for the kernels in kernels.py.

On a CUDA device the kernels are autotuned per N over num_warps x num_stages with BLOCK_N pinned
to next_power_of_2(N). Under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors) autotuning
cannot time anything, so a fixed configuration is used: the kernel code is the same.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from .kernels import rmsnorm_bwd_kernel, rmsnorm_fwd_kernel

#: Largest hidden size the single-tile kernels accept: one row lives in registers.
MAX_N = 65536

NUM_WARPS_CHOICES = (1, 2, 4, 8, 16, 32)
NUM_STAGES_CHOICES = (1, 2, 4)

#: Backward programs under the interpreter (no SM count there); > 1 so the partial-dw reduction
#: is exercised by CPU tests.
_INTERPRETER_PROGRAMS = 4


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _configs() -> list[triton.Config]:
    return [
        triton.Config({}, num_warps=warps, num_stages=stages)
        for warps in NUM_WARPS_CHOICES
        for stages in NUM_STAGES_CHOICES
    ]


@functools.cache
def _tuned_fwd():
    return triton.autotune(configs=_configs(), key=["N"])(rmsnorm_fwd_kernel)


@functools.cache
def _tuned_bwd():
    return triton.autotune(configs=_configs(), key=["N"])(rmsnorm_bwd_kernel)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def block_size(n: int) -> int:
    """The tile width for a row of n elements (the whole row, padded to a power of two)."""
    return triton.next_power_of_2(n)


def backward_programs(m: int, device: torch.device) -> int:
    """Programs of the backward launch: one per SM at most, never more than rows."""
    cap = _INTERPRETER_PROGRAMS if device.type != "cuda" else _sm_count(device.index or 0)
    return max(1, min(m, cap))


def check_hidden_size(n: int) -> None:
    if n > MAX_N:
        raise ValueError(
            f"x: hidden size (last dimension) N={n} exceeds {MAX_N}, the largest row the "
            "single-tile Triton RMSNorm holds in registers"
        )


def _check_runnable(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"x: the Triton RMSNorm needs a CUDA tensor, got one on {x.device}; to run on the CPU "
            "set TRITON_INTERPRET=1 before triton is first imported"
        )


def rmsnorm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y (in out_dtype, default x's) and the per-row fp32 rstd for a 2-D x [M, N] whose last
    dimension is contiguous; rows may be strided."""
    _check_runnable(x)
    m, n = x.shape
    check_hidden_size(n)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return y, rstd
    args = (x, weight, y, rstd, x.stride(0), y.stride(0), n, eps, offset)
    if interpreting():
        rmsnorm_fwd_kernel[(m,)](*args, BLOCK_N=block_size(n), num_warps=4)
    else:
        _tuned_fwd()[(m,)](*args, BLOCK_N=block_size(n))
    return y, rstd


def rmsnorm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx [M, N] (dtype of x) and dw [N] (dtype of weight), dw summed from fp32 partials."""
    _check_runnable(x)
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return dx, torch.zeros_like(weight)
    programs = backward_programs(m, x.device)
    rows_per_program = triton.cdiv(m, programs)
    programs = triton.cdiv(m, rows_per_program)  # no program without rows
    dw_partial = torch.empty((programs, n), dtype=torch.float32, device=x.device)
    args = (
        x, weight, dy, rstd, dx, dw_partial,
        x.stride(0), dy.stride(0), dx.stride(0), m, n, rows_per_program, offset,
    )  # fmt: skip
    if interpreting():
        rmsnorm_bwd_kernel[(programs,)](*args, BLOCK_N=block_size(n), num_warps=4)
    else:
        _tuned_bwd()[(programs,)](*args, BLOCK_N=block_size(n))
    dw = dw_partial.sum(dim=0).to(weight.dtype)
    return dx, dw
