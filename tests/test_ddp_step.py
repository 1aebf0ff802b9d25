"""harness.ddp_step on one rank: the model (harness.tiny_llama), the training runs
(harness.ddp_train) and their checks (harness.ddp_checks), with negative controls the checks
must reject; the watchdog; the multicast settings.

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

from harness import ddp_checks, ddp_step, ddp_train, tiny_llama
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
    ok = ddp_checks.compare_losses([7.02, 6.52, 5.99], stock, ref)
    assert ok["passed"], ok
    # bound = 2 * 0.02 + 2^-8 * 6.5 = 0.0654: 0.07 off is out
    bad = ddp_checks.compare_losses([7.0, 6.57, 6.0], stock, ref)
    assert not bad["passed"] and bad["ours_vs_reference_max"] == pytest.approx(0.07)
    assert not ddp_checks.compare_losses([7.0, float("nan"), 6.0], stock, ref)["passed"]
    with pytest.raises(ValueError, match="losses: expected three equally long"):
        ddp_checks.compare_losses([7.0], stock, ref)


# Recorded losses (bf16; 8 steps, defaults but --hidden 32768). The H200's at lr 1e-3: every
# run overshoots at step 2 and climbs back, the fp32 reference included.
H200_32768_LR_1E3 = {
    "ours": [7.083, 0.506, 7.151, 3.574, 1.490, 2.685, 2.927, 5.825],
    "stock": [7.083, 0.507, 7.202, 3.570, 1.371, 2.500, 2.679, 7.872],
    "reference": [7.083, 0.506, 7.140, 3.669, 1.427, 3.446, 3.619, 8.238],
}
# The CPU's (gloo, --no-ours) at the width-scaled default lr, 1.25e-4: a smooth fall with one
# small bump at step 3 (0.18, well under the stability rule's 0.89).
CPU_32768_DEFAULT_LR = {
    "stock": [7.1284, 2.0379, 0.2684, 0.4558, 0.1969, 0.1120, 0.0635, 0.0188],
    "reference": [7.1284, 1.9697, 0.2628, 0.4429, 0.1857, 0.1136, 0.0640, 0.0198],
}
GRADS_PASSED, GRADS_FAILED = {"passed": True}, {"passed": False}


def test_default_lr_scales_with_width():
    assert ddp_step.default_lr(64) == ddp_step.default_lr(4096) == 1e-3
    assert ddp_step.default_lr(32768) == pytest.approx(1e-3 / 8)
    assert ddp_step.parser().parse_args([]).lr is None  # the default: per width
    assert ddp_step.parser().parse_args(["--lr", "3e-4"]).lr == 3e-4
    with pytest.raises(ValueError, match="--lr: expected a learning rate > 0, got 0.0"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--lr", "0"]))


def test_stability_rule_on_recorded_losses():
    for name, losses in H200_32768_LR_1E3.items():
        assert "at step 2" in ddp_checks.divergence(losses), name
    for name, losses in CPU_32768_DEFAULT_LR.items():
        assert ddp_checks.divergence(losses) is None, name
    assert "loss nan at step 1" in ddp_checks.divergence([7.0, float("nan"), 6.0])
    assert "loss inf at step 0" in ddp_checks.divergence([float("inf"), 6.0])
    assert ddp_checks.divergence([7.0, 7.9]) is not None  # climbs from the start: 0.9 > 7/8
    assert ddp_checks.divergence([7.0, 7.8, 6.0]) is None  # a bump of 0.8, under 7/8
    assert ddp_checks.divergence([7.0]) is None
    with pytest.raises(ValueError, match="losses: expected a non-empty list"):
        ddp_checks.divergence([])


def test_verdict_is_inconclusive_when_the_reference_diverges():
    run = H200_32768_LR_1E3
    judged = ddp_checks.verdict(run["ours"], run["stock"], run["reference"], GRADS_PASSED)
    # the H200's record: the loss rule failed (2.41 > 1.91); no verdict on the norm from it
    assert not judged["losses"]["passed"]
    assert judged["losses"]["ours_vs_reference_max"] == pytest.approx(2.413)
    assert judged["verdict"] == "inconclusive"
    assert "the reference run diverged (loss 7.14 at step 2" in judged["reason"]
    assert "the stock run diverged" in judged["reason"]
    # a diverging run widens the band: ours one nat off at every step passes the loss rule
    # there, and is still not a pass
    off = [r + 1.0 for r in run["reference"]]
    judged = ddp_checks.verdict(off, run["stock"], run["reference"], GRADS_PASSED)
    assert judged["losses"]["passed"] and judged["verdict"] == "inconclusive"
    # the gradient rule holds before any training: its failure fails a diverging run too
    judged = ddp_checks.verdict(run["ours"], run["stock"], run["reference"], GRADS_FAILED)
    assert judged["verdict"] == "failed" and "gradients at step 0" in judged["reason"]
    assert "(the loss rule was not judged: the reference run diverged" in judged["reason"]


def test_verdict_is_inconclusive_when_only_the_stock_run_diverges():
    ref = CPU_32768_DEFAULT_LR["reference"]
    stock = [*ref[:3], 3.0, *ref[4:]]  # climbs back at step 3
    judged = ddp_checks.verdict(ref, stock, ref, GRADS_PASSED)
    assert judged["verdict"] == "inconclusive"
    assert judged["reason"].startswith("the stock run diverged (loss 3 at step 3")
    assert judged["diverged"]["reference"] is None


def test_verdict_on_a_stable_run_passes_a_right_norm_and_fails_a_wrong_one():
    stock, ref = CPU_32768_DEFAULT_LR["stock"], CPU_32768_DEFAULT_LR["reference"]
    # stock is 0.068 from ref at most (step 1): the bound is 2 * 0.068 + 2^-8 * 1.27 = 0.141
    right = [r + (-1) ** i * 0.05 for i, r in enumerate(ref)]
    judged = ddp_checks.verdict(right, stock, ref, GRADS_PASSED)
    assert judged["verdict"] == "passed", judged
    assert judged["losses"]["bound"] == pytest.approx(0.141, abs=1e-3)
    assert all(why is None for why in judged["diverged"].values())
    # negative controls: a norm whose run lags the reference by 0.2 nats at step 2, one that
    # diverges alone, one that is not finite, one with a wrong dw
    wrong = [*ref[:2], ref[2] + 0.2, *ref[3:]]
    diverging = [*ref[:4], 2.0, 3.0, 4.0, 5.0]
    for ours, why in [(wrong, "max|ours-ref| 0.2 > bound 0.141"),
                      (diverging, "max|ours-ref| 4.98 > bound"),
                      ([*ref[:-1], float("nan")], "a loss is not finite")]:  # fmt: skip
        judged = ddp_checks.verdict(ours, stock, ref, GRADS_PASSED)
        assert judged["verdict"] == "failed" and why in judged["reason"], judged
    judged = ddp_checks.verdict(right, stock, ref, GRADS_FAILED)
    assert judged["verdict"] == "failed" and "gradients at step 0" in judged["reason"]
    # without a gradient check the losses decide alone
    assert ddp_checks.verdict(right, stock, ref)["verdict"] == "passed"


def test_overall_status_and_exit_codes():
    passed = {"verdict": "passed", "reason": "every check passed"}
    unsure = {"verdict": "inconclusive", "reason": "the reference run diverged (...)"}
    failed = {"verdict": "failed", "reason": "the losses failed their rule"}
    assert ddp_checks.overall_status({"hidden=4096": passed}) == ("passed", 0)
    assert ddp_checks.overall_status({"hidden=64": {}}) == ("passed", 0)  # no check ran
    status, code = ddp_checks.overall_status({"hidden=4096": passed, "hidden=32768": unsure})
    assert code == ddp_checks.EXIT_INCONCLUSIVE == 4
    assert status == "INCONCLUSIVE: hidden=32768: the reference run diverged (...)"
    status, code = ddp_checks.overall_status({"hidden=4096": failed, "hidden=32768": unsure})
    assert code == ddp_checks.EXIT_FAILED == 1
    assert status == "FAILED: hidden=4096: the losses failed their rule"
    # distinct from the hung step's status and from argparse's 2
    assert len({0, ddp_checks.EXIT_FAILED, ddp_checks.EXIT_INCONCLUSIVE,
                ddp_train.StepWatchdog.EXIT_HUNG, 2}) == 5  # fmt: skip


def test_grad_rule_rejects_a_zero_gradient():
    ref = {"norm": torch.linspace(1, 2, 64)}
    stock = {"norm": ref["norm"] * (1 + 2**-9)}
    assert ddp_checks.compare_norm_grads({"norm": ref["norm"] * (1 - 2**-9)}, stock, ref)["passed"]
    assert not ddp_checks.compare_norm_grads({"norm": torch.zeros(64)}, stock, ref)["passed"]
    with pytest.raises(ValueError, match="norm grads: expected the same"):
        ddp_checks.compare_norm_grads({"other": torch.zeros(64)}, stock, ref)


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
    found = ddp_train.kernel_overlap(events)
    assert found["nccl_kernels"] == 1 and found["norm_kernels"] == 4
    # the dw reduction shares the NCCL kernel's stream: ordered, not beside it
    assert found["norm_kernels_beside_nccl"] == 1
    assert found["norm_kernel_names_beside_nccl"] == ["rmsnorm_bwd_kernel"]
    assert found["compute_us_beside_nccl"] == 10 + 10


def test_the_model_sees_the_norm_it_is_given():
    c = tiny_llama.ModelConfig(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=8, ffn=16,
                               vocab=16, seq=4)  # fmt: skip
    model = tiny_llama.build_model(c, tiny_llama.stock_norm, torch.float32, torch.device("cpu"), 0)
    again = tiny_llama.build_model(c, tiny_llama.ours_norm, torch.float32, torch.device("cpu"), 0)
    norms = [m for m in again.modules() if tiny_llama.is_norm(m)]
    assert len(norms) == 2 * c.layers + 1 and all(
        type(m).__module__.startswith("impls") for m in norms
    )
    # the same initialization whichever the norm
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="heads: expected a multiple of kv_heads=3"):
        tiny_llama.ModelConfig(heads=4, kv_heads=3)


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
    assert entry["verdict"] == "passed" and entry["lr"] == 1e-2  # TINY's --lr
    assert len(entry["norm_grads"]["per_norm"]) == 3  # two in the block, the final one


def test_stock_runs_alone_at_the_default_lr(tmp_path, one_rank):
    """--no-ours: the stock runs and their stability, no check; the lr is the width's default."""
    out = tmp_path / "ddp.json"
    argv = [a for a in TINY if a not in ("--lr", "1e-2")]
    assert ddp_step.main([*argv, "--no-ours", "--out", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["results"].values()
    assert set(entry["runs"]) == {"stock", "reference"} and "verdict" not in entry
    assert entry["lr"] == ddp_step.default_lr(64) == 1e-3
    assert entry["diverged"] == {"stock": None, "reference": None}


def test_a_diverging_reference_makes_the_run_inconclusive(tmp_path, one_rank):
    """At lr 1 every run's loss jumps up at the first step (4.2 -> ~20 on the CPU): the loss
    rule is not judged, the gradient rule still is, the exit status says inconclusive."""
    out = tmp_path / "ddp.json"
    assert ddp_step.main([*TINY, "--lr", "1", "--out", str(out)]) == ddp_checks.EXIT_INCONCLUSIVE
    record = json.loads(out.read_text())
    (entry,) = record["results"].values()
    assert record["status"].startswith("INCONCLUSIVE: hidden=64: the reference run diverged")
    assert entry["verdict"] == "inconclusive" and not entry["passed"]
    assert entry["diverged"]["reference"] is not None and entry["norm_grads"]["passed"]


def _zero_dw_norm(n: int, eps: float):
    """Our norm with its weight's gradient replaced by zeros: the same forward, a wrong dw."""
    norm = tiny_llama.ours_norm(n, eps)
    norm.weight.register_hook(torch.zeros_like)
    return norm


def _wrong_eps_norm(n: int, eps: float):
    return tiny_llama.ours_norm(n, 0.25)


@pytest.mark.parametrize(
    "norm, rejected_by",
    [(_zero_dw_norm, "norm_grads"), (_wrong_eps_norm, "losses")],
    ids=["zero-dw", "wrong-eps"],
)
def test_the_checks_reject_a_wrong_norm(monkeypatch, tmp_path, one_rank, norm, rejected_by):
    """On a stable run (neither yardstick diverged), so the loss rule is judged."""
    monkeypatch.setitem(tiny_llama.NORMS, "ours", norm)
    out = tmp_path / "ddp.json"
    assert ddp_step.main([*TINY, "--out", str(out)]) == 1
    record = json.loads(out.read_text())
    (entry,) = record["results"].values()
    assert record["status"].startswith("FAILED") and not entry[rejected_by]["passed"]
    assert entry["verdict"] == "failed"
    assert entry["diverged"]["reference"] is None and entry["diverged"]["stock"] is None


@pytest.mark.parametrize("norm", [_zero_dw_norm, _wrong_eps_norm], ids=["zero-dw", "wrong-eps"])
def test_a_wrong_dw_fails_a_diverging_run_too(monkeypatch, tmp_path, one_rank, norm):
    """At lr 1 (the reference diverges) the step-0 gradient rule still rejects a wrong norm:
    inconclusive is never the answer for a dw the first step already shows is wrong."""
    monkeypatch.setitem(tiny_llama.NORMS, "ours", norm)
    out = tmp_path / "ddp.json"
    assert ddp_step.main([*TINY, "--lr", "1", "--out", str(out)]) == ddp_checks.EXIT_FAILED
    (entry,) = json.loads(out.read_text())["results"].values()
    assert entry["diverged"]["reference"] is not None
    assert entry["verdict"] == "failed" and not entry["norm_grads"]["passed"]


def test_a_hung_step_aborts_with_a_message():
    code = ("import time; from harness.ddp_train import StepWatchdog; "
            "w = StepWatchdog(5, on_hang=lambda m: print('on_hang ran', flush=True)); "
            "w.arm('run x step 3', 0.2); time.sleep(60)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == ddp_train.StepWatchdog.EXIT_HUNG, done.stderr
    assert "rank 5: STEP HUNG: run x step 3 is still running after 0.2 s" in done.stderr
    assert "on_hang ran" in done.stdout


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="--warmup: expected at least 1"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--warmup", "0"]))
    with pytest.raises(ValueError, match="--step-timeout-s: expected seconds > 0"):
        ddp_step._check_args(ddp_step.parser().parse_args(["--step-timeout-s", "0"]))
