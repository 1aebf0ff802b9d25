"""The tuner (impls/triton_rmsnorm/tuning.py): it times configurations on copies that must run the
same binary as the real launch, leaves the caller's tensors and RNG alone, and picks the faster
of two candidates that differ only in cost."""

from __future__ import annotations

import pytest
import torch

from impls.triton_rmsnorm import direct, kernels, launch, rmsnorm, tuning
from tests.conftest import DEVICE, ON_GPU


def _misaligned(m, n, dtype=torch.bfloat16, offset=1, row_pad=3):
    base = torch.randn(m, n + offset + row_pad, device=DEVICE, dtype=dtype)
    return base[:, offset : offset + n]


def test_copies_keep_layout_alignment_values_and_aliases():
    x = _misaligned(16, 64)
    w = torch.randn(64, device=DEVICE, dtype=torch.float16)[2:]
    args = (x, w, x, 16, 1e-6, None)
    sets = tuning.rotating_arguments(args, l2_bytes=64 * 1024)
    assert len(sets) > 2 and sets[0] is args
    for copy in sets[1:]:
        cx, cw, alias, *rest = copy
        assert alias is cx, "an argument passed twice must stay one tensor"
        assert rest == [16, 1e-6, None]
        for got, want in ((cx, x), (cw, w)):
            assert got.data_ptr() != want.data_ptr()
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
            assert got.data_ptr() % 16 == want.data_ptr() % 16
            assert torch.equal(got, want)


def test_set_count_follows_the_l2_and_the_cap():
    x = torch.zeros(1024, device=DEVICE, dtype=torch.float32)  # 4 KiB
    assert len(tuning.rotating_arguments((x,), l2_bytes=4096)) == 4  # 3 x L2 exceeded
    assert len(tuning.rotating_arguments((x,), l2_bytes=1 << 30)) == tuning.MAX_SETS
    assert len(tuning.rotating_arguments((x,), l2_bytes=0)) == 1


@pytest.mark.parametrize(
    "kernel_name", [name for name in launch._TUNING_KEYS if name in launch._PRUNE]
)
def test_candidates_are_launch_keywords_from_the_pruned_space(kernel_name):
    """What the tuner tries (CPU-checkable: plain Python) is never empty and carries every
    keyword a launch needs."""
    kernel = getattr(kernels, kernel_name)
    x = torch.empty(4096, 4096)
    values = {"X": x, "M": 4096, "rows_per_program": 32}
    args = tuple(values.get(name, 0) for name in kernel.arg_names)
    block_n = launch.SPLIT_BLOCK_N if "_split_" in kernel_name else 4096
    candidates = launch._candidates(kernel_name, args, {"BLOCK_N": block_n})
    assert candidates
    for config in candidates:
        assert {"num_warps", "num_stages"} <= config.keys()


needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the tuner times CUDA graphs: GPU only")


@needs_gpu
def test_the_tuner_picks_the_cheaper_of_two_candidates():
    """Negative control: two candidates, the same kernel once or four times per launch. A timer
    that does not tell them apart (or times the wrong thing) fails here."""
    x = torch.randn(2048, 4096, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(4096, device=DEVICE, dtype=torch.bfloat16)
    y, rstd = torch.empty_like(x), torch.empty(2048, device=DEVICE)
    args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (4096,) * 4, 1e-6, 0.0)

    def run(repeats, launch_args):
        for _ in range(repeats):
            kernels.rmsnorm_fwd_kernel[(2048,)](
                *launch_args, BLOCK_M=1, BLOCK_N=4096, HAS_RESIDUAL=False, num_warps=8
            )

    for order in ([4, 1], [1, 4]):
        assert tuning.fastest(order, run, args) == 1


@needs_gpu
def test_tuning_leaves_inputs_and_rng_alone(monkeypatch):
    monkeypatch.setattr(launch, "_AUTOTUNE", True)
    monkeypatch.setattr(launch, "_TUNED", {})
    x = _misaligned(300, 1000).requires_grad_(True)
    w = torch.randn(1000, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(300, 1000, device=DEVICE, dtype=torch.bfloat16)
    saved = [t.detach().clone() for t in (x, w, dy)]
    rng = torch.cuda.get_rng_state()
    y = rmsnorm(x, w)
    y.backward(dy)
    assert {key[0] for key in launch._TUNED} == {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"}
    assert torch.equal(torch.cuda.get_rng_state(), rng)
    for got, want in zip((x, w, dy), saved, strict=True):
        assert torch.equal(got.detach(), want)


@needs_gpu
def test_an_untuned_key_met_during_capture_is_neither_tuned_nor_replayed(monkeypatch):
    """Nothing can be timed inside a CUDA-graph capture: the heuristic config runs, and the
    next call outside the capture tunes and records."""
    x = torch.randn(256, 2048, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(2048, device=DEVICE, dtype=torch.bfloat16)
    monkeypatch.setattr(launch, "_AUTOTUNE", False)
    with torch.no_grad():
        expected = rmsnorm(x, w)  # compiles the heuristic config outside the capture
    monkeypatch.setattr(launch, "_AUTOTUNE", True)
    monkeypatch.setattr(launch, "_TUNED", {})
    monkeypatch.setattr(launch, "_REPLAYS", {})
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.graph(graph, stream=stream):
        captured = rmsnorm(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert not launch._TUNED and not launch._REPLAYS
    assert torch.equal(captured, expected)
    with torch.no_grad():
        rmsnorm(x, w)
        before = direct.replayed_launches
        rmsnorm(x, w)
    assert launch._TUNED and launch._REPLAYS and direct.replayed_launches == before + 1
