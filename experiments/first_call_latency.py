"""Probe: what a user waits for at the first call of each new shape class. On a GPU the first
call of an (N, M size class, dtypes) compiles and times every candidate configuration
(tuning.py), and for 16384 < N <= 65536 the forward also measures both paths; v9 and v10 grew
the forward's candidates (up to ~98 for the single tile, ~75 for the looped kernel). This
times, per shape, the first forward + backward call (tuning included, Triton's on-disk compile
cache cleared first, so compiles count as on a fresh machine) and a second call of another M in
the same size class (no tuning), in one process, bf16.

Run from the repository root on a GPU (shapes as MxN after the output path replace SHAPES):
    PYTHONPATH=. python experiments/first_call_latency.py out.json [512x2048 ...]
"""

import json
import os
import shutil
import sys
import tempfile
import time

# a fresh Triton cache, before triton is imported: compile time is part of the first call
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-first-call-")

import torch  # noqa: E402

from impls.triton_rmsnorm import rmsnorm  # noqa: E402

SHAPES = [(4096, 2048), (4096, 8192), (65536, 512), (2048, 32768), (512, 131072)]


def seconds(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def forward_backward(m: int, n: int):
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    return lambda: rmsnorm(x, w).backward(dy)


def main(out_path: str, shapes: list) -> None:
    rows = []
    for m, n in shapes:
        first = seconds(forward_backward(m, n))
        # same N, another M of the same size class (M's bit length): tuned already
        again = seconds(forward_backward(m + m // 4, n))
        rows.append({"m": m, "n": n, "first_s": first, "same_class_s": again})
        print(f"{m:6d}x{n:6d} first call {first:6.2f} s, same size class {again * 1e3:7.2f} ms",
              flush=True)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)
    shutil.rmtree(os.environ["TRITON_CACHE_DIR"], ignore_errors=True)


if __name__ == "__main__":
    given = [tuple(int(v) for v in a.split("x")) for a in sys.argv[2:]]
    main(sys.argv[1], given or SHAPES)
