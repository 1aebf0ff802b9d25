"""The training runs of harness.ddp_step: train() trains one model (RunSpec: a name, a norm, a
dtype) args.warmup + args.steps AdamW steps on this rank's fixed batch, from the same fp32
initialization and the same tokens as every other run; StepWatchdog aborts a step that hangs.

DDP all-reduces gradient buckets (--bucket-cap-mb) while the backward runs (or --fsdp: FSDP2's
fully_shard per block, reduce-scatters overlapping the backward). A run records per-step losses
(the mean over ranks), step times (the slowest rank's), the norm weights' gradients at the
first step (for harness.ddp_checks' gradient rule), and with --profile the NCCL kernels that ran
beside norm kernels in one profiled step (profile_overlap, kernel_overlap). A step that runs
past its time limit makes the process print which step hung and exit with
StepWatchdog.EXIT_HUNG (3): a hung kernel cannot be interrupted.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from harness.tiny_llama import ModelConfig, NormFactory, build_model, is_norm, make_tokens

# ---- the watchdog -------------------------------------------------------------------------


class StepWatchdog:
    """A daemon thread: a step armed with a limit that is still running past it gets a message
    on stderr naming the rank and the step, then the process exits with EXIT_HUNG (a hung
    kernel or collective cannot be interrupted from Python). on_hang runs first (best effort:
    it writes what was measured so far)."""

    EXIT_HUNG = 3

    def __init__(self, rank: int, on_hang: Callable[[str], None] | None = None) -> None:
        self.rank, self.on_hang = rank, on_hang
        self._lock = threading.Condition()
        self._label: str | None = None
        self._deadline = 0.0
        self._limit = 0.0
        self._thread = threading.Thread(target=self._watch, name="ddp_step-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, limit_s: float) -> None:
        with self._lock:
            self._label, self._limit = label, limit_s
            self._deadline = time.monotonic() + limit_s
            self._lock.notify()

    def disarm(self) -> None:
        with self._lock:
            self._label = None
            self._lock.notify()

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._label is None:
                    self._lock.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(timeout=left)
                    continue
                message = (
                    f"ddp_step: rank {self.rank}: STEP HUNG: {self._label} is still running after "
                    f"{self._limit:g} s (its limit); aborting the process"
                )
                print(message, file=sys.stderr, flush=True)
                try:
                    if self.on_hang is not None:
                        self.on_hang(message)
                finally:
                    os._exit(self.EXIT_HUNG)


# ---- a run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    name: str
    norm: NormFactory
    dtype: torch.dtype


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wrap(model: nn.Module, args, device: torch.device) -> nn.Module:
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=True,
    )


def _norm_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """The norm weights' gradients (full tensors, fp32, on the CPU), by module name."""
    grads = {}
    for name, module in model.named_modules():
        if is_norm(module) and module.weight is not None and module.weight.grad is not None:
            grad = module.weight.grad
            grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            grads[name.removeprefix("module.")] = grad.detach().float().cpu()
    return grads


def train(
    spec: RunSpec,
    c: ModelConfig,
    lr: float,
    args,
    device: torch.device,
    watchdog: StepWatchdog,
    partial: dict,
) -> dict:
    """spec's model, args.warmup + args.steps AdamW steps at `lr` on this rank's fixed batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(c, spec.norm, spec.dtype, device, args.seed)
    wrapped = _wrap(model, args, device)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=lr, weight_decay=0.0)
    tokens = make_tokens(c, args.batch, args.seed, rank, device)
    run = partial.setdefault(spec.name, {"losses": [], "step_s": []})
    norm_grads = {}
    for step in range(args.warmup + args.steps):
        limit = args.warmup_timeout_s if step < args.warmup else args.step_timeout_s
        watchdog.arm(f"run {spec.name!r} step {step}", limit)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = wrapped(tokens)
        loss.backward()
        if step == 0:
            norm_grads = _norm_grads(model)
        optimizer.step()
        mean = loss.detach().reshape(1).float().clone()  # all_reduce writes in place
        dist.all_reduce(mean)
        value = mean.item() / world  # waits for the step's kernels
        _synchronize(device)
        elapsed = time.perf_counter() - start
        watchdog.disarm()
        run["losses"].append(value)
        run["step_s"].append(elapsed)
    if args.profile and device.type == "cuda":
        watchdog.arm(f"run {spec.name!r} profiled step", args.step_timeout_s)
        run["overlap"] = profile_overlap(wrapped, optimizer, tokens, device, rank)
        watchdog.disarm()
    del wrapped, optimizer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # The slowest rank's time of each step: the step is as long as its last rank.
    times = torch.tensor(run["step_s"], dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    run["step_s_max_rank"] = times.tolist()
    timed = run["step_s_max_rank"][args.warmup :]
    run["median_step_s"] = statistics.median(timed) if timed else None
    run["first_step_s"] = run["step_s_max_rank"][0]
    run["_norm_grads"] = norm_grads
    return run


def profile_overlap(wrapped, optimizer, tokens, device, rank: int) -> dict:
    """One more step (not counted) under torch.profiler on every rank; rank 0's CUDA kernels
    from its Chrome trace: how many norm kernels (our rmsnorm_* ones, or the stock norm's) ran
    while an NCCL kernel ran on another stream, and for how long kernels overlapped NCCL."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        optimizer.zero_grad(set_to_none=True)
        wrapped(tokens).backward()
        optimizer.step()
        _synchronize(device)
    if rank != 0:
        return {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            events = json.loads(path.read_text())
        events = events.get("traceEvents", events) if isinstance(events, dict) else events
        return kernel_overlap(events)
    except Exception as error:  # evidence, not the check: keep the reason in the result
        return {"error": f"{type(error).__name__}: {error}"}


def kernel_overlap(trace_events: list) -> dict:
    """From Chrome-trace events: NCCL kernels, norm kernels, and the norm kernels (and the
    compute time) that overlapped an NCCL kernel on another stream."""
    kernels = [
        e
        for e in trace_events
        if isinstance(e, dict) and e.get("cat") == "kernel" and "ts" in e and "dur" in e
    ]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    compute = [e for e in kernels if "nccl" not in e["name"].lower()]

    def is_norm_kernel(name: str) -> bool:
        lowered = name.lower()
        return lowered.startswith("rmsnorm_") or "rms" in lowered or "norm" in lowered

    def stream(e):  # Kineto writes a kernel's stream as args.stream and as its tid
        return e.get("args", {}).get("stream", e.get("tid"))

    def overlap_us(e) -> float:
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        total = 0.0
        for n in nccl:
            if stream(n) == stream(e):
                continue  # the same stream: ordered, not overlapping
            n_start, n_end = float(n["ts"]), float(n["ts"]) + float(n["dur"])
            total += max(0.0, min(end, n_end) - max(start, n_start))
        return total

    norms = [e for e in compute if is_norm_kernel(e["name"])]
    beside = [e for e in norms if overlap_us(e) > 0]
    return {
        "nccl_kernels": len(nccl),
        "nccl_us": round(sum(float(e["dur"]) for e in nccl), 1),
        "norm_kernels": len(norms),
        "norm_kernels_beside_nccl": len(beside),
        "norm_kernel_names_beside_nccl": sorted({e["name"][:80] for e in beside}),
        "compute_us_beside_nccl": round(sum(overlap_us(e) for e in compute), 1),
    }
