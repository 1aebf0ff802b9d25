"""The oracle: RMSNorm computed in high precision, and the error of a backend against it.

The reference upcasts x and weight, computes end to end in ``reference_dtype`` (fp32 for 16-bit
storage; fp64 for fp32 storage, since an fp32 reference cannot judge an fp32 kernel in fp32
ulps), and gradients come from autograd of that same computation. Values are rounded to the
storage dtype only when compared, so "correctly rounded" means: round(reference).

Errors are reported in absolute terms and in ulps of the storage dtype. A backend passes when
every element is within its bound, a sum of three terms, each with its reason in TOLERANCES:
    elem_ulps  * ulp(|round(ref_i)|)        roundings of the result itself
  + scale_ulps * ulp(max_j |ref_j|)          roundings of intermediate terms as large as the
                                             largest output (cancellation in dx and dw)
  + ACCUMULATION_SIGMAS * sqrt(K) * 2**-24 * max_j |ref_j|
                                             fp32 accumulation over K terms (K = N for y and
                                             dx, M for dw); matters only for fp32 storage
The error is measured against round(ref), except for bounds marked exact (a single-rounding
forward): those measure against the unrounded ref with elem_ulps = 0.5, and the fp32 term is
taken relative to each element, so a kernel that rounds twice cannot hide inside them.
Non-finite values must agree exactly in position and kind (NaN, +Inf, -Inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Mantissa bits (excluding the implicit bit) of each storage dtype.
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}

#: Errors are reported in ulps of max(|ref_i|, FLOOR * max|ref|), so elements that cancel to ~0
#: do not report astronomic ulp counts.
_ULP_REPORT_FLOOR = 2.0**-10

#: Standard deviations allowed for random-walk fp32 rounding error over a K-term reduction.
ACCUMULATION_SIGMAS = 4.0


@dataclass(frozen=True)
class Tolerance:
    elem_ulps: float
    scale_ulps: float
    reason: str
    #: True: the error is measured against the unrounded reference, so elem_ulps = 0.5 means
    #: "correctly rounded", up to fp32 compute noise relative to each element
    #: ((5 + ACCUMULATION_SIGMAS * sqrt(K)) * 2**-24 * |ref_i|) in place of the scale-wide term.
    exact: bool = False


#: numerics class -> quantity (y, dx, dw) -> bound. Each backend declares its class (Backend.
#: numerics), from its source: fused_fp32 for QuACK, FlashInfer (CuTe DSL and CUDA kernels: y =
#: x * rstd * (offset + w) in fp32, one store), cuDNN's graph (fp32 intermediate and compute
#: types), fla (fp32 Triton kernel, one store) and the not-carried TE/vLLM/SGLang rows;
#: two_roundings for Liger's Triton and CuTe DSL rows (the weight multiply at the storage dtype
#: after x * rstd is rounded), Apex and torch's op.
TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "fused_fp32": {
        "y": Tolerance(0.5, 0, "fp32 statistics, one rounding at the store: correctly rounded "
                               "(within 0.5 ulp of the exact value) up to fp32 noise; a second "
                               "rounding lands up to 1 ulp away and fails", exact=True),
        "dx": Tolerance(1, 0, "computed in fp32 from dy, x and rstd, rounded once"),
        "dw": Tolerance(1, 0, "fp32 sum over rows, rounded once to the weight dtype"),
    },
    # Our kernel under Triton's CPU interpreter, which converts fp32 -> bf16 by truncation
    # (triton/runtime/interpreter.py): one rounding still, but up to 1 ulp toward zero.
    "fused_fp32_interpreted": {
        "y": Tolerance(1, 0, "one truncating conversion at the store: within 1 ulp of "
                             "round(reference)"),
        "dx": Tolerance(1, 0, "computed in fp32 from dy, x and rstd, converted once"),
        "dw": Tolerance(1, 0, "fp32 sum over rows, converted once to the weight dtype"),
    },
    "two_roundings": {
        "y": Tolerance(2, 0, "x*rstd rounded to the storage dtype, then times weight rounded "
                             "again: two roundings"),
        "dx": Tolerance(1, 1, "dy*w may be rounded to storage before the fp32 math: one "
                              "rounding at the scale of the terms, one of the result"),
        "dw": Tolerance(2, 2, "dy times a rounded x_hat, the product rounded before the fp32 "
                              "sum: two roundings at term scale, which cancel in the sum"),
    },
    "storage_dtype_chain": {
        "y": Tolerance(5, 0, "each op rounds to storage: x^2 and mean (2 u in var), +eps (u), "
                             "rsqrt (halves 3 u, adds u), two products (2 u): 4.5 u < 5 ulps"),
        "dx": Tolerance(1, 8, "autograd of the chain: about 8 rounded ops, each at the scale of "
                              "the largest term, which then cancel"),
        "dw": Tolerance(1, 8, "dy times the forward's rounded x_hat (5 u), product rounded, "
                              "fp32 sum rounded: 7 u at term scale, cancelling in the sum"),
    },
}  # fmt: skip


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit storage, fp64 for fp32 (and fp64) storage."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else torch.float64


def reference_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    offset: float = 0.0,
    compute: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm in the reference precision (default: for x's dtype), unrounded."""
    compute = compute or reference_dtype(x.dtype)
    xc = x.to(compute)
    rstd = torch.rsqrt(xc.square().mean(dim=-1, keepdim=True) + eps)
    return xc * rstd * (offset + weight.to(compute))


@dataclass(frozen=True)
class Reference:
    y: torch.Tensor
    dx: torch.Tensor | None
    dw: torch.Tensor | None


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    dy: torch.Tensor | None = None,
    *,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> Reference:
    """y, and when dy is given dx and dw, in the reference precision and unrounded.

    The precision is fp64 as soon as any of x, weight or the output is fp32, else fp32.
    """
    dtypes = {x.dtype, weight.dtype, out_dtype or x.dtype}
    compute = torch.float64 if dtypes & {torch.float32, torch.float64} else torch.float32
    if dy is None:
        with torch.no_grad():
            return Reference(reference_forward(x, weight, eps, offset=offset, compute=compute),
                             None, None)  # fmt: skip
    xc = x.detach().to(compute).requires_grad_(True)
    wc = weight.detach().to(compute).requires_grad_(True)
    with torch.enable_grad():
        y = reference_forward(xc, wc, eps, offset=offset, compute=compute)
        dx, dw = torch.autograd.grad(y, (xc, wc), dy.to(compute))
    return Reference(y.detach(), dx, dw)


@dataclass(frozen=True)
class ResidualReference:
    h: torch.Tensor  # x + r, correctly rounded to x's dtype (then upcast)
    y: torch.Tensor
    dx: torch.Tensor | None  # also the residual's gradient
    dw: torch.Tensor | None


#: h = x + r rounded once: like y, within 1 ulp of the correctly rounded value (round to nearest
#: makes it exact on a GPU; Triton's CPU interpreter truncates fp32 -> bf16, 1 ulp toward zero).
RESIDUAL_SUM_TOLERANCE = Tolerance(
    1, 0, "x + r rounded once to storage: within 1 ulp of the correctly rounded sum"
)


def reference_residual(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    dy: torch.Tensor | None = None,
    dh: torch.Tensor | None = None,
    *,
    offset: float = 0.0,
    normalized: torch.Tensor | None = None,
) -> ResidualReference:
    """Pre-norm residual add: h = round(x + r), y = RMSNorm(h); dx = dr = dL/dh + dh.

    ``normalized`` (optional) is the h a backend returned: y, dx and dw are then the oracle's
    for that h, so they are judged apart from h's own rounding (checked against ``.h``).
    """
    h = (x.to(torch.float64) + residual.to(torch.float64)).to(x.dtype)
    ref = reference(h if normalized is None else normalized, weight, eps, dy, offset=offset)
    compute = ref.y.dtype
    h_up = h.to(compute)
    if dy is None:
        return ResidualReference(h_up, ref.y, None, None)
    dx = ref.dx if dh is None else ref.dx + dh.to(compute)
    return ResidualReference(h_up, ref.y, dx, ref.dw)


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at each |value| (float64), subnormal spacing below the normal range."""
    mantissa = _MANTISSA_BITS[dtype]
    smallest_normal = torch.finfo(dtype).tiny
    mag = values.detach().abs().to(torch.float64).clamp(min=smallest_normal)
    _, exponent = torch.frexp(mag)  # mag = m * 2**exponent, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(mag), (exponent - 1 - mantissa).to(torch.int64))


@dataclass(frozen=True)
class ErrorReport:
    """How far one output is from the oracle, and whether that is within its bound."""

    quantity: str
    max_abs: float
    max_ulps: float
    bound_ulps: float
    bound_use: float  # max over elements of |err| / bound: <= 1 passes
    mismatches: int
    numel: int
    passed: bool
    detail: str

    def summary(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        return (
            f"{self.quantity}: {verdict}, max |err| {self.max_abs:.3g}, "
            f"{self.max_ulps:.2f} ulps (bound {self.bound_ulps:g}), "
            f"{self.bound_use:.2f} of the bound, "
            f"{self.mismatches}/{self.numel} outside" + (f"; {self.detail}" if self.detail else "")
        )


def _describe_first(bad: torch.Tensor, out: torch.Tensor, ref: torch.Tensor, limit: int = 3) -> str:
    idx = bad.nonzero()[:limit]
    parts = []
    for row in idx:
        key = tuple(int(i) for i in row)
        parts.append(f"{key}: got {out[key].item():.6g}, want {ref[key].item():.6g}")
    return "; ".join(parts)


def compare(
    quantity: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    tolerance: Tolerance,
    reduction_length: int,
) -> ErrorReport:
    """Error of ``out`` (in storage ``dtype``) against the unrounded reference ``ref``."""
    if tuple(out.shape) != tuple(ref.shape):
        return ErrorReport(quantity, math.inf, math.inf, tolerance.elem_ulps, math.inf,
                           ref.numel(), ref.numel(), False,
                           f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")  # fmt: skip
    if out.dtype != dtype:
        return ErrorReport(quantity, math.inf, math.inf, tolerance.elem_ulps, math.inf,
                           ref.numel(), ref.numel(), False,
                           f"dtype {out.dtype}, expected {dtype}")  # fmt: skip
    got = out.detach().to(torch.float64)
    exact = ref.detach().to(device=got.device, dtype=torch.float64)
    want = ref.detach().to(dtype).to(device=got.device, dtype=torch.float64)  # correctly rounded

    finite = torch.isfinite(want)
    nonfinite_disagree = (~finite) & ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
    lost = finite & ~torch.isfinite(got)

    target = exact if tolerance.exact else want
    err = torch.where(finite & torch.isfinite(got), (got - target).abs(), torch.zeros_like(got))
    scale = exact[finite].abs().max().item() if finite.any() else 0.0
    scale_t = torch.tensor(scale, dtype=torch.float64, device=got.device)
    noise_terms = ACCUMULATION_SIGMAS * math.sqrt(reduction_length) * 2.0**-24
    if tolerance.exact:
        noise = torch.nan_to_num((noise_terms + 5 * 2.0**-24) * exact.abs(), nan=0.0, posinf=0.0)
    else:
        noise = noise_terms * scale
    bound = (
        tolerance.elem_ulps * ulp(want, dtype) + tolerance.scale_ulps * ulp(scale_t, dtype) + noise
    )
    outside = (finite & (err > bound)) | lost | nonfinite_disagree
    report_ulp = ulp(torch.maximum(want.abs(), scale_t * _ULP_REPORT_FLOOR), dtype)
    ulps = err / report_ulp
    max_ulps = math.inf if bool(lost.any()) else (ulps.max().item() if ulps.numel() else 0.0)
    max_abs = math.inf if bool(lost.any()) else (err.max().item() if err.numel() else 0.0)
    if bool(lost.any() or nonfinite_disagree.any()):
        bound_use = math.inf
    else:
        use = err / bound.clamp(min=torch.finfo(torch.float64).tiny)
        bound_use = use.max().item() if use.numel() else 0.0
    mismatches = int(outside.sum())
    detail = ""
    if mismatches:
        detail = _describe_first(outside, got, want)
        if bool(lost.any()):
            detail = f"{int(lost.sum())} non-finite where the oracle is finite; " + detail
    return ErrorReport(
        quantity=quantity,
        max_abs=max_abs,
        max_ulps=max_ulps,
        bound_ulps=tolerance.elem_ulps + tolerance.scale_ulps,
        bound_use=bound_use,
        mismatches=mismatches,
        numel=out.numel(),
        passed=mismatches == 0,
        detail=detail,
    )
