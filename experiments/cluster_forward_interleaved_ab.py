"""Probe: the staged cluster forward with QuACK's copy layout (each instruction covering 4 KB of
the CTA's slice), beside the staged kernel, the product and QuACK, in one process.

The staged cluster forward (`cluster_forward_staged_ab.py`) gives each warp a contiguous 4 KB
chunk of its CTA's 32 KB: a thread's eight 16-byte vectors are 512 bytes apart, one warp's chunk
at a time. QuACK's forward (its SASS, `2026-11-30-aca54a9df4b3-quack-vs-cluster-staged-sass.txt`)
puts a thread's vectors 4 KB apart, so that each cp.async, load and store instruction of the CTA
covers 4 KB contiguously; otherwise the two kernels are alike, and QuACK ran 1.05-1.10x ours at
256-1024 x 131072 bf16 (`-cluster-forward-vs-quack.txt`). Here a [CLUSTER, REPS, WARPS, 256] view
of the row: repetition k of a CTA covers its columns k * WARPS * 256 ... + WARPS * 256, warp j
the 256 at j * 256 within it. Each warp's partial (over its REPS x 256 columns, shuffles and
registers only) goes to every peer as in the staged kernel, so rstd is summed in a different
order than there: checked against the fp32 oracle (y within 1 ulp, rstd within 1e-6) at 1, 7
and 64 rows. Timed as `cluster_forward_vs_quack.py` times.

Prediction: 1.02-1.05x the staged kernel at 256-1024 rows (the layout being what is left of the
gap), within 2% of QuACK.

Run from the repository root on an sm_90 GPU with QuACK installed:
    PYTHONPATH=.:experiments python experiments/cluster_forward_interleaved_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_registers_ab import EPS
from cluster_forward_staged_ab import _staged_forward
from cluster_forward_warp_exchange_ab import _EXCHANGE, _START, CLUSTER_SIZE, WARPS
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from impls import get_backend
from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _async_load


@gluon.jit
def rmsnorm_cluster_interleaved_fwd_kernel(X, W, Y, RSTD, eps, N: gl.constexpr):
    CLUSTER: gl.constexpr = 8
    NW: gl.constexpr = gl.num_warps()
    SPAN: gl.constexpr = NW * 256  # columns one instruction of the CTA covers
    REPS: gl.constexpr = N // CLUSTER // SPAN
    layout: gl.constexpr = gl.BlockedLayout(
        [1, 1, 1, 8], [1, 1, 1, 32], [1, 1, NW, 1], [3, 2, 1, 0],
        [[1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
    )  # fmt: skip
    shared: gl.constexpr = gl.SwizzledSharedLayout(
        1, 1, 1, [3, 2, 1, 0], [[1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    )
    row = gl.program_id(0)
    l3: gl.constexpr = gl.SliceLayout(3, layout)  # [CLUSTER, REPS, NW]
    l2: gl.constexpr = gl.SliceLayout(1, l3)  # [CLUSTER, NW]
    r = gl.arange(0, CLUSTER, gl.SliceLayout(1, l2))
    wi = gl.arange(0, NW, gl.SliceLayout(0, l2))
    k = gl.arange(0, REPS, gl.SliceLayout(0, gl.SliceLayout(2, l3)))
    c = gl.arange(0, 256, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, layout))))
    r = gl.inline_asm_elementwise(_START, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    rw = gl.expand_dims(r, 1) * (N // CLUSTER) + gl.expand_dims(wi, 0) * 256  # [CLUSTER, NW]
    rkw = gl.expand_dims(rw, 1) + gl.expand_dims(gl.expand_dims(k, 0), 2) * SPAN  # [C, REPS, NW]
    offs = gl.expand_dims(rkw, 3) + gl.expand_dims(gl.expand_dims(gl.expand_dims(c, 0), 1), 2)
    x_smem = gl.allocate_shared_memory(X.dtype.element_ty, [CLUSTER, REPS, NW, 256], shared)
    _async_load(x_smem, X + row.to(gl.int64) * N + offs)
    async_copy.commit_group()
    w_raw = gl.load(W + offs)
    async_copy.wait_group(0)
    xf = x_smem.load(offs.type.layout).to(gl.float32)
    part = gl.sum(gl.sum(xf * xf, axis=3), axis=1)  # [CLUSTER, NW]: a warp's partial
    total = gl.inline_asm_elementwise(
        _EXCHANGE, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
    )
    rstd = gl.rsqrt(total / N + eps)
    xf = x_smem.load(offs.type.layout).to(gl.float32)
    scale = gl.expand_dims(gl.expand_dims(rstd, 1), 3)
    y = xf * scale * w_raw.to(gl.float32)
    gl.store(Y + row.to(gl.int64) * N + offs, y.to(Y.dtype.element_ty))
    r2 = gl.arange(0, CLUSTER, gl.SliceLayout(1, rstd.type.layout))
    w2 = gl.arange(0, NW, gl.SliceLayout(0, rstd.type.layout))
    first = (gl.expand_dims(r2, 1) == 0) & (gl.expand_dims(w2, 0) == 0)
    at = gl.expand_dims(r2, 1) * 0 + gl.expand_dims(w2, 0) * 0
    gl.store(RSTD + row + at, rstd, mask=first)


def _interleaved_forward(x, w):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    rmsnorm_cluster_interleaved_fwd_kernel[(m,)](
        x, w, y, rstd, EPS, N=n, num_warps=WARPS, num_ctas=CLUSTER_SIZE
    )
    return y, rstd


def _check(m: int, n: int) -> dict:
    torch.manual_seed(m)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, rstd = _interleaved_forward(x, w)
    torch.cuda.synchronize()
    x64 = x.double()
    ref_rstd = torch.rsqrt(x64.pow(2).mean(-1) + EPS)
    ref_y = (x64 * ref_rstd[:, None] * w.double()).float().to(torch.bfloat16)
    ulp = (ref_y.float().abs().clamp_min(1e-30).log2().floor() - 7).exp2()
    return {
        "m": m, "n": n,
        "y_off_by_more_than_1ulp": ((y.float() - ref_y.float()).abs() > ulp).sum().item(),
        "rstd_max_rel": ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item(),
    }  # fmt: skip


def main(out_path: str) -> None:
    checks = [_check(m, 131072) for m in (1, 7, 64)]
    good = all(c["y_off_by_more_than_1ulp"] == 0 and c["rstd_max_rel"] < 1e-6 for c in checks)
    print(f"interleaved: checks {'pass' if good else 'FAIL'} {checks}", flush=True)
    quack = get_backend("quack").build()
    result = {"gpu": torch.cuda.get_device_name(), "checks": checks, "rows": []}
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m in (64, 256, 512, 1024):
        n = 131072
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        runs = {
            "product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "staged": lambda a: _staged_forward(a[0], a[1]),
            "quack": lambda a: quack(a[0], a[1], EPS),
        }
        if good:
            runs["interleaved"] = lambda a: _interleaved_forward(a[0], a[1])
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product, x QuACK)", flush=True)
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  "
                  f"{us['quack'] / t:.3f}x  {name}", flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "us": us})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
