"""Probe: the cluster forward under each cluster scheduling policy.

Triton 3.6's launcher (backends/nvidia/driver.py, the generated C launcher) launches every
kernel of num_ctas > 1 with CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = SPREAD.
The staged cluster forward (`cluster_forward_staged_ab.py`: 8 CTAs a row, x staged by cp.async,
each warp's partial sent to every peer) ran 0.97-0.99x the product at 256-1024 x 131072 bf16,
where QuACK (launched by CUTLASS's DSL) runs at the copy's floor (134.1 µs at 1024x131072 in a
fresh process, `2026-11-30-aca54a9df4b3-harness-vs-tuner-timing.txt`). Here the same kernel
under SPREAD (Triton's), DEFAULT and LOAD_BALANCING: driver.make_launcher is wrapped so that
the launcher source names the policy asked for, and each policy gets a compiled kernel of its
own (num_stages 3, 1 and 2, which a Gluon kernel does not use: the binaries are the same, the
launchers differ; each launcher is made at its kernel's first launch: one launcher a compiled
kernel, which the probe asserts are three; that their launchers' sources differ is by
construction, not asserted). Outputs compared with
SPREAD's bit for bit; timed as the staged probe times (device-only, the tuner's timer, best of
two interleaved passes).

Prediction: no policy moves the time by more than 2% (the policy is a preference for placing
clusters over GPCs; with two or three clusters an SM's worth resident it may not bind).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/cluster_scheduling_policy_ab.py out.json
"""

import json
import sys

import torch
from ab_timing import time_runs
from cluster_forward_registers_ab import EPS
from cluster_forward_staged_ab import rmsnorm_cluster_staged_fwd_kernel
from cluster_forward_warp_exchange_ab import CLUSTER_SIZE, WARPS
from triton.backends.nvidia import driver as nvidia_driver

from impls.triton_rmsnorm import launch, tuning

#: policy -> the num_stages its compiled kernel is keyed by
POLICIES = {"SPREAD": 3, "DEFAULT": 1, "LOAD_BALANCING": 2}
_make_launcher = nvidia_driver.make_launcher
asked = {"policy": "SPREAD"}


def _launcher_with_policy(*args, **kwargs):
    src = _make_launcher(*args, **kwargs)
    assert "CU_CLUSTER_SCHEDULING_POLICY_SPREAD" in src, "the launcher source changed"
    return src.replace(
        "CU_CLUSTER_SCHEDULING_POLICY_SPREAD", f"CU_CLUSTER_SCHEDULING_POLICY_{asked['policy']}"
    )


nvidia_driver.make_launcher = _launcher_with_policy


def _forward(x, w, policy: str):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    compiled = rmsnorm_cluster_staged_fwd_kernel[(m,)](
        x, w, y, rstd, EPS, N=n, num_warps=WARPS, num_ctas=CLUSTER_SIZE,
        num_stages=POLICIES[policy],
    )  # fmt: skip
    return y, rstd, compiled


def main(out_path: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 131072, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(131072, device="cuda", dtype=torch.bfloat16)
    outputs = {}
    for policy in POLICIES:  # each launcher made under its policy, at its first launch
        asked["policy"] = policy
        outputs[policy] = _forward(x, w, policy)
    asked["policy"] = "SPREAD"
    torch.cuda.synchronize()
    kernels = {p: id(o[2]) for p, o in outputs.items()}
    assert len(set(kernels.values())) == len(POLICIES), (
        f"one compiled kernel for two policies: {kernels}"
    )
    differ = {
        p: int((o[0] != outputs["SPREAD"][0]).sum()) + int((o[1] != outputs["SPREAD"][1]).sum())
        for p, o in outputs.items()
    }
    print(f"elements that differ from SPREAD's: {differ}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "differ": differ, "rows": []}
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    for m in (64, 256, 512, 1024):
        n = 131072
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        launch.rmsnorm_forward(x, w, EPS)
        runs = {"product": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS)}
        for policy in POLICIES:
            runs[f"staged, {policy}"] = lambda a, p=policy: _forward(a[0], a[1], p)
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
