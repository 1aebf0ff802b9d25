"""python -m harness.ddp_step: a data-parallel training step with our RMSNorm and with the stock
one, same seed and data, one process a GPU.

    torchrun --nproc-per-node 2 -m harness.ddp_step --out $OUT/ddp.json     # two GPUs, NCCL
    torchrun --nproc-per-node 1 -m harness.ddp_step --out $OUT/ddp.json     # one GPU
    python -m harness.ddp_step --device cpu --hidden 64 ...                 # CPU, gloo, interpreter

The model is a thin Llama written in plain PyTorch (tokens -> embedding -> blocks of RMSNorm,
causal attention through SDPA with rotary embeddings, RMSNorm, SwiGLU MLP -> RMSNorm -> head).
Its residual stream is wide (--hidden, the norm's N) and its attention and MLP narrow, so that
N = 32768 (where 16-bit rows take the grouped held-row paths) fits on one GPU with its optimizer.

Three runs of the same steps, each from the same fp32 initialization and the same tokens:
  ours       our norm (impls.triton_rmsnorm.RMSNorm), --dtype parameters and activations
  stock      torch.nn.RMSNorm, --dtype
  reference  torch.nn.RMSNorm in fp32: the yardstick of "bf16 noise"

DDP all-reduces gradient buckets (--bucket-cap-mb) while the backward runs (or --fsdp: FSDP2's
fully_shard per block, reduce-scatters overlapping the backward). The result records per-step
losses (the mean over ranks), step times (ours and stock), the norm weights' gradients at the
first step against the reference, and with --profile the NCCL kernels that ran beside norm
kernels in one profiled step. A step that runs past its time limit makes the process print
which step hung and exit (a hung kernel cannot be interrupted); collectives also time out
through the process group (--pg-timeout-s).

AdamW's learning rate defaults to 1e-3 up to 4096 wide and 1e-3 x 4096 / hidden beyond
(default_lr; --lr overrides it): at lr 1e-3 the 32768-wide runs, the fp32 reference included,
overshot and climbed back (on the H200), and a check between chaotic runs cannot tell a right
norm from a wrong one. Each width gets a verdict (verdict()): failed when the step-0 gradient
rule fails (it precedes any training), inconclusive when the reference or the stock run
diverged (divergence(): a loss not finite, or rebounding more than DIVERGE_REBOUND x loss[0]
above the lowest before it), else the loss rule's passed or failed. Exit status: 0 passed, 1
failed, 3 a step hung, 4 inconclusive.

NVLink multicast stays off: NCCL_NVLS_ENABLE=1 is refused, and NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set where unset (in main, before
the process group starts; nothing is set at import).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

#: The machine's NVLink-multicast settings, kept off (the project never turns them on).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

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
#: Learning rate (default_lr): BASE_LR up to BASE_LR_WIDTH wide, then BASE_LR x BASE_LR_WIDTH /
#: hidden. Why: AdamW moves every element by about lr whatever its gradient's size, so a matrix
#: reading the residual stream (fan_in = hidden: q, k, v, gate, up, head) changes its output by
#: about lr x hidden relative to its init (nn.Linear's, of scale 1/sqrt(fan_in)); holding
#: lr x hidden at the value that trained smoothly (1e-3 at 4096) holds the step's relative size
#: (the muP rule for Adam's hidden matrices, here applied to every parameter: the embedding and
#: the norm weights then move more slowly than they could, which a check does not mind).
BASE_LR = 1e-3
BASE_LR_WIDTH = 4096
#: Exit status: 0 every check passed (or none ran), 1 a check failed, 3 a step hung
#: (StepWatchdog.EXIT_HUNG), 4 inconclusive: no check failed but a yardstick run (the fp32
#: reference or the stock norm) diverged, so the loss rule was not judged. Not 2: argparse
#: exits 2 on a bad command line.
EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INCONCLUSIVE = 4

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def default_lr(hidden: int) -> float:
    """The learning rate for a residual stream `hidden` wide (BASE_LR, BASE_LR_WIDTH)."""
    return BASE_LR * min(1.0, BASE_LR_WIDTH / hidden)


def keep_multicast_off(environ: dict | None = None) -> None:
    """Refuse NCCL_NVLS_ENABLE=1 and set the multicast-off defaults where unset."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_NVLS_ENABLE") == "1":
        raise RuntimeError(
            "NCCL_NVLS_ENABLE=1: this script never turns NVLink multicast on (the machine keeps "
            "it off); unset NCCL_NVLS_ENABLE or set it to 0"
        )
    for name, value in MULTICAST_OFF.items():
        environ.setdefault(name, value)


# ---- the model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 4096
    layers: int = 2
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 1024
    vocab: int = 1024
    seq: int = 256
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads: expected a multiple of kv_heads={self.kv_heads}, got {self.heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim: expected an even number (rotary), got {self.head_dim}")


NormFactory = Callable[[int, float], nn.Module]


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [B, heads, S, D] in fp32, back to x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, (b, s, _) = self.c, x.shape
        q = self.q(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, c.head_dim, 2, device=x.device) / c.head_dim))
        angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)
        q, k = _rotary(q, angles.cos(), angles.sin()), _rotary(k, angles.cos(), angles.sin())
        if c.kv_heads != c.heads:
            k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
            v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c: ModelConfig, norm: NormFactory) -> None:
        super().__init__()
        self.attn_norm, self.attn = norm(c.hidden, c.eps), Attention(c)
        self.mlp_norm, self.mlp = norm(c.hidden, c.eps), SwiGLU(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class TinyLlama(nn.Module):
    """Pre-norm Llama blocks; loss() is next-token cross entropy (in fp32)."""

    def __init__(self, c: ModelConfig, norm: NormFactory) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c, norm) for _ in range(c.layers))
        self.norm = norm(c.hidden, c.eps)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def ours_norm(n: int, eps: float) -> nn.Module:
    from impls.triton_rmsnorm import RMSNorm  # triton is imported here, after TRITON_INTERPRET

    return RMSNorm(n, eps=eps)


def stock_norm(n: int, eps: float) -> nn.Module:
    return nn.RMSNorm(n, eps=eps)


NORMS: dict[str, NormFactory] = {"ours": ours_norm, "stock": stock_norm}


def is_norm(module: nn.Module) -> bool:
    from impls.triton_rmsnorm import RMSNorm

    return isinstance(module, (RMSNorm, nn.RMSNorm))


def build_model(
    c: ModelConfig, norm: NormFactory, dtype: torch.dtype, device: torch.device, seed: int
) -> TinyLlama:
    """Initialized in fp32 from `seed` on `device` (so every run starts from the same values,
    whichever norm it has: neither norm draws from the RNG), then cast to dtype."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = TinyLlama(c, norm)
    return model.to(dtype)


def make_tokens(c: ModelConfig, batch: int, seed: int, rank: int, device) -> torch.Tensor:
    """A fixed batch per rank (drawn on the CPU): the steps fit it, so the loss falls."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(0, c.vocab, (batch, c.seq), generator=gen).to(device)


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


# ---- the checks ---------------------------------------------------------------------------


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


def run_all(args, device: torch.device, watchdog: StepWatchdog, partial: dict) -> dict:
    """For each --hidden: the three runs and their checks."""
    dtype = _DTYPES[args.dtype]
    specs = [] if args.no_ours else [RunSpec("ours", NORMS["ours"], dtype)]
    specs.append(RunSpec("stock", NORMS["stock"], dtype))
    if not args.no_reference:
        specs.append(RunSpec("reference", NORMS["stock"], torch.float32))
    results = {}
    for hidden in args.hidden:
        c = model_config(args, hidden)
        lr = args.lr if args.lr is not None else default_lr(hidden)
        runs = partial.setdefault(f"hidden={hidden}", {})
        for spec in specs:
            train(spec, c, lr, args, device, watchdog, runs)
        grads = {name: run.pop("_norm_grads") for name, run in runs.items()}
        entry = {"config": asdict(c), "lr": lr, "rows_per_norm_call": args.batch * c.seq,
                 "runs": runs}  # fmt: skip
        if "ours" in runs and "reference" in runs:
            entry["norm_grads"] = compare_norm_grads(grads["ours"], grads["stock"],
                                                     grads["reference"])  # fmt: skip
            judged = verdict(runs["ours"]["losses"], runs["stock"]["losses"],
                             runs["reference"]["losses"], entry["norm_grads"])  # fmt: skip
            entry["losses"] = judged.pop("losses")
            entry.update(judged)
            entry["passed"] = judged["verdict"] == "passed"
        elif "reference" in runs:  # --no-ours: whether the stock runs trained stably
            entry["diverged"] = {name: divergence(run["losses"]) for name, run in runs.items()}
        ours_s = runs["ours"]["median_step_s"] if "ours" in runs else None
        stock_s = runs["stock"]["median_step_s"]
        entry["step_time_ratio_stock_over_ours"] = stock_s / ours_s if ours_s and stock_s else None
        results[f"hidden={hidden}"] = entry
    return results


def model_config(args, hidden: int) -> ModelConfig:
    return ModelConfig(hidden=hidden, layers=args.layers, heads=args.heads,
                       kv_heads=args.kv_heads or args.heads, head_dim=args.head_dim, ffn=args.ffn,
                       vocab=args.vocab, seq=args.seq)  # fmt: skip


# ---- the command line ---------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.ddp_step",
        description="A data-parallel training step of a thin Llama with our RMSNorm against the "
        "stock torch.nn.RMSNorm (same seed and data), plus a stock fp32 reference run.",
    )
    p.add_argument("--out", type=Path, help="JSON result (written by rank 0)")
    p.add_argument("--hidden", type=int, nargs="+", default=[4096, 32768],
                   help="residual width(s), the norm's N; >= 32768 takes the grouped paths on "
                   "16-bit rows (default: 4096 32768)")  # fmt: skip
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=1024, help="SwiGLU width")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--steps", type=int, default=10, help="timed steps, after --warmup")
    p.add_argument("--warmup", type=int, default=2, help="first steps (compile, tune): untimed")
    p.add_argument("--lr", type=float, default=None,
                   help=f"AdamW's learning rate for every width (default: {BASE_LR:g} up to "
                   f"{BASE_LR_WIDTH} wide, then {BASE_LR:g} x {BASE_LR_WIDTH} / hidden)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cuda: NCCL, one GPU a process (LOCAL_RANK); cpu: gloo and the Triton "
                   "interpreter (a check of the logic, not a measurement)")  # fmt: skip
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient buckets")
    p.add_argument(
        "--profile",
        action="store_true",
        help="one more step under torch.profiler: NCCL kernels beside norm kernels",
    )
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the fp32 reference run (then no loss or gradient check)",
    )
    p.add_argument(
        "--no-ours",
        action="store_true",
        help="skip our norm's run (then no loss or gradient check): the stock runs alone, e.g. "
        "to see on the CPU whether a width and learning rate train stably",
    )
    p.add_argument(
        "--step-timeout-s",
        type=float,
        default=60.0,
        help="a timed step running longer aborts the process",
    )
    p.add_argument(
        "--warmup-timeout-s",
        type=float,
        default=300.0,
        help="the same for the warmup steps (compiling and tuning)",
    )
    p.add_argument("--pg-timeout-s", type=float, default=300.0,
                   help="the process group's collective timeout")  # fmt: skip
    return p


def _check_args(args) -> None:
    for name in ("steps", "batch", "layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}: expected a positive int, got {getattr(args, name)}")
    if args.warmup < 1:
        raise ValueError(f"--warmup: expected at least 1 (the first step compiles), got "
                         f"{args.warmup}")  # fmt: skip
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr: expected a learning rate > 0, got {args.lr}")
    for name in ("step_timeout_s", "warmup_timeout_s", "pg_timeout_s"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')}: expected seconds > 0, got "
                             f"{getattr(args, name)}")  # fmt: skip


def init_process_group(args) -> torch.device:
    """NCCL with one GPU a process (LOCAL_RANK), or gloo on the CPU; a single process without
    torchrun's environment gets a one-rank group on a local port."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    timeout = datetime.timedelta(seconds=args.pg_timeout_s)
    if args.device == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device here; use --device cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        raise RuntimeError(
            f"LOCAL_RANK={local_rank}: only {torch.cuda.device_count()} CUDA devices; run one "
            "process a GPU (torchrun --nproc-per-node <= the GPU count)"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timeout, device_id=device)
    return device


def _summary(results: dict) -> str:
    lines = ["hidden  run        first_s  median_step_ms  loss[0] -> loss[-1]"]
    for key, entry in results.items():
        for name, run in entry["runs"].items():
            median = run["median_step_s"]
            lines.append(
                f"{key.split('=')[1]:>6}  {name:<9}  {run['first_step_s']:7.2f}  "
                f"{(median or 0) * 1e3:14.2f}  {run['losses'][0]:.5f} -> {run['losses'][-1]:.5f}"
            )
        lines.append(f"        lr {entry['lr']:.3g}")
        for name, why in entry.get("diverged", {}).items():
            if why is not None:
                lines[-1] += f"; {name} diverged: {why}"
        if "losses" in entry:
            lines.append(
                f"        losses: |ours-ref| {entry['losses']['ours_vs_reference_max']:.2e} <= "
                f"{entry['losses']['bound']:.2e}: {entry['losses']['passed']}; norm grads: "
                f"{entry['norm_grads']['passed']}; verdict: {entry['verdict']}"
            )
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _check_args(args)
    keep_multicast_off()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    device = init_process_group(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    partial: dict = {}

    def write(status: str, results: dict) -> None:
        if rank != 0 or args.out is None:
            return
        from harness import provenance

        record = {
            "provenance": provenance.collect(),
            "status": status,
            "world_size": world,
            "backend": dist.get_backend(),
            "parallel": "fsdp2" if args.fsdp else "ddp",
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "env": {k: os.environ.get(k) for k in (*MULTICAST_OFF, "RMSNORM_TRITON_AUTOTUNE")},
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")

    def on_hang(message: str) -> None:
        strip = {k: {n: {f: v for f, v in r.items() if f != "_norm_grads"} for n, r in e.items()}
                 for k, e in partial.items()}  # fmt: skip
        write(message, strip)

    watchdog = StepWatchdog(rank, on_hang)
    try:
        results = run_all(args, device, watchdog, partial)
        status, code = overall_status(results)
        write(status, results)
        if rank == 0:
            print(_summary(results))
            print(f"ddp_step: {status}")
            if args.out is not None:
                print(f"ddp_step: wrote {args.out}")
        return code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
