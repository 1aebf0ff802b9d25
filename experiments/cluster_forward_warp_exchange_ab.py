"""Probe: the cluster forward with each warp's partial sent to every peer, no CTA-wide reduction
before the exchange (QuACK's row_reduce does this), beside MODE 0 and the product.

In `cluster_forward_ab.py` (MODE 0) each CTA reduces its 16384 columns to one partial with
gl.sum over the CTA (shuffles, then shared memory and a barrier across its warps) before the
st.async exchange: 1.064x the product at 64x131072 bf16, 0.94-0.97x at 256-1024 rows. Fewer
registers made it slower (`-cluster-forward-registers-ab.txt`). Here a [CLUSTER, WARPS, COLS /
WARPS] view of the row: each warp owns a contiguous chunk of its CTA's columns and reduces it
with shuffles alone; its lanes below CLUSTER send the warp's partial to slot rank * WARPS + warp
of every peer (st.async completing the peer's mbarrier, which expects CLUSTER * WARPS words);
every thread then sums the CLUSTER * WARPS slots in one order, so the cluster agrees on rstd bit
for bit. Checked at 1, 7 and 64 rows against the fp32 oracle (y within 1 ulp, rstd within 1e-6
relative), then timed as `cluster_forward_registers_ab.py` times (its MODE 0 kernel beside it).

Prediction: 1.02-1.04x MODE 0 at 256-1024 x 131072 (no barrier across the CTA's warps between the
loads and the exchange), still short of QuACK's pace.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/cluster_forward_warp_exchange_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_registers_ab import EPS, _forward, _start_asm
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from impls.triton_rmsnorm import launch, tuning

CLUSTER_SIZE = 8
WARPS = 8


def _warp_exchange_asm(cluster: int, warps: int) -> str:
    """$1: this warp's partial; into slot rank * warps + warp of every peer; then the
    cluster * warps slots summed in order, pairwise."""
    slots = cluster * warps
    loads, adds = [], []
    for i in range(slots // 4):
        loads.append(
            f"ld.shared.v4.f32 {{s{4 * i}, s{4 * i + 1}, s{4 * i + 2}, s{4 * i + 3}}}, "
            f"[rmsn_cl_slots+{16 * i}];"
        )
    live = [f"s{i}" for i in range(slots)]
    while len(live) > 2:
        nxt = []
        for a, b in zip(live[0::2], live[1::2], strict=True):
            adds.append(f"add.f32 {a}, {a}, {b};")
            nxt.append(a)
        live = nxt
    regs = ", ".join(f"s{i}" for i in range(slots))
    return f"""
{{
.reg .b32 rk, tid, lane, warp, slot, a, ra, mb, rmb;
.reg .pred p0, p1, done;
.reg .f32 {regs};
mov.u32 rk, %cluster_ctarank;
mov.u32 tid, %tid.x;
and.b32 lane, tid, 31;
shr.u32 warp, tid, 5;
setp.eq.u32 p0, tid, 0;
barrier.cluster.wait.aligned;
@p0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [rmsn_cl_mbar], {4 * slots};
mad.lo.u32 slot, rk, {warps}, warp;
mov.u32 a, rmsn_cl_slots;
shl.b32 slot, slot, 2;
add.u32 a, a, slot;
mov.u32 mb, rmsn_cl_mbar;
setp.lt.u32 p1, lane, {cluster};
@p1 mapa.shared::cluster.u32 ra, a, lane;
@p1 mapa.shared::cluster.u32 rmb, mb, lane;
@p1 st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [ra], $1, [rmb];
WAIT:
mbarrier.try_wait.parity.shared::cta.b64 done, [rmsn_cl_mbar], 0;
@!done bra WAIT;
{chr(10).join(loads)}
{chr(10).join(adds)}
add.f32 $0, {live[0]}, {live[1]};
}}
"""


_START = gl.constexpr(_start_asm(CLUSTER_SIZE * WARPS))  # declares the slots (and the mbarrier)
_EXCHANGE = gl.constexpr(_warp_exchange_asm(CLUSTER_SIZE, WARPS))


@gluon.jit
def rmsnorm_cluster_warp_fwd_kernel(X, W, Y, RSTD, eps, N: gl.constexpr):
    CLUSTER: gl.constexpr = 8
    NW: gl.constexpr = gl.num_warps()
    CHUNK: gl.constexpr = N // CLUSTER // NW  # a warp's contiguous columns
    layout: gl.constexpr = gl.BlockedLayout(
        [1, 1, 8], [1, 1, 32], [1, NW, 1], [2, 1, 0], [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    )
    row = gl.program_id(0)
    r = gl.arange(0, CLUSTER, gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    wi = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    c = gl.arange(0, CHUNK, gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    r = gl.inline_asm_elementwise(_START, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    rw = gl.expand_dims(r, 1) * (N // CLUSTER) + gl.expand_dims(wi, 0) * CHUNK  # [CLUSTER, NW]
    offs = gl.expand_dims(rw, 2) + gl.expand_dims(gl.expand_dims(c, 0), 1)
    xf = gl.load(X + row.to(gl.int64) * N + offs).to(gl.float32)
    w = gl.load(W + offs).to(gl.float32)
    part = gl.sum(xf * xf, axis=2)  # [CLUSTER, NW]: one partial a warp, shuffles only
    total = gl.inline_asm_elementwise(
        _EXCHANGE, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
    )
    rstd = gl.rsqrt(total / N + eps)
    y = xf * gl.expand_dims(rstd, 2) * w
    gl.store(Y + row.to(gl.int64) * N + offs, y.to(Y.dtype.element_ty))
    r2 = gl.arange(0, CLUSTER, gl.SliceLayout(1, rstd.type.layout))
    w2 = gl.arange(0, NW, gl.SliceLayout(0, rstd.type.layout))
    first = (gl.expand_dims(r2, 1) == 0) & (gl.expand_dims(w2, 0) == 0)
    at = gl.expand_dims(r2, 1) * 0 + gl.expand_dims(w2, 0) * 0
    gl.store(RSTD + row + at, rstd, mask=first)


def _warp_forward(x, w):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    rmsnorm_cluster_warp_fwd_kernel[(m,)](
        x, w, y, rstd, EPS, N=n, num_warps=WARPS, num_ctas=CLUSTER_SIZE
    )
    return y, rstd


def _check(m: int, n: int) -> dict:
    torch.manual_seed(m)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, rstd = _warp_forward(x, w)
    torch.cuda.synchronize()
    x64 = x.double()
    ref_rstd = torch.rsqrt(x64.pow(2).mean(-1) + EPS)
    ref_y = (x64 * ref_rstd[:, None] * w.double()).float().to(torch.bfloat16)
    ulp = (ref_y.float().abs().clamp_min(1e-30).log2().floor() - 7).exp2()
    off = ((y.float() - ref_y.float()).abs() > ulp).sum().item()
    rel = ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item()
    return {"m": m, "n": n, "y_off_by_more_than_1ulp": off, "rstd_max_rel": rel}


def main(out_path: str) -> None:
    checks = [_check(m, 131072) for m in (1, 7, 64)]
    good = all(c["y_off_by_more_than_1ulp"] == 0 and c["rstd_max_rel"] < 1e-6 for c in checks)
    print(f"warp exchange: checks {'pass' if good else 'FAIL'} {checks}", flush=True)
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
            "MODE 0 (CTA partial)": lambda a: _forward(a[0], a[1], 8, False, False, 8),
        }
        if good:
            runs["warp partials"] = lambda a: _warp_forward(a[0], a[1])
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product)", flush=True)
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  {name}", flush=True)
        result["rows"].append({"m": m, "n": n, "us": us})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
