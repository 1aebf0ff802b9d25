"""Programmatic dependent launch of the single-tile forward (common.pdl_switches): it may be
scheduled before the kernel ahead of it has finished, so it must wait on that kernel before any
load or store, keep its bits, and read what the kernel ahead wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.oracle import compare, reference
from impls.triton_rmsnorm import common, direct, fp8_kernels, kernels, launch
from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward
from tests.conftest import ON_GPU
from tests.helpers import TOL

REPO = Path(__file__).resolve().parent.parent
ON_HOPPER = ON_GPU and torch.cuda.get_device_capability() >= (9, 0)


def test_no_pdl_off_the_gpu():
    """The interpreter and CPU tensors launch without PDL (nothing to wait on)."""
    assert common.pdl_switches(torch.device("cpu")) == {}
    if common.interpreting():
        assert common.pdl_switches(torch.device("cuda", 0)) == {}


def test_the_forward_waits_before_any_global_access_sm90():
    """Compiled for sm_90 (no GPU needed): with WAIT_FOR_PRIOR_GRID the PTX holds one
    griddepcontrol.wait, ahead of every global load, store and cp.async; without it, none."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    from tests import sm90_compile

    base = {"kernel": "fwd", "x": "bf16", "stages": 1, "extra": False, "hold": False,
            "report_wait": True}  # fmt: skip
    cases = [
        {**base, "block_n": 4096, "warps": 16, "persistent": False, "w_early": True,
         "constexprs": {"WAIT_FOR_PRIOR_GRID": True}},
        {**base, "block_n": 2048, "warps": 4, "persistent": True, "stages": 3,
         "constexprs": {"WAIT_FOR_PRIOR_GRID": True}},
        {**base, "block_n": 4096, "warps": 16, "persistent": False, "w_early": True},
    ]  # fmt: skip
    waiting_single, waiting_persistent, plain = sm90_compile.run(cases)
    for found in (waiting_single, waiting_persistent):
        assert found["waits"] == 1 and found["waits before any global access"], found
    assert plain["waits"] == 0, plain


def test_the_fp8_forward_waits_before_any_global_access_sm90():
    """rmsnorm_fp8's single-tile kernel, compiled for sm_90 with WAIT_FOR_PRIOR_GRID, per
    scaling and with a residual: one griddepcontrol.wait ahead of every global access."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    from tests import sm90_compile_fp8

    cases = [{"scaling": s, "n": 4096, "warps": 4, "fp8": "fp8e4nv", "x": "bf16", "residual": r,
              "w_early": True, "wait": True} for s in (0, 1, 2) for r in (False, True)]  # fmt: skip
    cases.append({**cases[0], "wait": False})
    *waiting, plain = sm90_compile_fp8.run(cases)
    for case, found in zip(cases[:-1], waiting, strict=True):
        assert found["waits"] == 1 and found["waits before any global access"], (case, found)
    assert plain["waits"] == 0, plain


def test_single_tile_kernel_names_the_shifted_kernel_for_wide_unaligned_rows():
    """Which single-tile kernel a forward launches (the one PDL is on): the plain kernel for
    rows on 16 bytes, the shifted one for wide rows that are not (odd N from 4096 columns)."""
    from impls.triton_rmsnorm.forward_launch import single_tile_kernel

    def kernel(m, n):
        x = torch.empty(m, n, dtype=torch.bfloat16)
        return single_tile_kernel(x, torch.empty_like(x))

    assert kernel(64, 4096) == "rmsnorm_fwd_kernel"
    assert kernel(64, 1023) == "rmsnorm_fwd_kernel"  # narrow odd rows: the plain kernel
    assert kernel(64, 4095) == "rmsnorm_fwd_shifted_kernel"


@pytest.mark.skipif(not ON_HOPPER, reason="PDL: a CUDA GPU of compute capability 9.0 or later")
def test_explain_says_the_forward_launches_with_pdl():
    from impls.triton_rmsnorm.explain import explain

    w = torch.empty(4096, dtype=torch.bfloat16, device="cuda")
    text = explain(torch.empty(16, 4096, dtype=torch.bfloat16, device="cuda"), w)
    assert "programmatic dependent launch" in text, text
    odd = explain(torch.empty(16, 4095, dtype=torch.bfloat16, device="cuda"), w[:4095])
    assert "programmatic dependent launch" not in odd, odd


@pytest.mark.skipif(not ON_HOPPER, reason="PDL: a CUDA GPU of compute capability 9.0 or later")
def test_the_default_forward_launches_with_pdl_on_hopper():
    x = torch.randn(4, 4096, dtype=torch.bfloat16).cuda()
    w = torch.randn(4096, dtype=torch.bfloat16).cuda()
    assert common.pdl_switches(x.device) == {"WAIT_FOR_PRIOR_GRID": True, "launch_pdl": True}
    launch.rmsnorm_forward(x, w, 1e-6)
    launch.rmsnorm_forward(x, w, 1e-6)  # the second launch goes through the cached binary
    for _ in range(2):
        rmsnorm_fp8_forward(x, w, 1e-6, 0.0, "per_token", None, torch.float8_e4m3fn)
    for kernel in (kernels.rmsnorm_fwd_kernel, fp8_kernels.rmsnorm_fp8_fwd_kernel):
        compiled = [c for key, c in direct._COMPILED.items() if key[0] is kernel]
        assert compiled and all(c.metadata.launch_pdl for c in compiled), kernel.fn.__name__


@pytest.mark.skipif(not ON_HOPPER, reason="PDL: a CUDA GPU of compute capability 9.0 or later")
@pytest.mark.parametrize("m, n", [(1, 4096), (64, 8192), (2048, 4096)])
def test_the_forward_reads_what_the_kernel_ahead_wrote(m, n):
    """Each forward follows the kernel that writes its x, queued behind a long kernel so the
    forward is launched (and may be scheduled) before its x is written: every y must be the
    oracle's for the x written, and bitwise the y of the same x normalized afterwards."""
    w = torch.randn(n, dtype=torch.bfloat16).cuda()
    sources = [torch.randn(m, n, dtype=torch.bfloat16).cuda() for _ in range(4)]
    x = torch.zeros(m, n, dtype=torch.bfloat16, device="cuda")
    big = torch.empty(64 * 2**20, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    outputs = []
    for src in sources * 4:
        big.fill_(1.0)  # ~30 us: the forward is queued well before its producer runs
        x.copy_(src)
        outputs.append(launch.rmsnorm_forward(x, w, 1e-6)[0])
    torch.cuda.synchronize()
    for i, y in enumerate(outputs):
        src = sources[i % len(sources)]
        after = launch.rmsnorm_forward(src, w, 1e-6)[0]
        assert torch.equal(y, after), f"call {i}: y differs from the same x normalized later"
        report = compare("y", y, reference(src, w, 1e-6).y, torch.bfloat16, TOL["y"], n)
        assert report.passed, (
            f"call {i}, y against the oracle for the x written: {report.summary()}"
        )


@pytest.mark.skipif(not ON_HOPPER, reason="PDL: a CUDA GPU of compute capability 9.0 or later")
def test_pdl_keeps_the_bits(tmp_path):
    """y, and rmsnorm_fp8's codes and scales, with PDL are bitwise the same as without it
    (RMSNORM_TRITON_PDL=0), each in a process of its own, at decode and larger shapes."""
    code = textwrap.dedent("""
        import json, sys, torch
        from impls.triton_rmsnorm import launch
        from impls.triton_rmsnorm.fp8 import rmsnorm_fp8_forward
        out = {}
        for m, n, dtype in json.loads(sys.argv[1]):
            g = torch.Generator().manual_seed(m * 100003 + n)
            dt = getattr(torch, dtype)
            x = torch.randn(m, n, generator=g).to(dt).cuda()
            w = torch.randn(n, generator=g).to(dt).cuda()
            y = launch.rmsnorm_forward(x, w, 1e-6)[0]
            out[f"{m}x{n}{dtype}"] = y.view(torch.int16).cpu().tolist()
            q, s, _, _ = rmsnorm_fp8_forward(x, w, 1e-6, 0.0, "block", None, torch.float8_e4m3fn)
            out[f"{m}x{n}{dtype} fp8"] = (q.view(torch.uint8).cpu().tolist(), s.cpu().tolist())
        torch.save(out, sys.argv[2])
    """)
    cases = [(1, 4096, "bfloat16"), (16, 8192, "float16"), (256, 2048, "bfloat16"),
             (2048, 7168, "float16")]  # fmt: skip
    results = {}
    for pdl in ("0", "1"):
        path = tmp_path / f"pdl{pdl}.pt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RMSNORM_TRITON_")}
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(cases), str(path)], cwd=REPO, capture_output=True,
            text=True, timeout=300, env={**env, "RMSNORM_TRITON_PDL": pdl},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        results[pdl] = torch.load(path)
    assert results["0"] == results["1"]
