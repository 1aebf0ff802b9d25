"""The zero-argument calls a backend is checked and timed by, shared by every measurement
(harness.run's rows, harness.costs' columns, harness.overhead, harness.ncu_bytes): one forward
call per input set with the leaves it differentiates, a backward through a forward's outputs,
and the dtype names of the results files.
"""

from __future__ import annotations

import torch

from harness.inputs import Inputs
from harness.layouts import private_copy
from harness.rows import first_line
from impls import Backend

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def error_text(exc: BaseException) -> str:
    """The exception's type and what its message says first (rows.first_line: a message that
    opens with a blank line or a bare heading, as some compilers' do, still says what went
    wrong), at most 300 characters."""
    said = first_line(str(exc), limit=300)
    return f"{type(exc).__name__}: {said}"[:300] if said else type(exc).__name__


def _leaf(t: torch.Tensor, grad: bool = True, copy: bool = False) -> torch.Tensor:
    """t as a leaf (needing a gradient when the backend has a backward); a private copy for
    in-place backends, so the shared input sets never change."""
    t = private_copy(t) if copy else t.detach()
    return t.requires_grad_(grad)


def forward_calls(backend: Backend, fn, sets: list[Inputs]) -> tuple[list, list]:
    """One zero-argument forward call per input set, and the leaves each call differentiates.

    A forward-only backend gets leaves without gradients (an in-place op may not write into a
    leaf that needs one); an in-place backend gets copies of x and r of its own, which its calls
    overwrite over and over (the bytes moved per call stay the same)."""
    grad = backend.has_backward
    w = _leaf(sets[0].weight, grad)
    eps = sets[0].eps
    calls, leaves = [], []
    for s in sets:
        x = _leaf(s.x, grad, backend.in_place)
        if backend.op == "add_rmsnorm":
            r = _leaf(s.residual, grad, backend.in_place)
            calls.append(lambda x=x, r=r: fn(x, r, w, eps))
            leaves.append((x, r, w))
        else:
            calls.append(lambda x=x: fn(x, w, eps))
            leaves.append((x, w))
    return calls, leaves


def backward_call(backend: Backend, outputs, leaves, s: Inputs):
    """A zero-argument backward through ``outputs`` (kept: retain_graph), no accumulation."""
    if backend.op == "add_rmsnorm":
        return lambda: torch.autograd.grad(outputs, leaves, (s.dy, s.dh), retain_graph=True)
    return lambda: torch.autograd.grad(outputs, leaves, s.dy, retain_graph=True)
