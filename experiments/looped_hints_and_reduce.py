"""Probe (perf log, v7): the forward's single tile against the persistent looped kernel with and
without torch.compile's L2 eviction hints (evict_last on the first read of x, evict_first on the
second), each tuned by the product's tuner; and the backward with the dw reduction as a loop of
64-row steps (the old constants) against one step over every partial row.

Caveat: the "single" calls return None, so each call's y is freed and the next call writes into
the same, L2-warm buffer; that column reads high. The looped columns return y.

Run from the repository root on a GPU, replays off (the reduction's constants are swapped
between calls of one signature):
    RMSNORM_TRITON_REPLAY=0 PYTHONPATH=. python experiments/looped_hints_and_reduce.py out.json

The run cited in the perf log used this code in one flat loop; it was split into functions
afterwards for the linter, with the same kernels, configs and timing.
"""

import json
import sys

import torch
import triton
import triton.language as tl

from harness import timing
from impls.triton_rmsnorm import backward_launch, kernel_launch, kernels, launch, tuning


@triton.jit
def looped_hint(
    X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row, M, N, eps,
    offset, ROWS_BUCKET, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """kernels.rmsnorm_fwd_looped_kernel without a residual, plus eviction hints. LOOP_STAGES,
    taken since v8 so that the tuning space's configs launch it, is held at 1 for both kernels
    (time_looped): the run at 082245d214f2 predates v8."""
    chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):
        x_row = X + row * stride_x_row
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
            x = x.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / N + eps)
        for i in range(0, chunks):
            cols = (chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            y = x.to(tl.float32) * rstd * (w.to(tl.float32) + offset)
            tl.store(Y + row * stride_y_row + cols, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + row, rstd)


FORWARD_SHAPES = [(512, 4096), (4096, 4096), (512, 8192), (1024, 8192), (2048, 8192),
                  (4096, 8192), (16384, 8192), (1024, 16384), (4096, 16384), (2048, 32768),
                  (1024, 65536), (256, 262144)]  # fmt: skip
BACKWARD_SHAPES = [(512, 2048), (4096, 4096), (4096, 8192), (262144, 128), (65536, 512),
                   (32768, 1024)]  # fmt: skip
#: (label, DW_REDUCE_MAX_ROWS, DW_REDUCE_BLOCK_N, DW_REDUCE_WARPS): before and after v7.
REDUCTIONS = [("reduce64x64", 64, 64, 4), ("reduce_onepass", 256, 32, 8)]


def device_us(calls, stream) -> float:
    timing.warm_up(calls, stream)
    return timing.time_device(calls, stream).ms * 1e3


def single_tile_call(x, w):
    m, n = x.shape

    def call():  # returns None: see the caveat above
        rstd = torch.empty(m, device="cuda")
        launch._forward_single_tile(
            x, w, torch.empty_like(x), rstd, x, x, (n, n, n, n), 1e-6, 0.0, False
        )

    return call


def looped_args(x, w):
    m, n = x.shape
    y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
    return (x, w, y, rstd, x, x, n, n, n, n, m, n, 1e-6, 0.0, m.bit_length())


def time_looped(kernel, inputs, sms, stream):
    """The kernel tuned by the product's tuner over the looped forward's space, then timed."""
    m = inputs[0][0].shape[0]

    def grid(meta):
        return (min(m, meta["PROGRAMS_PER_SM"] * sms),)

    def run(config, args):
        kernel[grid](*args, BLOCK_N=launch.WIDE_BLOCK_N, HAS_RESIDUAL=False, **config)

    args = looped_args(*inputs[0])
    space = launch._candidates(
        "rmsnorm_fwd_looped_kernel", args, {"BLOCK_N": launch.WIDE_BLOCK_N, "HAS_RESIDUAL": False}
    )
    space = [c for c in space if c["LOOP_STAGES"] == 1]  # as at 082245d214f2, before v8
    best = tuning.fastest(space, run, args)

    def call_of(x, w):
        def call():
            args = looped_args(x, w)
            run(best, args)
            return args[2]

        return call

    return device_us([call_of(x, w) for x, w in inputs], stream), best


def forward(m, n, sms, stream) -> dict:
    sets = timing.rotating_sets(2 * m * n * 2)
    inputs = [
        (torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
         torch.randn(n, device="cuda", dtype=torch.bfloat16))
        for _ in range(sets)
    ]  # fmt: skip
    res = {}
    if n <= launch.SINGLE_TILE_MAX_N:
        kernel_launch._TUNED.clear()
        res["single"] = device_us([single_tile_call(x, w) for x, w in inputs], stream)
        res["single_cfg"] = launch.take_launch_configs()
    for name, kernel in (("looped", kernels.rmsnorm_fwd_looped_kernel), ("hint", looped_hint)):
        res[name], res[name + "_cfg"] = time_looped(kernel, inputs, sms, stream)
    return res


def backward_call(x, w, dy, rstd):
    return lambda: launch.rmsnorm_backward(dy, x, w, rstd)[0]


def backward(m, n, stream) -> dict:
    inputs = []
    for _ in range(timing.rotating_sets(3 * m * n * 2)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        inputs.append((x, w, torch.randn_like(x), torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)))
    res = {}
    for label, rows, block_n, warps in REDUCTIONS:
        backward_launch.DW_REDUCE_MAX_ROWS, backward_launch.DW_REDUCE_BLOCK_N, backward_launch.DW_REDUCE_WARPS = (
            rows, block_n, warps
        )  # fmt: skip
        res[label] = device_us([backward_call(*args) for args in inputs], stream)
    return res


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    for m, n in FORWARD_SHAPES:
        res = forward(m, n, sms, stream)
        kb = 2 * m * n * 2 / 1e3
        out.append({"m": m, "n": n, **res})
        rates = " ".join(f"{k} {kb / v:5.0f}" for k, v in res.items() if not k.endswith("cfg"))
        print(f"fwd {m:6d}x{n:7d} {rates}  {res.get('single_cfg')} {res['looped_cfg']} "
              f"{res['hint_cfg']}", flush=True)  # fmt: skip
    for m, n in BACKWARD_SHAPES:
        res = backward(m, n, stream)
        kb = 3 * m * n * 2 / 1e3
        out.append({"m": m, "n": n, "bwd": res})
        rates = " ".join(f"{k} {kb / v:5.0f} ({v:.1f} us)" for k, v in res.items())
        print(f"bwd {m:6d}x{n:7d} {rates}", flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, default=str, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
