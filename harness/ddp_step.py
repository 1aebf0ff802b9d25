"""python -m harness.ddp_step: a data-parallel training step with our RMSNorm and with the stock
one, same seed and data, one process a GPU.

    torchrun --nproc-per-node 2 -m harness.ddp_step --out $OUT/ddp.json     # two GPUs, NCCL
    torchrun --nproc-per-node 1 -m harness.ddp_step --out $OUT/ddp.json     # one GPU
    python -m harness.ddp_step --device cpu --hidden 64 ...                 # CPU, gloo, interpreter

The entry point: the command line, the process group, run_all (for each --hidden the three
runs and their checks) and the JSON record. The model is a thin Llama (harness.tiny_llama)
whose residual stream is wide (--hidden, the norm's N) and its attention and MLP narrow.

Three runs of the same steps, each from the same fp32 initialization and the same tokens
(harness.ddp_train):
  ours       our norm (impls.triton_rmsnorm.RMSNorm), --dtype parameters and activations
  stock      torch.nn.RMSNorm, --dtype
  reference  torch.nn.RMSNorm in fp32: the yardstick of "bf16 noise"

DDP all-reduces gradient buckets (--bucket-cap-mb) while the backward runs (or --fsdp: FSDP2).
The result records per-step losses (the mean over ranks), step times (ours and stock), the norm
weights' gradients at the first step against the reference, and with --profile the NCCL kernels
that ran beside norm kernels in one profiled step. A step that runs past its time limit
(--step-timeout-s, --warmup-timeout-s) makes the process print which step hung and exit (a hung
kernel cannot be interrupted); collectives also time out through the process group
(--pg-timeout-s).

AdamW's learning rate defaults to 1e-3 up to 4096 wide and 1e-3 x 4096 / hidden beyond
(default_lr; --lr overrides it): at lr 1e-3 the 32768-wide runs, the fp32 reference included,
overshot and climbed back (on the H200), and a check between chaotic runs cannot tell a right
norm from a wrong one. Each width gets a verdict (harness.ddp_checks): failed when the step-0
gradient rule fails, inconclusive when the reference or the stock run diverged, else the loss
rule's passed or failed. Exit status: 0 passed, 1 failed, 3 a step hung, 4 inconclusive.

NVLink multicast stays off: NCCL_NVLS_ENABLE=1 is refused, and NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set where unset (in main, before
the process group starts; nothing is set at import).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from harness.ddp_checks import compare_norm_grads, divergence, overall_status, verdict
from harness.ddp_train import RunSpec, StepWatchdog, train
from harness.tiny_llama import NORMS, ModelConfig

#: The machine's NVLink-multicast settings, kept off (the project never turns them on).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

#: Learning rate (default_lr): BASE_LR up to BASE_LR_WIDTH wide, then BASE_LR x BASE_LR_WIDTH /
#: hidden. Why: AdamW moves every element by about lr whatever its gradient's size, so a matrix
#: reading the residual stream (fan_in = hidden: q, k, v, gate, up, head) changes its output by
#: about lr x hidden relative to its init (nn.Linear's, of scale 1/sqrt(fan_in)); holding
#: lr x hidden at the value that trained smoothly (1e-3 at 4096) holds the step's relative size
#: (the muP rule for Adam's hidden matrices, here applied to every parameter: the embedding and
#: the norm weights then move more slowly than they could, which a check does not mind).
BASE_LR = 1e-3
BASE_LR_WIDTH = 4096

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


# ---- each width: its runs and their checks ------------------------------------------------


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
