"""python -m harness.first_call OUT.json: what the first call of a shape class costs.

For each shape (M, N, dtype; default: real-model shapes) and each cache state, a fresh Python
process first runs the op once at another shape class (WARMUP_SHAPE: as a running model has,
so that what is timed is a new shape class, not the process's own start: CUDA's lazy loading,
autograd's threads, Triton's launcher builds), then makes one forward+backward call of our op
(torch.autograd.grad through rmsnorm) at the shape, then steady calls of it, and reports:
- process_first_s: the warm-up call's wall time (the first call in a fresh process);
- first_s: the shape's first call's wall time, host and device (synchronized before and after);
- steady_s: a steady call's, the median of 5;
- first_extra_bytes / steady_extra_bytes: torch.cuda.max_memory_allocated above the memory
  held before the call (inputs), for the first call and for a steady one.
Cache states: "cold", TRITON_CACHE_DIR an empty folder (every kernel compiled); "warm", the
same folder again in a new process (compiled kernels on disk, loaded). Each shape gets its own
folder, so nothing compiled for one shape serves another. A baseline row times
torch.nn.functional.rms_norm the same way (its first call and a steady one).

The op runs as a user gets it (the dispatch table of this GPU, or the heuristic; no runtime
tuning): RMSNORM_TRITON_* variables are removed from the children's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Hidden sizes of current model families at a training-step M (the issue's shapes), a decode M,
#: and per-head QK-norm.
DEFAULT_SHAPES = (
    (2432, 4096, "bfloat16"),
    (2048, 8192, "bfloat16"),
    (1024, 18432, "float16"),
    (4096, 5120, "bfloat16"),
    (8, 7168, "bfloat16"),
    (32768, 128, "bfloat16"),
)


#: The warm-up call's [M, N] (in the shape's dtype): a hidden size no default shape has.
WARMUP_SHAPE = (3, 1000)


def _parse_shape(text: str) -> tuple[int, int, str]:
    try:
        m, n, dtype = text.split("x")
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError
        return int(m), int(n), dtype
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape: expected MxNxDTYPE with DTYPE bfloat16, float16 or float32, got {text!r}"
        ) from None


def child(m: int, n: int, dtype_name: str, backend: str) -> dict:
    """One process's measurement (run with --child)."""
    import torch

    dtype = getattr(torch, dtype_name)
    if backend == "ours":
        from impls.triton_rmsnorm import rmsnorm

        def norm(x, w):
            return rmsnorm(x, w, 1e-6)
    else:

        def norm(x, w):
            return torch.nn.functional.rms_norm(x, x.shape[-1:], w, 1e-6)

    torch.cuda.init()
    g = torch.Generator(device="cuda").manual_seed(0)

    def inputs(rows, cols):
        x = torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g).requires_grad_(True)
        w = torch.randn(cols, device="cuda", dtype=dtype, generator=g).requires_grad_(True)
        return x, w, torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g)

    def timed(x, w, dy):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        torch.autograd.grad(norm(x, w), (x, w), dy)
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated() - base

    rows, cols = WARMUP_SHAPE
    process_first_s, _ = timed(*inputs(rows, cols if cols != n else cols + 1))  # another class
    case = inputs(m, n)
    first_s, first_extra = timed(*case)
    steady = [timed(*case) for _ in range(5)]
    return {
        "process_first_s": process_first_s,
        "first_s": first_s,
        "steady_s": statistics.median(s for s, _ in steady),
        "first_extra_bytes": first_extra,
        "steady_extra_bytes": max(b for _, b in steady),
    }


def _run_child(m: int, n: int, dtype: str, backend: str, cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMSNORM_TRITON_")}
    env["TRITON_CACHE_DIR"] = cache_dir
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "harness.first_call", "--child", f"{m}x{n}x{dtype}",
         "--backend", backend],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"child {m}x{n}x{dtype} {backend} failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - started
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.first_call", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("out", nargs="?", type=Path, help="the JSON file to write")
    parser.add_argument("--shape", action="append", type=_parse_shape, default=None,
                        help="MxNxDTYPE (repeatable); default: real-model shapes")  # fmt: skip
    parser.add_argument("--child", type=_parse_shape, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="ours", choices=("ours", "torch"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(*args.child, args.backend)))
        return 0
    if args.out is None:
        parser.error("out: the JSON file to write is required")
    import torch

    if not torch.cuda.is_available():
        print("first_call: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness import provenance

    rows = []
    for m, n, dtype in args.shape or DEFAULT_SHAPES:
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            for backend, state in (("ours", "cold"), ("ours", "warm"), ("torch", "warm")):
                row = {"m": m, "n": n, "dtype": dtype, "backend": backend, "cache": state,
                       **_run_child(m, n, dtype, backend, cache)}  # fmt: skip
                rows.append(row)
                print(f"{backend:5s} {state:4s} {m}x{n} {dtype}: process's first call "
                      f"{row['process_first_s']:.3f} s, shape's first {row['first_s']:.3f} s, "
                      f"steady {row['steady_s'] * 1e3:.3f} ms, extra memory first "
                      f"{row['first_extra_bytes'] / 2**20:.1f} MiB / steady "
                      f"{row['steady_extra_bytes'] / 2**20:.1f} MiB", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"provenance": provenance.collect(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
