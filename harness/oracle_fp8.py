"""The oracle of RMSNorm with fp8 output: exact y, exact scales, torch's own fp8 conversion.

The reference norm runs in fp64, on the inputs' device (the kernel's fp32 statistics sit as
far from an fp32 oracle as from the truth, so an fp32 oracle would double every window below),
from x (or the h = x + r the backend returned, so that h is judged apart). Then, with the
convention q = sat(rn(y / s)), s = max(amax(|y|) / fp8_max, FLT_MIN):

- dynamic scales (per token, 1 x 128 blocks): s_ref = the exact amax / fp8_max, rounded once to
  fp32. A backend's scale passes within  1 ulp(s_ref) + delta * s_ref, where 1 ulp is the two
  half-ulp roundings (the oracle's and the backend's division) and delta the backend's relative
  error on y (TOLERANCES, by numerics class). NaN scales must sit where the oracle's are NaN.
- the codes are judged given the backend's own scales s (so a scale error is reported once, in
  the scales): v = y / s in fp64, clamped to +-fp8_max, converted by torch (``.to(fp32)`` then
  ``.to(fp8_dtype)``; a double rounding there can only matter within 2**-24 of a tie, inside the
  window). Every code must equal the oracle's, or sit one code away (same sign, adjacent
  magnitudes) where v lies within  (delta + 2**-24) * |v|  of the midpoint between the two: the
  backend's y / s differs from the exact v by at most that (delta from y, one rounding of the
  division), so only there can a correct kernel round the other way. NaN codes where the
  oracle's v is NaN, and only there.

torch's conversions checked on the CPU (torch 2.13): float -> float8_e4m3fn saturates (+-inf
and anything past 448 give +-448; NaN stays NaN); float -> float8_e5m2 does not (values past
57344 round to +-inf, as IEEE). The oracle clamps before converting, so it never depends on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.oracle import ACCUMULATION_SIGMAS

FLT_MIN = torch.finfo(torch.float32).tiny
GROUP = 128
FP8_MAX = {dt: torch.finfo(dt).max for dt in (torch.float8_e4m3fn, torch.float8_e5m2)}


@dataclass(frozen=True)
class Fp8Tolerance:
    """delta: the relative error a backend's fp32 (pre-quantization) y may carry, as a function
    of the row width N."""

    y_rel_ulps_const: float
    y_rel_sqrt_n: float
    reason: str

    def delta(self, n: int) -> float:
        return (self.y_rel_ulps_const + self.y_rel_sqrt_n * math.sqrt(n)) * 2.0**-24


#: numerics class -> the relative error allowed on y before it is quantized.
TOLERANCES: dict[str, Fp8Tolerance] = {
    "fused_fp32": Fp8Tolerance(
        5, ACCUMULATION_SIGMAS,
        "fp32 statistics and y never rounded before the division: the plain oracle's fp32 noise "
        "((5 + 4 sqrt(N)) * 2**-24 relative to each element)",
    ),
    "bf16_y": Fp8Tolerance(
        5 * 2.0**17, ACCUMULATION_SIGMAS,
        "norm in bf16 storage then quantized (eager, torch.compile of it): the eager chain's "
        "5 bf16 ulps (at most 5 * 2**-7 relative: an ulp is 2**-8 to 2**-7 of the value) on y "
        "before the quantization",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Fp8Reference:
    y: torch.Tensor  # fp64 [M, N], unrounded
    scales: torch.Tensor | None  # fp32, the exact dynamic scales rounded once (None per tensor)


def _rows64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1, t.shape[-1]).to(torch.float64)


def reference_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    scaling: str,
    fp8_dtype: torch.dtype,
    offset: float = 0.0,
) -> Fp8Reference:
    """y in fp64 over the rows of x ([..., N] -> [M, N]) and the exact dynamic scales."""
    xc = _rows64(x)
    rstd = torch.rsqrt(xc.square().mean(dim=-1, keepdim=True) + eps)
    y = xc * rstd * (offset + weight.detach().to(torch.float64))
    fmax = FP8_MAX[fp8_dtype]
    if scaling == "per_tensor":
        return Fp8Reference(y, None)
    if scaling == "per_token":
        amax = y.abs().amax(dim=-1)
    else:
        m, n = y.shape
        groups = -(-n // GROUP)
        padded = torch.zeros(m, groups * GROUP, dtype=torch.float64, device=y.device)
        padded[:, :n] = y.abs()
        amax = padded.view(m, groups, GROUP).amax(dim=-1)
    # torch's amax propagates NaN: a row (block) holding a NaN gets a NaN scale
    scales = (amax / fmax).clamp(min=FLT_MIN).to(torch.float32)  # clamp keeps NaN
    return Fp8Reference(y, scales)


def reference_codes(y64: torch.Tensor, scale_per_element: torch.Tensor, fp8_dtype: torch.dtype):
    """(v, codes): v = y / s in fp64; codes = torch's conversion of v clamped to +-fp8_max."""
    fmax = FP8_MAX[fp8_dtype]
    v = y64 / scale_per_element.to(torch.float64)
    return v, v.clamp(-fmax, fmax).to(torch.float32).to(fp8_dtype)


def scale_per_element(
    scales: torch.Tensor, scaling: str, m: int, n: int, device: torch.device
) -> torch.Tensor:
    """The scale of each element of [M, N] from a backend's scales (any layout)."""
    s = scales.detach().to(device=device, dtype=torch.float32)
    if scaling == "per_tensor":
        return s.reshape(1, 1).expand(m, n)
    if scaling == "per_token":
        return s.reshape(m, 1).expand(m, n)
    return s.reshape(m, -1).repeat_interleave(GROUP, dim=1)[:, :n]


@dataclass(frozen=True)
class Fp8Report:
    quantity: str
    mismatches: int
    numel: int
    near_tie: int  # codes one away inside the window (allowed)
    detail: str

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def summary(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        extra = f", {self.near_tie} one code away at a tie" if self.quantity == "q" else ""
        return f"{self.quantity}: {verdict}, {self.mismatches}/{self.numel} outside{extra}" + (
            f"; {self.detail}" if self.detail else ""
        )


def _first(bad: torch.Tensor, got: torch.Tensor, want: torch.Tensor, limit: int = 3) -> str:
    parts = []
    for idx in bad.nonzero()[:limit]:
        key = tuple(int(i) for i in idx)
        parts.append(f"{key}: got {got[key].item():.6g}, want {want[key].item():.6g}")
    return "; ".join(parts)


def compare_scales(
    scales: torch.Tensor, ref: Fp8Reference, tolerance: Fp8Tolerance, n: int
) -> Fp8Report:
    want = ref.scales
    got = scales.detach().to(want.device)
    if tuple(got.shape) != tuple(want.shape) or got.dtype != torch.float32:
        return Fp8Report("scales", want.numel(), want.numel(), 0,
                         f"got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} "
                         "torch.float32")  # fmt: skip
    g, w = got.to(torch.float64), want.to(torch.float64)
    nan_disagree = torch.isnan(g) != torch.isnan(w)
    ulp = torch.ldexp(torch.ones_like(w), (torch.frexp(w.abs().clamp(min=FLT_MIN))[1] - 24))
    bound = ulp + tolerance.delta(n) * w.abs()
    outside = nan_disagree | (~torch.isnan(w) & ~((g - w).abs() <= bound))
    bad = int(outside.sum())
    return Fp8Report("scales", bad, w.numel(), 0, _first(outside, g, w) if bad else "")


def compare_codes(
    q: torch.Tensor,
    y64: torch.Tensor,
    scales_used: torch.Tensor,
    scaling: str,
    fp8_dtype: torch.dtype,
    tolerance: Fp8Tolerance,
) -> Fp8Report:
    """The backend's codes q [..., N] against the oracle's, given the backend's scales."""
    m, n = y64.shape
    if q.dtype != fp8_dtype or q.numel() != m * n:
        return Fp8Report("q", m * n, m * n, 0, f"got {tuple(q.shape)} {q.dtype}, expected "
                         f"{m * n} elements of {fp8_dtype}")  # fmt: skip
    got8 = q.detach().reshape(m, n).to(y64.device)
    s_el = scale_per_element(scales_used, scaling, m, n, y64.device)
    v, want8 = reference_codes(y64, s_el, fp8_dtype)
    got, want = got8.to(torch.float64), want8.to(torch.float64)
    nan_v = torch.isnan(v)
    equal = (got == want) | (torch.isnan(got) & nan_v)
    mag_got = (got8.view(torch.uint8) & 0x7F).to(torch.int32)
    mag_want = (want8.view(torch.uint8) & 0x7F).to(torch.int32)
    same_sign = (torch.sign(got) == torch.sign(want)) | (got == 0) | (want == 0)
    adjacent = same_sign & ((mag_got - mag_want).abs() == 1) & ~torch.isnan(got) & ~nan_v
    midpoint = (got.abs() + want.abs()) / 2
    window = (tolerance.delta(n) + 2.0**-24) * v.abs()
    near_tie = adjacent & ((v.abs() - midpoint).abs() <= window)
    outside = ~(equal | near_tie)
    bad = int(outside.sum())
    return Fp8Report(
        "q", bad, m * n, int(near_tie.sum()), _first(outside, got, want) if bad else ""
    )


def check_fp8(
    q: torch.Tensor,
    scales: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    scaling: str,
    fp8_dtype: torch.dtype,
    numerics: str = "fused_fp32",
    offset: float = 0.0,
    static_scale: torch.Tensor | None = None,
    normalized: torch.Tensor | None = None,
) -> list[Fp8Report]:
    """Judge a backend's (q, scales) on x (or on ``normalized``, the h it returned with a
    residual): the scales (dynamic) or their identity with the caller's (static), then the codes
    given those scales."""
    tolerance = TOLERANCES[numerics]
    source = x if normalized is None else normalized
    ref = reference_fp8(source, weight, eps, scaling=scaling, fp8_dtype=fp8_dtype, offset=offset)
    n = ref.y.shape[1]
    if scaling == "per_tensor":
        same = scales.detach().cpu().reshape(-1).equal(static_scale.detach().cpu().reshape(-1))
        reports = [Fp8Report("scales", 0 if same else 1, 1, 0, "" if same else
                             f"got {scales}, the caller passed {static_scale}")]  # fmt: skip
    else:
        got = scales
        if scaling == "per_token" and tuple(scales.shape) == tuple(source.shape[:-1]):
            got = scales.reshape(-1)  # one per row of [..., N]: x's leading dims
        reports = [compare_scales(got, ref, tolerance, n)]
    reports.append(compare_codes(q, ref.y, scales, scaling, fp8_dtype, tolerance))
    return reports
