"""Probe: the looped forward at N >= 131072 with y stored streaming, so that y stops evicting x
from L2 between x's two reads.

At N >= 131072 the product's forward is rmsnorm_fwd_looped_kernel: each program walks its rows,
each row twice in BLOCK_N chunks (sum of squares, then y, the second pass backwards). It runs at
61-67% of the copy (run 4, dde60f4a7d8f), the 2·M·N model's rate when every second read of x
comes from HBM (2/3 of the copy). The L2 lead (perf log, "Lead refuted: the wide forward is not
held back by L2") swept the grid and found no L2 reuse even at one program per SM, where the
rows in flight (132 x 256 KB = 33 MiB at N = 131072) fit the 60 MiB L2. Not counted there: the
y the same programs write in the meantime, as many bytes again, stored with normal priority.
Load hints alone (evict_last on the first read, evict_first on the second) hurt at wide rows
(perf log, v7).

Variants (copies of the looped kernel at dde60f4a7d8f, no residual), each at its best
configuration over PROGRAMS_PER_SM {1, 2, 4}, BLOCK_N {8192, 16384}, warps {8, 16}, stages
{3, 4}, device-only (the tuner's timer, best of two interleaved passes):
- "none": the product's kernel as it is;
- "y .cs": y stored with the streaming cache modifier (evict-first in L2);
- "y .cs, x hints": and x loaded evict_last in the first pass, evict_first in the second.
"+ consumer": each variant's best configuration followed by a kernel that reads y back (a
looped per-row sum), both in one graph per rotating set: whether the consumer pays for what the
forward gains (at these sizes y is 2-4x the L2, so a next op finds at most its tail in L2 anyway).
y and rstd are checked bit for bit against "none" (hints change no arithmetic).

Prediction: if y was what evicted x, "y .cs" at one program per SM approaches the single pass's
rate, 80-88% of the copy at 512x131072 and 256x262144 (today 66.5% and 61.5%); the consumer
loses at most the share of y a normal store would have left in L2. If not: within noise.

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/looped_forward_store_hint_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(512, 131072), (256, 262144), (1024, 131072)]
#: name -> (first read's eviction policy, second read's, y's store cache modifier)
VARIANTS = {
    "none": ("", "", ""),
    "y .cs": ("", "", ".cs"),
    "y .cs, x hints": ("evict_last", "evict_first", ".cs"),
}


@triton.jit
def looped_fwd_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, N, eps, offset,
    BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, FIRST_POLICY: tl.constexpr,
    SECOND_POLICY: tl.constexpr, Y_MODIFIER: tl.constexpr,
):  # fmt: skip
    """rmsnorm_fwd_looped_kernel at dde60f4a7d8f without the residual, with the hints."""
    chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):
        x_row = X + row * stride_x_row
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=LOOP_STAGES):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy=FIRST_POLICY)
            x = x.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps)
        for i in tl.range(0, chunks, num_stages=LOOP_STAGES):
            cols = (chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=SECOND_POLICY)
            x = x.to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
            y = (x * rstd * w).to(Y.dtype.element_ty)
            tl.store(Y + row * stride_y_row + cols, y, mask=mask, cache_modifier=Y_MODIFIER)
        tl.store(RSTD + row, rstd)


@triton.jit
def consumer_kernel(Y, S, N, BLOCK_N: tl.constexpr):
    """One program per row: the row's sum in fp32, in chunks (reads y once, as a next op)."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        acc += tl.load(Y + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(S + row, tl.sum(acc, axis=0))


def _configs(m):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in (1, 2, 4):
        for block_n in (8192, 16384):
            for warps in (8, 16):
                for stages in (3, 4):
                    if (stages - 1) * block_n * 2 > launch.PIPELINE_SHARED_BYTES:
                        continue
                    key = (per_sm, block_n, warps, stages)
                    meta = {"BLOCK_N": block_n, "LOOP_STAGES": stages, "num_warps": warps,
                            "num_stages": stages}  # fmt: skip
                    yield key, (min(m, per_sm * sms),), meta


def _kernel_args(a, n):
    x, w, y, rstd, _sums = a
    return (x, w, y, rstd, x.stride(0), y.stride(0), x.shape[0], n, 1e-6, 0.0)


def _forward_run(grid, meta, n):
    def run(a):
        looped_fwd_kernel[grid](*_kernel_args(a, n), **meta)

    return run


def _consumer_run(m, n):
    def run(a):
        consumer_kernel[(m,)](a[2], a[4], n, BLOCK_N=8192, num_warps=8)

    return run


def _with_consumer(forward, m, n):
    consumer = _consumer_run(m, n)

    def run(a):
        forward(a)
        consumer(a)

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s of 2MN at each variant's best configuration (key: programs/SM, BLOCK_N, warps,"
          " stages); then µs of forward + consumer", flush=True)  # fmt: skip
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y, rstd, sums = (
            torch.empty_like(x),
            torch.empty(m, device="cuda"),
            torch.empty(m, device="cuda"),
        )
        args = (x, w, y, rstd, sums)
        launches = {}
        for name, (first, second, modifier) in VARIANTS.items():
            for key, grid, meta in _configs(m):
                hints = {"FIRST_POLICY": first, "SECOND_POLICY": second, "Y_MODIFIER": modifier}
                launches[(name, key)] = (grid, {**meta, **hints})
        launch._compile_in_parallel(
            looped_fwd_kernel, _kernel_args(args, n), list(launches.values())
        )
        runs = {name: _forward_run(grid, meta, n) for name, (grid, meta) in launches.items()}
        outputs = {}
        for (name, _key), run in runs.items():  # the outputs of each variant
            y.fill_(float("nan"))
            run(args)
            torch.cuda.synchronize()
            if name not in outputs:
                outputs[name] = (y.clone(), rstd.clone())
        same = {name: all(torch.equal(a, b) for a, b in zip(out, outputs["none"], strict=True))
                for name, out in outputs.items()}  # fmt: skip
        arg_sets = tuning.rotating_arguments(args, l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        best = {}
        for (name, key), us in times.items():
            if name not in best or us < best[name][0]:
                best[name] = (us, key)
        paired = {name: _with_consumer(runs[(name, key)], m, n) for name, (_, key) in best.items()}
        paired["consumer alone"] = _consumer_run(m, n)
        with_consumer = time_runs(paired, arg_sets, stream)
        gb = 2 * m * n * 2 / 1e3
        cells = "  ".join(f"{name}: {gb / us:5.0f} {key}" for name, (us, key) in best.items())
        pairs = "  ".join(f"{name}: {us:7.1f}" for name, us in with_consumer.items())
        print(f"{m:5d}x{n:7d}  {cells}  | + consumer µs: {pairs}  | bitwise: {same}", flush=True)
        result["rows"].append({
            "m": m, "n": n, "best": {k: {"us": us, "key": key} for k, (us, key) in best.items()},
            "with_consumer_us": with_consumer, "bitwise_vs_none": same,
            "times_us": {f"{k[0]} {k[1]}": v for k, v in times.items()},
        })  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
