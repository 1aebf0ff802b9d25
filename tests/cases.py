"""Shape and dtype sweeps for the tests, whole on a CUDA machine and cut on a CPU one."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ON_GPU

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

SEED_N = (2048, 4096, 8192)
SEED_M = (512, 1024, 2048, 4096)
SEED_DTYPES = (torch.float16, torch.bfloat16)

#: On the CPU the interpreter and the CPU compiler are slow: the seed sweep keeps every N and
#: dtype at one M, CPU_SEED_ROWS rows in place of SEED_M[0] (still several tiles a program under
#: the interpreter's 4-program grid, so the row loops and masks are exercised); the other Ms skip.
CPU_SEED_ROWS = 128


def shape_id(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def seed_sweep() -> list:
    """(shape, dtype) params of the seed's sweep, ids like bf16-512x4096 (cpu-cut on a CPU)."""
    params = []
    for dtype in SEED_DTYPES:
        for m in SEED_M:
            for n in SEED_N:
                cut = not ON_GPU and m != SEED_M[0]
                if not ON_GPU and not cut:
                    m = CPU_SEED_ROWS
                reason = f"CPU run: seed sweep cut to M={CPU_SEED_ROWS}"
                marks = [pytest.mark.skip(reason=reason)] if cut else []
                suffix = "" if ON_GPU else "-cpu-cut"
                params.append(pytest.param((m, n), dtype, marks=marks,
                                           id=f"{DTYPE_NAMES[dtype]}-{m}x{n}{suffix}"))  # fmt: skip
    return params


#: Edge cases every backend must get right: fp32, N not a power of two, one row, 3-D input.
EDGE_CASES = [
    ((256, 4096), torch.float32),
    ((128, 1000), torch.bfloat16),
    ((64, 4095), torch.float16),
    ((64, 5120), torch.bfloat16),
    ((1, 4096), torch.bfloat16),
    ((4, 33, 768), torch.float16),
    ((3, 7, 1000), torch.float32),
]


def edge_cases() -> list:
    return [pytest.param(s, d, id=f"{DTYPE_NAMES[d]}-{shape_id(s)}") for s, d in EDGE_CASES]
