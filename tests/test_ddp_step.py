"""harness.ddp_step on one rank: the model, the training runs and their checks, with negative
controls the checks must reject; the watchdog; the multicast settings.

On a CPU machine the runs use gloo and the Triton interpreter at tiny sizes (a check of the
logic, not a measurement); on a GPU machine, NCCL and the GPU. The two-process run is the GPU
command in docs/h200-runbook.md ("Two GPUs").
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from harness import ddp_step
from tests.conftest import ON_GPU

TINY = ["--hidden", "64", "--layers", "1", "--heads", "2", "--head-dim", "16", "--ffn", "64",
        "--vocab", "64", "--seq", "8", "--batch", "2", "--steps", "1", "--warmup", "1",
        "--lr", "1e-2", "--device", "cuda" if ON_GPU else "cpu"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun's environment for a single rank, on a free port; the group is torn down after."""
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ddp_step.MULTICAST_OFF:  # main sets them; restored after the test
        monkeypatch.delenv(name, raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_multicast_stays_off():
    env = {}
    ddp_step.keep_multicast_off(env)
    assert env == ddp_step.MULTICAST_OFF
    env = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
    ddp_step.keep_multicast_off(env)
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    with pytest.raises(RuntimeError, match="NCCL_NVLS_ENABLE=1"):
        ddp_step.keep_multicast_off({"NCCL_NVLS_ENABLE": "1"})


def test_loss_rule_accepts_the_band_and_rejects_outside_it():
    ref = [7.0, 6.5, 6.0]
    stock = [7.01, 6.49, 6.02]  # 0.02 at most from the reference
    ok = ddp_step.compare_losses([7.02, 6.52, 5.99], stock, ref)
    assert ok["passed"], ok
    # bound = 2 * 0.02 + 2^-8 * 6.5 = 0.0654: 0.07 off is out
    bad = ddp_step.compare_losses([7.0, 6.57, 6.0], stock, ref)
    assert not bad["passed"] and bad["ours_vs_reference_max"] == pytest.approx(0.07)
    assert not ddp_step.compare_losses([7.0, float("nan"), 6.0], stock, ref)["passed"]
    with pytest.raises(ValueError, match="losses: expected three equally long"):
        ddp_step.compare_losses([7.0], stock, ref)


def test_default_lr_scales_with_width():
    assert ddp_step.default_lr(64) == ddp_step.default_lr(4096) == 1e-3
    assert ddp_step.default_lr(32768) == pytest.approx(1e-3 / 8)
    assert ddp_step.parser().parse_args([]).lr is None  # the default: per width
    assert ddp_step.parser().parse_args(["--lr", "3e-4"]).lr == 3e-4
    with pytest.raises(ValueError, match="--lr: expected a learning rate > 0, got 0.0"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--lr", "0"]))


def test_grad_rule_rejects_a_zero_gradient():
    ref = {"norm": torch.linspace(1, 2, 64)}
    stock = {"norm": ref["norm"] * (1 + 2**-9)}
    assert ddp_step.compare_norm_grads({"norm": ref["norm"] * (1 - 2**-9)}, stock, ref)["passed"]
    assert not ddp_step.compare_norm_grads({"norm": torch.zeros(64)}, stock, ref)["passed"]
    with pytest.raises(ValueError, match="norm grads: expected the same"):
        ddp_step.compare_norm_grads({"other": torch.zeros(64)}, stock, ref)


def test_kernel_overlap_counts_norm_kernels_beside_nccl_on_another_stream():
    events = [
        {"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 100,
         "dur": 50, "tid": 20},
        {"cat": "kernel", "name": "rmsnorm_bwd_kernel", "ts": 120, "dur": 10, "tid": 7},
        {"cat": "kernel", "name": "rmsnorm_fwd_kernel", "ts": 10, "dur": 10, "tid": 7},
        {"cat": "kernel", "name": "rmsnorm_dw_reduce_kernel", "ts": 140, "dur": 20, "tid": 20},
        {"cat": "kernel", "name": "sm90_gemm", "ts": 90, "dur": 20, "tid": 7},
        {"cat": "kernel", "name": "rmsnorm_bwd_columns_kernel", "ts": 100, "dur": 5, "tid": 9,
         "args": {"stream": 20}},  # the NCCL kernel's stream, by its args
        {"cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 50, "tid": 1},
    ]  # fmt: skip
    found = ddp_step.kernel_overlap(events)
    assert found["nccl_kernels"] == 1 and found["norm_kernels"] == 4
    # the dw reduction shares the NCCL kernel's stream: ordered, not beside it
    assert found["norm_kernels_beside_nccl"] == 1
    assert found["norm_kernel_names_beside_nccl"] == ["rmsnorm_bwd_kernel"]
    assert found["compute_us_beside_nccl"] == 10 + 10


def test_the_model_sees_the_norm_it_is_given():
    c = ddp_step.ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=8, ffn=16,
                             vocab=16, seq=4)  # fmt: skip
    model = ddp_step.build_model(c, ddp_step.stock_norm, torch.float32, torch.device("cpu"), 0)
    again = ddp_step.build_model(c, ddp_step.ours_norm, torch.float32, torch.device("cpu"), 0)
    norms = [m for m in again.modules() if ddp_step.is_norm(m)]
    assert len(norms) == 2 * c.layers + 1 and all(
        type(m).__module__.startswith("impls") for m in norms
    )
    # the same initialization whichever the norm
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="heads: expected a multiple of kv_heads=3"):
        ddp_step.ModelConfig(heads=4, kv_heads=3)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_training_step_on_one_rank(tmp_path, one_rank, parallel):
    """The whole script: three runs, the checks pass, the loss falls, the record is complete."""
    out = tmp_path / "ddp.json"
    fsdp = ["--fsdp"] if parallel == "fsdp2" else []
    assert ddp_step.main([*TINY, *fsdp, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "passed" and record["world_size"] == 1
    assert record["parallel"] == parallel
    assert record["env"]["NCCL_NVLS_ENABLE"] == "0"
    (entry,) = record["results"].values()
    assert set(entry["runs"]) == {"ours", "stock", "reference"}
    for run in entry["runs"].values():
        assert len(run["losses"]) == 2 and run["losses"][1] < run["losses"][0]
        assert len(run["step_s_max_rank"]) == 2 and run["median_step_s"] > 0
    assert entry["losses"]["passed"] and entry["norm_grads"]["passed"]
    assert entry["lr"] == 1e-2  # TINY's --lr
    assert len(entry["norm_grads"]["per_norm"]) == 3  # two in the block, the final one


def test_stock_runs_alone_at_the_default_lr(tmp_path, one_rank):
    """--no-ours: the stock runs, no check; the lr is the width's default."""
    out = tmp_path / "ddp.json"
    argv = [a for a in TINY if a not in ("--lr", "1e-2")]
    assert ddp_step.main([*argv, "--no-ours", "--out", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["results"].values()
    assert set(entry["runs"]) == {"stock", "reference"} and "losses" not in entry
    assert entry["lr"] == ddp_step.default_lr(64) == 1e-3


def _zero_dw_norm(n: int, eps: float):
    """Our norm with its weight's gradient replaced by zeros: the same forward, a wrong dw."""
    norm = ddp_step.ours_norm(n, eps)
    norm.weight.register_hook(torch.zeros_like)
    return norm


def _wrong_eps_norm(n: int, eps: float):
    return ddp_step.ours_norm(n, 0.25)


@pytest.mark.parametrize(
    "norm, rejected_by",
    [(_zero_dw_norm, "norm_grads"), (_wrong_eps_norm, "losses")],
    ids=["zero-dw", "wrong-eps"],
)
def test_the_checks_reject_a_wrong_norm(monkeypatch, tmp_path, one_rank, norm, rejected_by):
    monkeypatch.setitem(ddp_step.NORMS, "ours", norm)
    out = tmp_path / "ddp.json"
    assert ddp_step.main([*TINY, "--out", str(out)]) == 1
    record = json.loads(out.read_text())
    (entry,) = record["results"].values()
    assert record["status"].startswith("FAILED") and not entry[rejected_by]["passed"]


def test_a_hung_step_aborts_with_a_message():
    code = ("import time; from harness.ddp_step import StepWatchdog; "
            "w = StepWatchdog(5, on_hang=lambda m: print('on_hang ran', flush=True)); "
            "w.arm('run x step 3', 0.2); time.sleep(60)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == ddp_step.StepWatchdog.EXIT_HUNG, done.stderr
    assert "rank 5: STEP HUNG: run x step 3 is still running after 0.2 s" in done.stderr
    assert "on_hang ran" in done.stdout


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="--warmup: expected at least 1"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--warmup", "0"]))
    with pytest.raises(ValueError, match="--step-timeout-s: expected seconds > 0"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--step-timeout-s", "0"]))
