"""The rules that judge harness.ddp_step's runs: the loss rule (compare_losses), the gradient
rule on the norm weights at step 0 (compare_norm_grads), the stability rule (divergence), one
width's verdict from them (verdict), and the record's status and the exit status from the
widths' verdicts (overall_status, EXIT_*).

Each width gets a verdict: failed when the step-0 gradient rule fails (it precedes any
training), inconclusive when the reference or the stock run (YARDSTICKS) diverged (a loss not
finite, or rebounding more than DIVERGE_REBOUND x loss[0] above the lowest before it), else the
loss rule's passed or failed. Exit status: 0 passed, 1 failed, 3 a step hung
(harness.ddp_train.StepWatchdog.EXIT_HUNG), 4 inconclusive.
"""

from __future__ import annotations

import math
import statistics

import torch

#: Loss rule (compare_losses): ours may be at most LOSS_FACTOR times as far from the fp32
#: reference as the stock norm in the same dtype (flash-attention's rule for its kernels), plus
#: LOSS_REL_ATOL of the loss's size. Why: both 16-bit runs differ from fp32 by the rounding of
#: every matmul and activation, which the stock run measures; our norm rounds its output once,
#: as the stock one does, so its run lands in the same band. The atol (2^-8, one bf16 ulp of the
#: loss relative to its size) covers a band near zero at the first steps.
LOSS_FACTOR = 2.0
LOSS_REL_ATOL = 2.0**-8
#: Gradient rule (compare_norm_grads), per norm weight at the first step (same weights, same
#: tokens): relative L2 error against the reference at most GRAD_FACTOR x the stock norm's,
#: plus GRAD_REL_ATOL (2^-8: the rounding of dw to bf16 alone is up to 2^-9 of each element).
#: A dw that is wrong (say, zero) has a relative error near 1 and fails.
GRAD_FACTOR = 2.0
GRAD_REL_ATOL = 2.0**-8
#: Stability rule (divergence): a run diverged when a loss is not finite or rebounds above the
#: lowest loss before it by more than DIVERGE_REBOUND x loss[0] (a loss that climbs from the
#: start counts: the lowest before step 1 is loss[0]).
#: Why: the runs fit one fixed batch, so a healthy run falls fast and stays down (hidden 4096 on
#: the H200: 7.08 -> 0.04 in 8 steps); one that climbs back has overshot, and there bf16 noise
#: is amplified step by step, so the distance between two runs says nothing about the norm.
#: 1/8 of loss[0] (0.9 nats at 7.1) is far above the bumps of a stable run (0.18 at hidden 32768
#: and the width-scaled lr, on the CPU) and far below the H200's rebounds at lr 1e-3 (6.6).
DIVERGE_REBOUND = 1 / 8
#: Exit status: 0 every check passed (or none ran), 1 a check failed, 3 a step hung
#: (harness.ddp_train.StepWatchdog.EXIT_HUNG), 4 inconclusive: no check failed but a yardstick
#: run (the fp32 reference or the stock norm) diverged, so the loss rule was not judged. Not 2:
#: argparse exits 2 on a bad command line.
EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INCONCLUSIVE = 4


def compare_losses(ours: list[float], stock: list[float], reference: list[float]) -> dict:
    """The loss rule (LOSS_FACTOR, LOSS_REL_ATOL): max over steps of |ours - reference| at
    most LOSS_FACTOR x max |stock - reference| + LOSS_REL_ATOL x mean |reference|."""
    if not (len(ours) == len(stock) == len(reference)) or not ours:
        raise ValueError(
            f"losses: expected three equally long non-empty lists, got {len(ours)}, "
            f"{len(stock)}, {len(reference)}"
        )
    finite = all(math.isfinite(v) for v in (*ours, *stock, *reference))
    ours_off = max(abs(o - r) for o, r in zip(ours, reference, strict=True))
    stock_off = max(abs(s - r) for s, r in zip(stock, reference, strict=True))
    atol = LOSS_REL_ATOL * statistics.fmean(abs(r) for r in reference)
    bound = LOSS_FACTOR * stock_off + atol
    return {
        "rule": f"max|ours-ref| <= {LOSS_FACTOR:g} * max|stock-ref| + {LOSS_REL_ATOL:g} * "
        "mean|ref| (ref: the stock norm in fp32)",
        "ours_vs_reference_max": ours_off,
        "stock_vs_reference_max": stock_off,
        "ours_vs_stock_max": max(abs(o - s) for o, s in zip(ours, stock, strict=True)),
        "bound": bound,
        "finite": finite,
        "passed": finite and ours_off <= bound,
    }


def compare_norm_grads(
    ours: dict[str, torch.Tensor], stock: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> dict:
    """The gradient rule (GRAD_FACTOR, GRAD_REL_ATOL), per norm weight at the first step."""
    if not ours or ours.keys() != stock.keys() or ours.keys() != ref.keys():
        raise ValueError(
            f"norm grads: expected the same non-empty norm names in every run, got "
            f"{sorted(ours)}, {sorted(stock)}, {sorted(ref)}"
        )
    per_norm, passed = {}, True
    for name, want in ref.items():
        scale = want.norm().item() or 1.0
        ours_err = (ours[name] - want).norm().item() / scale
        stock_err = (stock[name] - want).norm().item() / scale
        bound = GRAD_FACTOR * stock_err + GRAD_REL_ATOL
        ok = math.isfinite(ours_err) and ours_err <= bound
        passed = passed and ok
        per_norm[name] = {"ours_rel_err": ours_err, "stock_rel_err": stock_err, "bound": bound,
                          "passed": ok}  # fmt: skip
    return {
        "rule": f"|g_ours-g_ref|/|g_ref| <= {GRAD_FACTOR:g} * |g_stock-g_ref|/|g_ref| + "
        f"{GRAD_REL_ATOL:g}, per norm weight at step 0",
        "per_norm": per_norm,
        "passed": passed,
    }


def divergence(losses: list[float]) -> str | None:
    """The stability rule (DIVERGE_REBOUND) on one run's losses: why it diverged, or None."""
    if not losses:
        raise ValueError("losses: expected a non-empty list")
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            return f"loss {loss} at step {step}"
    for step in range(1, len(losses)):
        lowest = min(losses[:step])
        if losses[step] - lowest > DIVERGE_REBOUND * losses[0]:
            return (
                f"loss {losses[step]:.4g} at step {step}, {losses[step] - lowest:.4g} above the "
                f"lowest before it ({lowest:.4g}; limit {DIVERGE_REBOUND:g} x loss[0] = "
                f"{DIVERGE_REBOUND * losses[0]:.4g})"
            )
    return None


#: The runs whose divergence makes the loss rule unjudgeable: the reference is the yardstick,
#: and the stock run sets the band (a diverging stock run widens it until anything passes).
YARDSTICKS = ("reference", "stock")


def verdict(
    ours: list[float], stock: list[float], reference: list[float], norm_grads: dict | None = None
) -> dict:
    """One width's verdict from its recorded losses and (when given) compare_norm_grads'
    result: "failed" when the gradient rule failed (step 0 precedes any training, so it holds
    on a diverging run too), else "inconclusive" when a yardstick run diverged, else the loss
    rule's "passed" or "failed"."""
    losses = compare_losses(ours, stock, reference)
    runs = {"ours": ours, "stock": stock, "reference": reference}
    stability = {name: divergence(run) for name, run in runs.items()}
    diverged = [name for name in YARDSTICKS if stability[name] is not None]
    unjudged = "; ".join(f"the {name} run diverged ({stability[name]})" for name in diverged)
    if norm_grads is not None and not norm_grads["passed"]:
        outcome, reason = "failed", "the norm weights' gradients at step 0 failed their rule"
        if diverged:
            reason += f" (the loss rule was not judged: {unjudged})"
    elif diverged:
        outcome, reason = "inconclusive", f"{unjudged}: the loss rule was not judged"
    elif not losses["passed"]:
        outcome = "failed"
        reason = (
            f"the losses failed their rule: max|ours-ref| {losses['ours_vs_reference_max']:.4g} "
            f"> bound {losses['bound']:.4g}"
            if losses["finite"]
            else "the losses failed their rule: a loss is not finite"
        )
    else:
        outcome, reason = "passed", "every check passed"
    return {
        "verdict": outcome,
        "reason": reason,
        "stability_rule": f"diverged: a loss not finite, or more than {DIVERGE_REBOUND:g} x "
        f"loss[0] above the lowest loss before it (judged on: {', '.join(YARDSTICKS)})",
        "diverged": stability,
        "losses": losses,
    }


def overall_status(results: dict) -> tuple[str, int]:
    """The record's status and the exit status from the widths' verdicts: a failure anywhere
    fails, else an inconclusive width makes the whole inconclusive (EXIT_INCONCLUSIVE)."""
    by_outcome: dict[str, list[str]] = {}
    for key, entry in results.items():
        if "verdict" in entry:
            by_outcome.setdefault(entry["verdict"], []).append(f"{key}: {entry['reason']}")
    if "failed" in by_outcome:
        return "FAILED: " + "; ".join(by_outcome["failed"]), EXIT_FAILED
    if "inconclusive" in by_outcome:
        return "INCONCLUSIVE: " + "; ".join(by_outcome["inconclusive"]), EXIT_INCONCLUSIVE
    return "passed", EXIT_PASSED
