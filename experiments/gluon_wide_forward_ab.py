"""Probe: a 131072-wide bf16 row held on one SM, part in registers and part in shared memory
(Gluon), so that x crosses HBM once.

At N = 131072 the product's forward reads each row twice (the looped kernel, 66.5% of the copy
at 512x131072, 0.73 of QuACK). A single tile cannot hold the row: 256 KB is the whole register
file, and the held tile spills (0.78-0.82 of the looped kernel, perf log). Triton's language has
no explicit shared memory; Gluon (triton.experimental.gluon, Triton 3.6) has. Here one program
per row:
1. starts cp.async copies of the row's last SMEM_CHUNKS x CHUNK elements into shared memory;
2. loads the first REG elements into registers, as bf16;
3. sums the squares of both parts in fp32 (the registers' part, then each shared chunk);
4. writes y: the registers' part (upcast again through inline PTX, as v14/v15 do, so the fp32
   copy is not kept live), then each shared chunk.
Each thread reads back from shared memory only the elements its own copies wrote (the same
layout for the copy's pointers and the load), so a wait on its own copy group is enough; a CTA
barrier follows anyway. No masks: N must equal REG + SMEM_CHUNKS x CHUNK (131072 here).

Timed against the product's forward (its measured path: the looped kernel), device-only (the
tuner's timer, best of two interleaved passes), bf16; configurations: registers 32768 +
shared 3 x 32768 (192 KB) or registers 65536 + shared 2 x 32768 (128 KB), 16 or 32 warps.
y and rstd are compared with the product's (the sum of squares is ordered differently, so rstd
may differ in its last bits and y by an ulp; counted, with the largest absolute y difference).

Prediction: one row per SM at a time with nothing spilled, as v15's held tile at 65536 (87.6%):
80-88% of the copy, 1.2-1.3x the looped kernel. If cp.async into shared memory and the smem
reads cost more than the second HBM read saves: below 66%.

Run from the repository root on an sm_90 GPU (Triton 3.6):
    PYTHONPATH=. python experiments/gluon_wide_forward_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls.triton_rmsnorm import launch, tuning

SHAPES = [(512, 131072), (1024, 131072), (256, 131072)]
#: (REG, SMEM_CHUNKS, CHUNK, warps)
CONFIGS = [(32768, 3, 32768, 32), (32768, 3, 32768, 16), (65536, 2, 32768, 32),
           (65536, 2, 32768, 16)]  # fmt: skip
#: the persistent kernel's: the same split, and finer shared chunks (the next row's copies
#: start sooner)
RING_CONFIGS = [(32768, 3, 32768, 32), (32768, 3, 32768, 16), (32768, 6, 16384, 32),
                (32768, 12, 8192, 32), (16384, 7, 16384, 32)]  # fmt: skip
#: Programs an SM of the persistent kernel, per ring configuration (default 1).
RING_PER_SM = {}
#: Twentieth session (`... out.json 65536`): at N = 65536 the product's forward is the single
#: tile, one program a row holding it in registers (one an SM at 32 warps), 0.92-0.98 of QuACK
#: at 512-1024 rows. The persistent ring keeps a program's next row loading while this one's y
#: is written, which the single tile cannot (its registers hold one row).
if len(sys.argv) > 2 and sys.argv[2] == "65536":
    SHAPES = [(512, 65536), (1024, 65536), (2048, 65536)]
    CONFIGS = [(32768, 1, 32768, 32), (32768, 1, 32768, 16)]
    RING_CONFIGS = [(32768, 1, 32768, 32), (32768, 2, 16384, 32), (32768, 4, 8192, 32),
                    (16384, 3, 16384, 32), (32768, 1, 32768, 16), (32768, 2, 16384, 16),
                    (16384, 3, 16384, 16)]  # fmt: skip
    RING_PER_SM = {(32768, 1, 32768, 16): 2, (32768, 2, 16384, 16): 2, (16384, 3, 16384, 16): 2}


@gluon.jit
def _upcast_bf16(v):
    """bf16 -> fp32 in inline PTX, which the compiler cannot merge with an earlier conversion."""
    return gl.inline_asm_elementwise(
        "shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [v],
        dtype=gl.float32, is_pure=False, pack=2,
    )  # fmt: skip


@gluon.jit
def held_row_fwd_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, eps,
    N: gl.constexpr, REG: gl.constexpr, SMEM_CHUNKS: gl.constexpr, CHUNK: gl.constexpr,
    WARPS: gl.constexpr,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(REG + SMEM_CHUNKS * CHUNK == N)
    row = gl.program_id(0).to(gl.int64)
    x_row = X + row * stride_x_row
    y_row = Y + row * stride_y_row
    chunk_offs = gl.arange(0, CHUNK, layout=layout)
    held = gl.allocate_shared_memory(gl.bfloat16, [SMEM_CHUNKS, CHUNK], smem_layout)
    for c in gl.static_range(SMEM_CHUNKS):
        async_copy.async_copy_global_to_shared(held.index(c), x_row + REG + c * CHUNK + chunk_offs)
    async_copy.commit_group()
    reg_offs = gl.arange(0, REG, layout=layout)
    x_reg = gl.load(x_row + reg_offs)
    x32 = x_reg.to(gl.float32)
    acc = gl.sum(x32 * x32, axis=0)
    async_copy.wait_group(0)
    gl.thread_barrier()
    for c in gl.static_range(SMEM_CHUNKS):
        xs = held.index(c).load(layout).to(gl.float32)
        acc += gl.sum(xs * xs, axis=0)
    rstd = 1.0 / gl.sqrt_rn(acc / N + eps)
    w = gl.load(W + reg_offs).to(gl.float32)
    gl.store(y_row + reg_offs, (_upcast_bf16(x_reg) * rstd * w).to(gl.bfloat16))
    for c in gl.static_range(SMEM_CHUNKS):
        xs = held.index(c).load(layout).to(gl.float32)
        w = gl.load(W + REG + c * CHUNK + chunk_offs).to(gl.float32)
        gl.store(y_row + REG + c * CHUNK + chunk_offs, (xs * rstd * w).to(gl.bfloat16))
    gl.store(RSTD + row, rstd)


@gluon.jit
def held_row_ring_fwd_kernel(
    X, W, Y, RSTD, stride_x_row, stride_y_row, M, eps,
    N: gl.constexpr, REG: gl.constexpr, SMEM_CHUNKS: gl.constexpr, CHUNK: gl.constexpr,
    WARPS: gl.constexpr,
):  # fmt: skip
    """held_row_fwd_kernel made persistent: while a program writes a row's y it already loads
    its next row, the register part as soon as that part's y is out, each shared chunk as soon
    as its y is out (one cp.async group a chunk, waited for in order)."""
    layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    gl.static_assert(REG + SMEM_CHUNKS * CHUNK == N)
    chunk_offs = gl.arange(0, CHUNK, layout=layout)
    reg_offs = gl.arange(0, REG, layout=layout)
    held = gl.allocate_shared_memory(gl.bfloat16, [SMEM_CHUNKS, CHUNK], smem_layout)
    first = gl.program_id(0).to(gl.int64)
    programs = gl.num_programs(0)
    for c in gl.static_range(SMEM_CHUNKS):
        async_copy.async_copy_global_to_shared(
            held.index(c), X + first * stride_x_row + REG + c * CHUNK + chunk_offs,
            mask=(chunk_offs < CHUNK) & (first < M),
        )  # fmt: skip
        async_copy.commit_group()
    x_reg = gl.load(X + first * stride_x_row + reg_offs, mask=(reg_offs < REG) & (first < M))
    for row in range(first, M, programs):
        x32 = x_reg.to(gl.float32)
        acc = gl.sum(x32 * x32, axis=0)
        for c in gl.static_range(SMEM_CHUNKS):
            async_copy.wait_group(SMEM_CHUNKS - 1 - c)
            xs = held.index(c).load(layout).to(gl.float32)
            acc += gl.sum(xs * xs, axis=0)
        rstd = 1.0 / gl.sqrt_rn(acc / N + eps)
        y_row = Y + row * stride_y_row
        w = gl.load(W + reg_offs).to(gl.float32)
        gl.store(y_row + reg_offs, (_upcast_bf16(x_reg) * rstd * w).to(gl.bfloat16))
        following = row + programs
        x_next = X + following * stride_x_row
        x_reg = gl.load(x_next + reg_offs, mask=(reg_offs < REG) & (following < M))
        for c in gl.static_range(SMEM_CHUNKS):
            xs = held.index(c).load(layout).to(gl.float32)
            w = gl.load(W + REG + c * CHUNK + chunk_offs).to(gl.float32)
            gl.store(y_row + REG + c * CHUNK + chunk_offs, (xs * rstd * w).to(gl.bfloat16))
            async_copy.async_copy_global_to_shared(
                held.index(c), x_next + REG + c * CHUNK + chunk_offs,
                mask=(chunk_offs < CHUNK) & (following < M),
            )  # fmt: skip
            async_copy.commit_group()
        gl.store(RSTD + row, rstd)


def _ring_run(m, n, config, programs):
    reg, smem_chunks, chunk, warps = config

    def run(a):
        x, w, y, rstd = a
        held_row_ring_fwd_kernel[(programs,)](
            x, w, y, rstd, x.stride(0), y.stride(0), m, 1e-6, N=n, REG=reg,
            SMEM_CHUNKS=smem_chunks, CHUNK=chunk, WARPS=warps, num_warps=warps,
        )  # fmt: skip

    return run


def _held_run(m, n, config):
    reg, smem_chunks, chunk, warps = config

    def run(a):
        x, w, y, rstd = a
        held_row_fwd_kernel[(m,)](
            x, w, y, rstd, x.stride(0), y.stride(0), 1e-6, N=n, REG=reg,
            SMEM_CHUNKS=smem_chunks, CHUNK=chunk, WARPS=warps, num_warps=warps,
        )  # fmt: skip

    return run


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    print("GB/s (2MN); y and rstd against the product's", flush=True)
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)  # path measured, tuned
        launched = launch.take_launch_configs()
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6)}
        checks = {}
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        variants = {"held row {}+{}x{}, {} warps".format(*c): _held_run(m, n, c) for c in CONFIGS}
        for c in RING_CONFIGS:
            name = "ring {}+{}x{}, {} warps".format(*c)
            per_sm = RING_PER_SM.get(c, 1)
            if per_sm > 1:
                name += f", {per_sm} an SM"
            variants[name] = _ring_run(m, n, c, min(m, per_sm * sms))
        for name, run in variants.items():
            try:
                y.fill_(float("nan"))
                run((x, w, y, rstd))
                torch.cuda.synchronize()
                checks[name] = {
                    "y_differing": int((y != y_ref).sum()),
                    "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "rstd_max_rel": float(((rstd - rstd_ref).abs() / rstd_ref).max()),
                }
                runs[name] = run
            except Exception as error:  # a configuration that fails is reported, not timed
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {name: 2 * m * n * 2 / (us * 1e3) for name, us in times.items()}
        cells = "  ".join(f"{name}: {gbps[name]:5.0f}" for name in times)
        print(f"{m:5d}x{n:6d}  {cells}  {sorted(launched)}  {checks}", flush=True)
        result["rows"].append({"m": m, "n": n, "us": times, "gbps": gbps,
                               "product_launched": launched, "checks": checks})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
