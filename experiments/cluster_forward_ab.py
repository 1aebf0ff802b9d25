"""Probe: a Gluon forward where a CLUSTER of 8 CTAs holds each row (QuACK's scheme), beside the
product's grouped forward, at 131072 and 262144 columns.

QuACK keeps a row of 131072 columns across a cluster of 8 CTAs (16384 columns each) and exchanges
the CTAs' sums through distributed shared memory; in a fresh process the harness timed it at the
copy's floor at 1024x131072 bf16 (134.1 µs), ours at 140.9 (`2026-11-30-aca54a9df4b3-harness-vs-
tuner-timing.txt`). Gluon in Triton 3.6 has no cluster API and does not lower a reduction across
a cluster's CTAs, but it launches clusters (num_ctas=8: grid = M clusters of 8 CTAs, program_id =
the cluster's id), and layouts can split a [8, N/8] view of the row over the CTAs. The cross-CTA
step is inline PTX, in three modes (the kernel was written and compile-checked offline on Triton
3.6 by a helper, whose findings and sources docs/perf-log.md's eighteenth session gives; not
run before this probe):
  MODE 0: mbarrier + st.async of each CTA's partial into every peer's slot (QuACK's scheme);
  MODE 1: st.shared::cluster into every peer, then a release/acquire cluster barrier;
  MODE 2: the partials through global memory and one release/acquire cluster barrier.
Each CTA holds its 16384 columns (x and w) in registers; one row a cluster, not persistent.

Checked first, per mode, at M = 1, 7 and 64: y against the fp32 oracle (computed in fp32,
rounded once: elements more than 1 ulp off) and rstd against the fp64 reference (largest
relative difference). Then timed (device-only, the tuner's timer, best of two interleaved
passes; y and rstd allocated per call, as the product does) beside launch.rmsnorm_forward.
A mode that hangs is killed by the caller's timeout: run one mode a process.

Prediction: MODE 0 within 2% of QuACK's pace, 1.03-1.08x the product at 256-1024 x 131072 bf16
(the product's rows run at 92% of the copy's pace, QuACK's at ~100%); more at 64 rows, where the
product's fixed cost (5 µs a call) weighs most.

Run from the repository root on an sm_90 GPU, one mode a process:
    PYTHONPATH=.:experiments python experiments/cluster_forward_ab.py MODE out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from impls.triton_rmsnorm import launch, tuning

# --- MODE 0 (st.async + mbarrier) ---------------------------------------------------------------
# Declarations at function scope (no braces) so that the second asm block can name them.
_M0_START = gl.constexpr("""
.shared .align 8 .b64 rmsn_cl_mbar;
.shared .align 16 .f32 rmsn_cl_slots[8];
{
.reg .pred p0;
.reg .b32 tid;
mov.u32 tid, %tid.x;
setp.eq.u32 p0, tid, 0;
@p0 mbarrier.init.shared::cta.b64 [rmsn_cl_mbar], 1;
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.relaxed.aligned;
mov.b32 $0, $1;
}
""")
_M0_EXCHANGE = gl.constexpr("""
{
.reg .b32 rk, tid, a, ra, mb, rmb;
.reg .pred p0, p1, done;
.reg .f32 s0, s1, s2, s3, s4, s5, s6, s7;
mov.u32 rk, %cluster_ctarank;
mov.u32 tid, %tid.x;
setp.eq.u32 p0, tid, 0;
barrier.cluster.wait.aligned;
@p0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [rmsn_cl_mbar], 32;
mov.u32 a, rmsn_cl_slots;
shl.b32 rk, rk, 2;
add.u32 a, a, rk;
mov.u32 mb, rmsn_cl_mbar;
setp.lt.u32 p1, tid, 8;
@p1 mapa.shared::cluster.u32 ra, a, tid;
@p1 mapa.shared::cluster.u32 rmb, mb, tid;
@p1 st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [ra], $1, [rmb];
WAIT:
mbarrier.try_wait.parity.shared::cta.b64 done, [rmsn_cl_mbar], 0;
@!done bra WAIT;
ld.shared.v4.f32 {s0, s1, s2, s3}, [rmsn_cl_slots];
ld.shared.v4.f32 {s4, s5, s6, s7}, [rmsn_cl_slots+16];
add.f32 s0, s0, s1; add.f32 s2, s2, s3; add.f32 s4, s4, s5; add.f32 s6, s6, s7;
add.f32 s0, s0, s2; add.f32 s4, s4, s6;
add.f32 $0, s0, s4;
}
""")

# --- MODE 1 (st.shared::cluster + two cluster barriers) ----------------------------------------
_M1_START = gl.constexpr("""
.shared .align 16 .f32 rmsn_cl_slots1[8];
barrier.cluster.arrive.relaxed.aligned;
mov.b32 $0, $1;
""")
_M1_EXCHANGE = gl.constexpr("""
{
.reg .b32 rk, tid, a, ra;
.reg .pred p;
.reg .f32 s0, s1, s2, s3, s4, s5, s6, s7;
mov.u32 rk, %cluster_ctarank;
mov.u32 tid, %tid.x;
barrier.cluster.wait.aligned;
mov.u32 a, rmsn_cl_slots1;
shl.b32 rk, rk, 2;
add.u32 a, a, rk;
setp.lt.u32 p, tid, 8;
@p mapa.shared::cluster.u32 ra, a, tid;
@p st.shared::cluster.f32 [ra], $1;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
ld.shared.v4.f32 {s0, s1, s2, s3}, [rmsn_cl_slots1];
ld.shared.v4.f32 {s4, s5, s6, s7}, [rmsn_cl_slots1+16];
add.f32 s0, s0, s1; add.f32 s2, s2, s3; add.f32 s4, s4, s5; add.f32 s6, s6, s7;
add.f32 s0, s0, s2; add.f32 s4, s4, s6;
add.f32 $0, s0, s4;
}
""")

# --- MODE 2 (global memory + one cluster barrier) ----------------------------------------------
# $2: this CTA's slot (scratch + row*8 + rank), $3: the row's slot 0 (16-byte aligned).
_M2_EXCHANGE = gl.constexpr("""
{
.reg .f32 s0, s1, s2, s3, s4, s5, s6, s7;
.reg .pred p;
.reg .b32 tid;
mov.u32 tid, %tid.x;
setp.eq.u32 p, tid, 0;
@p st.global.f32 [$2], $1;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
ld.global.v4.f32 {s0, s1, s2, s3}, [$3];
ld.global.v4.f32 {s4, s5, s6, s7}, [$3+16];
add.f32 s0, s0, s1; add.f32 s2, s2, s3; add.f32 s4, s4, s5; add.f32 s6, s6, s7;
add.f32 s0, s0, s2; add.f32 s4, s4, s6;
add.f32 $0, s0, s4;
}
""")


@gluon.jit
def rmsnorm_cluster_fwd(
    X, W, Y, RSTD, SCRATCH, eps, N: gl.constexpr, CLUSTER: gl.constexpr, MODE: gl.constexpr
):
    gl.static_assert(CLUSTER == 8)  # the asm hard-codes 8 slots and a log2(8) = 3-basis CGA
    COLS: gl.constexpr = N // CLUSTER
    # [CLUSTER, COLS] view of one row; CTA r of the cluster owns view row r (columns r*COLS...).
    layout: gl.constexpr = gl.BlockedLayout(
        [1, 8], [1, 32], [1, gl.num_warps()], [1, 0], [[1, 0], [2, 0], [4, 0]]
    )
    row = gl.program_id(0)  # %clusterid.x: one program per cluster, one row per program
    r = gl.arange(0, CLUSTER, gl.SliceLayout(1, layout))  # per CTA: its rank in the cluster
    c = gl.arange(0, COLS, gl.SliceLayout(0, layout))
    if MODE == 0:
        r = gl.inline_asm_elementwise(_M0_START, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    elif MODE == 1:
        r = gl.inline_asm_elementwise(_M1_START, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    offs = gl.expand_dims(r, 1) * COLS + gl.expand_dims(c, 0)
    x = gl.load(X + row * N + offs).to(gl.float32)
    w = gl.load(W + offs).to(gl.float32)
    part = gl.sum(x * x, axis=1)  # [CLUSTER]: one partial per CTA, reduced inside the CTA
    if MODE == 0:
        total = gl.inline_asm_elementwise(
            _M0_EXCHANGE, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
        )
    elif MODE == 1:
        total = gl.inline_asm_elementwise(
            _M1_EXCHANGE, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
        )
    else:
        r1 = gl.arange(0, CLUSTER, part.type.layout)
        mine = (SCRATCH + row * CLUSTER + r1).to(gl.int64, bitcast=True)
        base = (SCRATCH + row * CLUSTER + r1 * 0).to(gl.int64, bitcast=True)
        total = gl.inline_asm_elementwise(
            _M2_EXCHANGE, "=f,f,l,l", [part, mine, base], dtype=gl.float32, is_pure=False, pack=1
        )
    rstd = gl.rsqrt(total / N + eps)
    gl.store(Y + row * N + offs, (x * gl.expand_dims(rstd, 1) * w).to(Y.dtype.element_ty))
    r2 = gl.arange(0, CLUSTER, rstd.type.layout)  # (a fresh arange: Gluon 3.6 chokes comparing
    gl.store(RSTD + row + r2 * 0, rstd, mask=r2 == 0)  # this layout with the user's BlockedLayout)


EPS = 1e-6
SHAPES = [
    (64, 131072, 8),
    (256, 131072, 8),
    (512, 131072, 8),
    (1024, 131072, 8),
    (512, 131072, 16),
    (256, 262144, 16),
    (256, 262144, 32),
]  # (M, N, warps)


def _cluster_forward(x, w, mode: int, warps: int):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    scratch = torch.empty(m * 8, device=x.device, dtype=torch.float32)
    rmsnorm_cluster_fwd[(m,)](x, w, y, rstd, scratch, EPS, N=n, CLUSTER=8, MODE=mode,
                              num_warps=warps, num_ctas=8)  # fmt: skip
    return y, rstd


def _check(mode: int, m: int, n: int, warps: int) -> dict:
    torch.manual_seed(m)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, rstd = _cluster_forward(x, w, mode, warps)
    torch.cuda.synchronize()
    x64 = x.double()
    ref_rstd = torch.rsqrt(x64.pow(2).mean(-1) + EPS)
    ref_y = (x64 * ref_rstd[:, None] * w.double()).float().to(torch.bfloat16)
    ulp = (ref_y.float().abs().clamp_min(1e-30).log2().floor() - 7).exp2()
    off = ((y.float() - ref_y.float()).abs() > ulp).sum().item()
    rel = ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item()
    return {"m": m, "n": n, "warps": warps, "y_off_by_more_than_1ulp": off, "rstd_max_rel": rel}


def main(mode: int, out_path: str) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "mode": mode, "checks": [], "rows": []}
    for m in (1, 7, 64):
        for n, warps in ((131072, 8), (262144, 16)):
            check = _check(mode, m, n, warps)
            print(f"MODE {mode} check {check}", flush=True)
            result["checks"].append(check)
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m, n, warps in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        launched = sorted(launch.take_launch_configs())
        runs = {
            "product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
            "cluster": lambda a, warps=warps: _cluster_forward(a[0], a[1], mode, warps),
        }
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        gbps = {k: 2 * m * n * 2 / (v * 1e3) for k, v in us.items()}
        print(f"MODE {mode} {m}x{n} bf16 {warps} warps: product {us['product']:.1f} µs "
              f"({gbps['product']:.0f} GB/s), cluster {us['cluster']:.1f} µs "
              f"({gbps['cluster']:.0f} GB/s), {us['product'] / us['cluster']:.3f}x  {launched}",
              flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "warps": warps, "us": us, "launched": launched})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
