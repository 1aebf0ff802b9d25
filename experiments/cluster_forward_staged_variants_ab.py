"""Probe: two of the staged cluster forward's remaining differences from QuACK's SASS, each a
constexpr of one kernel, beside the staged kernel and the product.

QuACK's forward at 131072 columns ran 1.04-1.10x the product and 1.04-1.07x the staged cluster
forward (`2026-11-30-aca54a9df4b3-cluster-forward-interleaved-ab.txt`, one process); their SASS
(`-quack-vs-cluster-staged-sass.txt`) differs in a handful of places. Here two of them:
  CA: x's cp.async through L1 (LDGSTS.E.128, cache_modifier ".ca") where Triton's default
      bypasses it (LDGSTS.E.BYPASS.128);
  W_AFTER_WAIT: w's loads issued after the cp.async wait, as QuACK's SASS orders them.
Outputs compared with the staged kernel's bit for bit (same sums in the same order); timed as
`cluster_forward_staged_ab.py` times (device-only, the tuner's timer, best of two interleaved
passes), without QuACK (its ratio to the staged kernel is in the file above).

Prediction: neither moves the time by more than 2%.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/cluster_forward_staged_variants_ab.py out.json
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

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _async_load


@gluon.jit
def rmsnorm_cluster_staged_variant_kernel(
    X, W, Y, RSTD, eps, N: gl.constexpr, CA: gl.constexpr, W_AFTER_WAIT: gl.constexpr
):
    CLUSTER: gl.constexpr = 8
    NW: gl.constexpr = gl.num_warps()
    CHUNK: gl.constexpr = N // CLUSTER // NW  # a warp's contiguous columns
    layout: gl.constexpr = gl.BlockedLayout(
        [1, 1, 8], [1, 1, 32], [1, NW, 1], [2, 1, 0], [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    )
    shared: gl.constexpr = gl.SwizzledSharedLayout(
        1, 1, 1, [2, 1, 0], [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    )
    row = gl.program_id(0)
    r = gl.arange(0, CLUSTER, gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    wi = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    c = gl.arange(0, CHUNK, gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    r = gl.inline_asm_elementwise(_START, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    rw = gl.expand_dims(r, 1) * (N // CLUSTER) + gl.expand_dims(wi, 0) * CHUNK
    offs = gl.expand_dims(rw, 2) + gl.expand_dims(gl.expand_dims(c, 0), 1)
    x_smem = gl.allocate_shared_memory(X.dtype.element_ty, [CLUSTER, NW, CHUNK], shared)
    if CA:  # cp.async through L1 (.ca), as QuACK's LDGSTS; Triton's default is .cg
        _async_load(x_smem, X + row.to(gl.int64) * N + offs, cache_modifier=".ca")
    else:
        _async_load(x_smem, X + row.to(gl.int64) * N + offs)
    async_copy.commit_group()
    if not W_AFTER_WAIT:
        w_raw = gl.load(W + offs)
    async_copy.wait_group(0)
    if W_AFTER_WAIT:  # as QuACK's SASS orders them
        w_raw = gl.load(W + offs)
    xf = x_smem.load(offs.type.layout).to(gl.float32)
    part = gl.sum(xf * xf, axis=2)  # [CLUSTER, NW]: one partial a warp, shuffles only
    total = gl.inline_asm_elementwise(
        _EXCHANGE, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
    )
    rstd = gl.rsqrt(total / N + eps)
    xf = x_smem.load(offs.type.layout).to(
        gl.float32
    )  # read again (a load after the exchange's asm)
    y = xf * gl.expand_dims(rstd, 2) * w_raw.to(gl.float32)
    gl.store(Y + row.to(gl.int64) * N + offs, y.to(Y.dtype.element_ty))
    r2 = gl.arange(0, CLUSTER, gl.SliceLayout(1, rstd.type.layout))
    w2 = gl.arange(0, NW, gl.SliceLayout(0, rstd.type.layout))
    first = (gl.expand_dims(r2, 1) == 0) & (gl.expand_dims(w2, 0) == 0)
    at = gl.expand_dims(r2, 1) * 0 + gl.expand_dims(w2, 0) * 0
    gl.store(RSTD + row + at, rstd, mask=first)


def _variant_forward(x, w, ca: bool, w_after_wait: bool):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    rmsnorm_cluster_staged_variant_kernel[(m,)](
        x, w, y, rstd, EPS, N=n, CA=ca, W_AFTER_WAIT=w_after_wait,
        num_warps=WARPS, num_ctas=CLUSTER_SIZE,
    )  # fmt: skip
    return y, rstd


VARIANTS = {"CA": (True, False), "W_AFTER_WAIT": (False, True), "both": (True, True)}


def main(out_path: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 131072, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(131072, device="cuda", dtype=torch.bfloat16)
    ref = _staged_forward(x, w)
    differ = {}
    for name, flags in VARIANTS.items():
        y, rstd = _variant_forward(x, w, *flags)
        differ[name] = int((y != ref[0]).sum()) + int((rstd != ref[1]).sum())
    print(f"elements that differ from the staged kernel's: {differ}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "differ": differ, "rows": []}
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
        }
        for name, flags in VARIANTS.items():
            runs[name] = lambda a, f=flags: _variant_forward(a[0], a[1], *f)
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product, x the staged kernel)", flush=True)
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  "
                  f"{us['staged'] / t:.3f}x  {name}", flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "us": us})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
