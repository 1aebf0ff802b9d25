"""Run one backend on one set of inputs and judge y, dx and dw against the oracle."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.inputs import Inputs
from harness.oracle import TOLERANCES, ErrorReport, Reference, compare, reference
from impls import Backend, RMSNormFn


def poison_free_memory(device: torch.device, nbytes: int) -> None:
    """Fill memory the CUDA caching allocator will hand out next with NaN bytes (0xFF).

    A backend that allocates its output and leaves elements unwritten then returns NaN there,
    which the comparison rejects. On the CPU the allocator gives no such guarantee; CPU checks
    rely on the comparison alone.
    """
    if device.type != "cuda" or nbytes <= 0:
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    del block


@dataclass(frozen=True)
class CheckResult:
    backend: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    reports: list[ErrorReport] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.reports) and all(r.passed for r in self.reports)

    @property
    def worst_ulps(self) -> float:
        return max((r.max_ulps for r in self.reports), default=float("inf"))

    def summary(self) -> str:
        head = f"{self.backend} {tuple(self.shape)} {str(self.dtype).removeprefix('torch.')}"
        if self.error is not None:
            return f"{head}: ERROR {self.error}"
        return head + "\n  " + "\n  ".join(r.summary() for r in self.reports)


def check_backend(
    backend: Backend,
    fn: RMSNormFn,
    inputs: Inputs,
    *,
    backward: bool = True,
    ref: Reference | None = None,
) -> CheckResult:
    """Forward (and backward, when asked and the backend has one) of ``fn`` against the oracle.

    ``ref`` may carry the oracle for these inputs (with gradients) when several backends are
    checked on the same inputs.
    """
    x_in, w_in = inputs.x, inputs.weight
    do_backward = backward and backend.has_backward
    shape, dtype = tuple(x_in.shape), x_in.dtype
    tolerances = TOLERANCES[backend.numerics]
    n = shape[-1]
    m = x_in.numel() // n if n else 0
    if ref is None or (do_backward and ref.dx is None):
        ref = reference(x_in, w_in, inputs.eps, inputs.dy if do_backward else None)

    x = x_in.detach().clone().requires_grad_(do_backward)
    w = w_in.detach().clone().requires_grad_(do_backward)
    reports: list[ErrorReport] = []
    try:
        poison_free_memory(x.device, 2 * x.numel() * x.element_size())
        y = fn(x, w, inputs.eps)
        reports.append(compare("y", y, ref.y, dtype, tolerances["y"], n))
        if do_backward:
            poison_free_memory(x.device, 2 * x.numel() * x.element_size())
            dx, dw = torch.autograd.grad(y, (x, w), inputs.dy)
            reports.append(compare("dx", dx, ref.dx, dtype, tolerances["dx"], n))
            reports.append(compare("dw", dw, ref.dw, w_in.dtype, tolerances["dw"], m))
    except Exception as exc:  # a failing backend is a result, never a crash of the run
        return CheckResult(backend.name, shape, dtype, reports, f"{type(exc).__name__}: {exc}")
    return CheckResult(backend.name, shape, dtype, reports)
