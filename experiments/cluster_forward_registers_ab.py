"""Probe: the cluster forward (`cluster_forward_ab.py`, MODE 0) with fewer registers a thread, and
with 16 CTAs a cluster.

In `2026-11-30-aca54a9df4b3-cluster-forward-ab-mode0.txt` a cluster of 8 CTAs a row, each CTA
holding its 16384 columns of x and w in fp32 registers (~120 a thread at 8 warps, two CTAs an
SM), ran 1.064x the product at 64x131072 bf16 but 0.94-0.97x at 256-1024 rows: its fixed cost is
low and its rows slow. Two CTAs an SM keep at most 64 KB of loads in flight, about the latency
times an SM's share of the bandwidth. Here, each a constexpr of one kernel:
  RAW_X: x kept in its 16-bit form (half the registers), upcast for the sum and again for y in
         inline PTX that the compiler cannot merge (gluon_common._upcast_opaque);
  LATE_W: w loaded after the exchange (L2-resident; its registers not live across the wait);
  RAW_W: w loaded early but kept in its 16-bit form, upcast where used (added after the run,
         `-registers-ab.txt`, where LATE_W cost 5-10%; compile-checked only, not run: ptxas
         (Triton 3.6, sm_90a) still used 118 registers at 8 warps, the upcasts scheduled early);
  CLUSTER 16: 16 CTAs a cluster (non-portable size; Triton 3.6 sets the attribute past 8),
         8192 columns a CTA at 131072, 16384 at 262144.
The exchange is MODE 0's (st.async of each CTA's partial into every peer's shared slot,
completing an mbarrier), its slot count and sum a constexpr of CLUSTER; every CTA sums the slots
in one order, so the cluster agrees on rstd bit for bit. Checked at 1, 7 and 64 rows against the
fp32 oracle (y within 1 ulp, rstd within 1e-6 relative), then timed beside the product
(device-only, the tuner's timer, best of two interleaved passes, y and rstd allocated per call).

Prediction: RAW_X + LATE_W at 8 warps (~60 registers, 4 CTAs an SM) at QuACK's pace: 1.03-1.05x
the product at 256-1024 x 131072, 1.06x or more at 64 rows; CLUSTER 16 at 262144 columns within
2% of the product (0.86 with 8 CTAs of 32768 columns).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/cluster_forward_registers_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.gluon_common import _upcast_opaque


def _start_asm(cluster: int) -> str:
    """At kernel start: the mbarrier and CLUSTER slots (declared here, named again by the
    exchange), and the cluster's first arrive (relaxed), whose wait the loads hide."""
    return f"""
.shared .align 8 .b64 rmsn_cl_mbar;
.shared .align 16 .f32 rmsn_cl_slots[{cluster}];
{{
.reg .pred p0;
.reg .b32 tid;
mov.u32 tid, %tid.x;
setp.eq.u32 p0, tid, 0;
@p0 mbarrier.init.shared::cta.b64 [rmsn_cl_mbar], 1;
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.relaxed.aligned;
mov.b32 $0, $1;
}}
"""


def _exchange_asm(cluster: int) -> str:
    """Every CTA's partial ($1) into slot `rank` of every peer (st.async completing the peer's
    mbarrier), then the CLUSTER slots summed in order: s0 + s1, s2 + s3, ... pairwise."""
    loads = "\n".join(
        f"ld.shared.v4.f32 {{s{4 * i}, s{4 * i + 1}, s{4 * i + 2}, s{4 * i + 3}}}, "
        f"[rmsn_cl_slots+{16 * i}];"
        for i in range(cluster // 4)
    )
    adds, live = [], [f"s{i}" for i in range(cluster)]
    while len(live) > 2:
        nxt = []
        for a, b in zip(live[0::2], live[1::2], strict=True):
            adds.append(f"add.f32 {a}, {a}, {b};")
            nxt.append(a)
        live = nxt
    regs = ", ".join(f"s{i}" for i in range(cluster))
    return f"""
{{
.reg .b32 rk, tid, a, ra, mb, rmb;
.reg .pred p0, p1, done;
.reg .f32 {regs};
mov.u32 rk, %cluster_ctarank;
mov.u32 tid, %tid.x;
setp.eq.u32 p0, tid, 0;
barrier.cluster.wait.aligned;
@p0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [rmsn_cl_mbar], {4 * cluster};
mov.u32 a, rmsn_cl_slots;
shl.b32 rk, rk, 2;
add.u32 a, a, rk;
mov.u32 mb, rmsn_cl_mbar;
setp.lt.u32 p1, tid, {cluster};
@p1 mapa.shared::cluster.u32 ra, a, tid;
@p1 mapa.shared::cluster.u32 rmb, mb, tid;
@p1 st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [ra], $1, [rmb];
WAIT:
mbarrier.try_wait.parity.shared::cta.b64 done, [rmsn_cl_mbar], 0;
@!done bra WAIT;
{loads}
{chr(10).join(adds)}
add.f32 $0, {live[0]}, {live[1]};
}}
"""


_START_8 = gl.constexpr(_start_asm(8))
_START_16 = gl.constexpr(_start_asm(16))
_EXCHANGE_8 = gl.constexpr(_exchange_asm(8))
_EXCHANGE_16 = gl.constexpr(_exchange_asm(16))


@gluon.jit
def rmsnorm_cluster_fwd_kernel(
    X, W, Y, RSTD, eps,
    N: gl.constexpr, CLUSTER: gl.constexpr, RAW_X: gl.constexpr, LATE_W: gl.constexpr,
    RAW_W: gl.constexpr = False,
):  # fmt: skip
    COLS: gl.constexpr = N // CLUSTER
    if CLUSTER == 8:
        layout: gl.constexpr = gl.BlockedLayout(
            [1, 8], [1, 32], [1, gl.num_warps()], [1, 0], [[1, 0], [2, 0], [4, 0]]
        )
    else:
        layout: gl.constexpr = gl.BlockedLayout(
            [1, 8], [1, 32], [1, gl.num_warps()], [1, 0], [[1, 0], [2, 0], [4, 0], [8, 0]]
        )
    row = gl.program_id(0)  # one program a cluster, one row a program
    r = gl.arange(0, CLUSTER, gl.SliceLayout(1, layout))  # per CTA: its rank in the cluster
    c = gl.arange(0, COLS, gl.SliceLayout(0, layout))
    if CLUSTER == 8:
        r = gl.inline_asm_elementwise(_START_8, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    else:
        r = gl.inline_asm_elementwise(_START_16, "=r,r", [r], dtype=gl.int32, is_pure=False, pack=1)
    offs = gl.expand_dims(r, 1) * COLS + gl.expand_dims(c, 0)
    x_raw = gl.load(X + row.to(gl.int64) * N + offs)
    if not LATE_W:
        w_raw = gl.load(W + offs)
        if not RAW_W:
            w = w_raw.to(gl.float32)
    if RAW_X:  # noqa: SIM108 (a constexpr branch of a Gluon kernel)
        xf = _upcast_opaque(x_raw)
    else:
        xf = x_raw.to(gl.float32)
    part = gl.sum(xf * xf, axis=1)  # one partial a CTA, reduced inside it
    if CLUSTER == 8:
        total = gl.inline_asm_elementwise(
            _EXCHANGE_8, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
        )
    else:
        total = gl.inline_asm_elementwise(
            _EXCHANGE_16, "=f,f", [part], dtype=gl.float32, is_pure=False, pack=1
        )
    rstd = gl.rsqrt(total / N + eps)
    if LATE_W:
        w = gl.load(W + offs).to(gl.float32)
    if RAW_X:
        xf = _upcast_opaque(x_raw)
    if RAW_W:
        w = _upcast_opaque(w_raw)
    y = xf * gl.expand_dims(rstd, 1) * w
    gl.store(Y + row.to(gl.int64) * N + offs, y.to(Y.dtype.element_ty))
    r2 = gl.arange(0, CLUSTER, rstd.type.layout)  # a fresh arange: Gluon 3.6 fails comparing
    gl.store(RSTD + row + r2 * 0, rstd, mask=r2 == 0)  # this layout with the user's


EPS = 1e-6
#: (name, CLUSTER, RAW_X, LATE_W, warps[, RAW_W]); a second argument "raw-w" runs RAW_W_VARIANTS
VARIANTS = [
    ("8 CTAs, fp32 x and w (as MODE 0)", 8, False, False, 8),
    ("8 CTAs, late w", 8, False, True, 8),
    ("8 CTAs, raw x, late w", 8, True, True, 8),
    ("8 CTAs, raw x, late w, 4 warps", 8, True, True, 4),
    ("16 CTAs, raw x, late w", 16, True, True, 8),
    ("16 CTAs, raw x, late w, 4 warps", 16, True, True, 4),
]
RAW_W_VARIANTS = [
    ("8 CTAs, fp32 x and w (as MODE 0)", 8, False, False, 8),
    ("8 CTAs, fp32 x, raw w", 8, False, False, 8, True),
    ("8 CTAs, raw x, raw w", 8, True, False, 8, True),
    ("8 CTAs, raw x, raw w, 16 warps", 8, True, False, 16, True),
]
SHAPES = [(64, 131072), (256, 131072), (512, 131072), (1024, 131072), (256, 262144)]


def _forward(x, w, cluster, raw_x, late_w, warps, raw_w=False):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    rmsnorm_cluster_fwd_kernel[(m,)](
        x, w, y, rstd, EPS, N=n, CLUSTER=cluster, RAW_X=raw_x, LATE_W=late_w, RAW_W=raw_w,
        num_warps=warps, num_ctas=cluster,
    )  # fmt: skip
    return y, rstd


def _check(variant, m: int, n: int) -> dict:
    torch.manual_seed(m)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, rstd = _forward(x, w, *variant[1:])
    torch.cuda.synchronize()
    x64 = x.double()
    ref_rstd = torch.rsqrt(x64.pow(2).mean(-1) + EPS)
    ref_y = (x64 * ref_rstd[:, None] * w.double()).float().to(torch.bfloat16)
    ulp = (ref_y.float().abs().clamp_min(1e-30).log2().floor() - 7).exp2()
    off = ((y.float() - ref_y.float()).abs() > ulp).sum().item()
    rel = ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item()
    return {"m": m, "n": n, "y_off_by_more_than_1ulp": off, "rstd_max_rel": rel}


def main(out_path: str, variants=VARIANTS) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "checks": {}, "rows": []}
    usable = []
    for variant in variants:
        name = variant[0]
        try:
            checks = [_check(variant, m, n) for m in (1, 7, 64) for n in (131072, 262144)]
        except Exception as error:  # a variant that cannot compile or launch: the rest go on
            print(f"{name}: {type(error).__name__} {str(error)[:200]}", flush=True)
            continue
        good = all(c["y_off_by_more_than_1ulp"] == 0 and c["rstd_max_rel"] < 1e-6 for c in checks)
        print(
            f"{name}: checks {'pass' if good else 'FAIL'} {checks if not good else ''}", flush=True
        )
        result["checks"][name] = checks
        if good:
            usable.append(variant)
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        launched = sorted(launch.take_launch_configs())
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS)}
        for name, *launch_args in usable:
            runs[name] = lambda a, v=tuple(launch_args): _forward(a[0], a[1], *v)
        arg_sets = tuning.rotating_arguments((x, w), l2)
        stream.wait_stream(torch.cuda.current_stream())
        us = time_runs(runs, arg_sets, stream)
        print(f"{m}x{n} bf16, device µs (x the product)  {launched}", flush=True)
        for name, t in us.items():
            gbps = 2 * m * n * 2 / (t * 1e3)
            print(f"  {t:7.1f}  {gbps:5.0f} GB/s  {us['product'] / t:.3f}x  {name}", flush=True)
        result["rows"].append({"m": m, "n": n, "us": us, "launched": launched})
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1], RAW_W_VARIANTS if sys.argv[2:] == ["raw-w"] else VARIANTS)
