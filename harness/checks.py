"""Run one backend on one set of inputs and judge y, dx and dw against the oracle."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.inputs import Inputs
from harness.layouts import private_copy
from harness.oracle import (
    RESIDUAL_SUM_TOLERANCE,
    TOLERANCES,
    ErrorReport,
    Reference,
    compare,
    reference,
    reference_residual,
)
from impls import Backend, RMSNormFn

#: What check_backend judges per (op, mode); each on two calls, the second named "<q>#2".
QUANTITIES = {
    ("rmsnorm", "fwd"): ("y",),
    ("rmsnorm", "bwd"): ("dx", "dw"),
    ("add_rmsnorm", "fwd"): ("h", "y"),
    ("add_rmsnorm", "bwd"): ("dx", "dr", "dw"),
}


#: The CUDA caching allocator serves requests up to this size from its small pool (2 MiB segments).
_SMALL_POOL_MAX = 1 << 20


def poison_free_memory(device: torch.device, nbytes: int) -> None:
    """Fill every block the CUDA caching allocator may hand out next with NaN bytes (0xFF).

    A backend that allocates its output and leaves elements unwritten then returns NaN there,
    which the comparison rejects. The allocator picks the smallest free cached block that fits,
    and free blocks also sit inside partly used segments, so one poisoned block is not enough:
    every free block of the current stream's pool is taken (largest first, each at its exact
    size, so best fit hands out that very block), filled and given back, plus one new block of
    nbytes for outputs that need fresh memory. On the CPU the allocator gives no such guarantee;
    CPU checks rely on the comparison alone.
    """
    if device.type != "cuda" or nbytes <= 0:
        return
    torch.cuda.empty_cache()  # fully free segments go back to the driver; the rest is poisoned
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    held = [torch.empty(nbytes, dtype=torch.uint8, device=device)]
    sizes = []
    for segment in torch.cuda.memory_snapshot():
        # Only blocks this stream's ordinary allocations can get: not another stream's, not a
        # CUDA graph's private pool (a request sized to those would split some other block).
        if segment["device"] != index or segment.get("stream", stream) != stream:
            continue
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            continue
        for block in segment["blocks"]:
            if block["state"] != "inactive":
                continue
            size = block["size"]
            if segment["segment_type"] == "small":  # only requests <= 1 MiB reach these
                sizes += [_SMALL_POOL_MAX] * (size // _SMALL_POOL_MAX)
                size %= _SMALL_POOL_MAX
            if size:
                sizes.append(size)
    # Largest first: best fit then hands each request the block it was sized for (smallest
    # first would let a small request split a large block another request needed whole).
    held += [
        torch.empty(size, dtype=torch.uint8, device=device) for size in sorted(sizes, reverse=True)
    ]
    for block in held:
        block.fill_(0xFF)
    del held


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


def _mirror(t: torch.Tensor, negate: bool) -> torch.Tensor:
    """Rows in reverse order (first dimension), optionally negated: exact in floating point."""
    flipped = t.flip(0) if t.dim() > 1 else t
    return -flipped if negate else flipped


def _call(fn: RMSNormFn, x_in, w_in, dy, eps: float, backward: bool):
    """y (and dx, dw) of one call, on leaf views of the inputs (strides kept, no copy)."""
    x = x_in.detach().requires_grad_(backward)
    w = w_in.detach().requires_grad_(backward)
    poison_free_memory(x.device, 2 * x.numel() * x.element_size())
    y = fn(x, w, eps)
    if not backward:
        return y, None, None
    poison_free_memory(x.device, 2 * x.numel() * x.element_size())
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    return y, dx, dw


def check_backend(
    backend: Backend,
    fn: RMSNormFn,
    inputs: Inputs,
    *,
    backward: bool = True,
    ref: Reference | None = None,
) -> CheckResult:
    """Forward (and backward, when asked and the backend has one) of ``fn`` against the oracle.

    Two calls are judged. The first on ``inputs``; the second on the mirrored problem
    (x -> -x with rows reversed, dy rows reversed), whose true answer follows exactly from the
    first: y -> -y reversed, dx reversed, dw -> -dw. A backend that returns a cached result, or
    skips work on a repeated shape, fails the second call (its reports are named "y#2" etc.).
    ``ref`` may carry the oracle for ``inputs`` (with gradients) when several backends are
    checked on the same inputs.
    """
    if backend.op == "add_rmsnorm":
        return _check_add_rmsnorm(backend, fn, inputs, backward=backward)
    x_in, w_in = inputs.x, inputs.weight
    do_backward = backward and backend.has_backward
    shape, dtype = tuple(x_in.shape), x_in.dtype
    tolerances = TOLERANCES[backend.numerics]
    n = shape[-1]
    m = x_in.numel() // n if n else 0
    if backend.weight_offset or ref is None or (do_backward and ref.dx is None):
        # Gemma's form (weight_offset 1) is judged against x_hat * (offset + w), same weight.
        ref = reference(x_in, w_in, inputs.eps, inputs.dy if do_backward else None,
                        offset=backend.weight_offset)  # fmt: skip

    calls = [
        ("", x_in, inputs.dy, ref.y, ref.dx, ref.dw),
        ("#2", _mirror(x_in, True), _mirror(inputs.dy, False), _mirror(ref.y, True),
         None if ref.dx is None else _mirror(ref.dx, False),
         None if ref.dw is None else -ref.dw),
    ]  # fmt: skip
    reports: list[ErrorReport] = []
    try:
        for suffix, x, dy, want_y, want_dx, want_dw in calls:
            y, dx, dw = _call(fn, x, w_in, dy, inputs.eps, do_backward)
            reports.append(compare("y" + suffix, y, want_y, dtype, tolerances["y"], n))
            if do_backward:
                reports.append(compare("dx" + suffix, dx, want_dx, dtype, tolerances["dx"], n))
                reports.append(compare("dw" + suffix, dw, want_dw, w_in.dtype, tolerances["dw"], m))
    except Exception as exc:  # a failing backend is a result, never a crash of the run
        return CheckResult(backend.name, shape, dtype, reports, f"{type(exc).__name__}: {exc}")
    return CheckResult(backend.name, shape, dtype, reports)


def _check_add_rmsnorm(backend: Backend, fn, inputs: Inputs, *, backward: bool) -> CheckResult:
    """add_rmsnorm: h against round(x + r); y, dx, dr (= dh_total) and dw against the oracle of
    the h the backend returned; then the same on the mirrored problem, as for rmsnorm."""
    if inputs.residual is None or inputs.dh is None:
        raise ValueError(
            "inputs: add_rmsnorm needs residual and dh (make_inputs(with_residual=True))"
        )
    do_backward = backward and backend.has_backward
    shape, dtype = tuple(inputs.x.shape), inputs.x.dtype
    tolerances = TOLERANCES[backend.numerics]
    n = shape[-1]
    m = inputs.x.numel() // n
    w_in = inputs.weight
    calls = [
        ("", inputs.x, inputs.residual, inputs.dy, inputs.dh),
        ("#2", _mirror(inputs.x, True), _mirror(inputs.residual, True),
         _mirror(inputs.dy, False), _mirror(inputs.dh, False)),
    ]  # fmt: skip
    reports: list[ErrorReport] = []
    try:
        for suffix, x_t, r_t, dy, dh in calls:
            # An in-place backend writes y and h into x's and r's buffers: give it copies.
            fresh = private_copy if backend.in_place else torch.Tensor.detach
            x = fresh(x_t).requires_grad_(do_backward)
            r = fresh(r_t).requires_grad_(do_backward)
            w = w_in.detach().requires_grad_(do_backward)
            poison_free_memory(x.device, 4 * x.numel() * x.element_size())
            y, h = fn(x, r, w, inputs.eps)
            # y is judged against the exact value of what this backend normalizes (Backend doc)
            normalized = (
                h.detach() if backend.add_normalizes == "stored_sum"
                else x_t.to(torch.float64) + r_t.to(torch.float64)
            )  # fmt: skip
            ref = reference_residual(
                x_t, r_t, w_in, inputs.eps, dy if do_backward else None,
                dh if do_backward else None, normalized=normalized,
            )  # fmt: skip
            reports.append(compare("h" + suffix, h, ref.h, dtype, RESIDUAL_SUM_TOLERANCE, 1))
            reports.append(compare("y" + suffix, y, ref.y, dtype, tolerances["y"], n))
            if do_backward:
                poison_free_memory(x.device, 3 * x.numel() * x.element_size())
                dx, dr, dw = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
                reports.append(compare("dx" + suffix, dx, ref.dx, dtype, tolerances["dx"], n))
                reports.append(compare("dr" + suffix, dr, ref.dx, dtype, tolerances["dx"], n))
                reports.append(compare("dw" + suffix, dw, ref.dw, w_in.dtype, tolerances["dw"], m))
    except Exception as exc:  # a failing backend is a result, never a crash of the run
        return CheckResult(backend.name, shape, dtype, reports, f"{type(exc).__name__}: {exc}")
    return CheckResult(backend.name, shape, dtype, reports)
