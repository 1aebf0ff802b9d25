"""The held-row forward (gluon_kernels.rmsnorm_fwd_held_row_kernel): 16-bit rows of 65537 to
131072 columns held on one SM in registers and shared memory. When the launch offers it, that
it compiles for sm_90 (on any machine with Triton's NVIDIA backend), and on an NVIDIA GPU that
it matches the oracle."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import launch
from tests import sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.test_triton_features import _assert_matches_oracle

WIDEST = launch.HELD_ROW_MAX_N
ON_NVIDIA_GPU = DEVICE == "cuda" and torch.version.hip is None
needs_held_row_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and launch.gluon_kernels is not None
        and launch._held_row_fits_device(torch.device("cuda"), WIDEST)
    ),
    reason="the held-row forward needs an NVIDIA GPU with 196 KB of shared memory a program and "
    "a Triton with Gluon",
)


def test_launch_offers_it_for_aligned_16_bit_rows_past_the_single_tile(monkeypatch):
    """The decision, with the device's part (shared memory, NVIDIA, not the interpreter) taken
    as given: 16-bit, SINGLE_TILE_MAX_N < N <= HELD_ROW_MAX_N, N a multiple of 8, rows of x and
    y 16-byte aligned, no residual, Gluon present."""
    monkeypatch.setattr(launch, "_inline_ptx_runs", lambda: True)
    monkeypatch.setattr(launch, "_held_row_fits_device", lambda device, n: True)
    bf16 = torch.bfloat16

    def offered(n, dtype=bf16, has_residual=False, width=None, start=0):
        x = torch.zeros(2, width or n, dtype=dtype)[:, start : start + n]
        y = torch.empty(2, n, dtype=dtype)
        return launch.forward_holds_row_on_chip(x, y, has_residual)

    assert offered(WIDEST) and offered(launch.SINGLE_TILE_MAX_N + 16)
    assert offered(WIDEST, torch.float16)
    assert offered(WIDEST - 32, width=WIDEST)  # strided rows, aligned
    assert not offered(launch.SINGLE_TILE_MAX_N)  # the single tile holds it in registers
    assert not offered(WIDEST + 16)
    assert not offered(WIDEST, torch.float32)
    assert not offered(WIDEST, has_residual=True)
    assert not offered(WIDEST - 4)  # copies move 8 elements at a time
    assert not offered(WIDEST - 32, width=WIDEST + 8)  # rows not 16-byte aligned
    assert not offered(WIDEST - 32, width=WIDEST, start=4)  # x's data 8 bytes off a 16-byte line
    monkeypatch.setattr(launch, "gluon_kernels", None)
    assert not offered(WIDEST)


def test_device_part_of_the_decision(monkeypatch):
    """Compute capability 9.0 or later, and the shared memory its buffers need: 2 buffers up to
    98304 columns (131 KB), 3 beyond (196 KB)."""
    cuda = torch.device("cuda", 0)
    assert not launch._held_row_fits_device(torch.device("cpu"), WIDEST)
    for capability, shared, n, fits in [
        ((9, 0), 232448, WIDEST, True),
        ((9, 0), 166912, WIDEST, False),
        ((9, 0), 166912, 98304, True),
        ((8, 0), 232448, 98304, False),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        monkeypatch.setattr(launch, "_shared_bytes_per_block", lambda index, s=shared: s)
        assert launch._held_row_fits_device(cuda, n) is fits, (capability, shared, n)


def test_forward_measures_it_beside_the_default_path(monkeypatch):
    """Where it is offered, the forward's first call measures it against the default path
    (looped or split) rather than taking it blindly."""
    monkeypatch.setattr(launch, "forward_holds_row_on_chip", lambda x, y, has_residual: True)
    monkeypatch.setattr(launch, "autotuning", lambda: True)
    monkeypatch.setattr(launch, "_REPLAYABLE", False)
    offered = []

    def measured(key, paths, args, device):
        offered.append(list(paths))
        return lambda *args: None

    monkeypatch.setattr(launch, "_measured_path", measured)
    x = torch.zeros(4, WIDEST, dtype=torch.bfloat16, device=DEVICE)
    launch.rmsnorm_forward(x, x[0], 1e-6)
    assert offered == [[*launch._forward_paths(4, WIDEST, x.device), launch._forward_held_row]]


_COMPILED_CASES = [
    ({"x": "bf16", "block_n": WIDEST}, {"bf16": True, "fp16": False, "cp.async": True}),
    ({"x": "fp16", "block_n": WIDEST}, {"bf16": False, "fp16": True, "cp.async": True}),
    ({"x": "bf16", "block_n": launch.SINGLE_TILE_MAX_N + 16}, {"bf16": True, "fp16": False,
                                                              "cp.async": True}),
]  # fmt: skip


def test_held_row_kernel_compiles_for_sm90():
    """Gluon kernels cannot run under the interpreter, so CI compiles this one for sm_90 (no
    GPU): its copies into shared memory are cp.async, its second upcast the inline one, and it
    compiles with the Gluon of the Triton installed (whose copy call changed name after 3.6)."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    if launch.gluon_kernels is None:
        pytest.skip("this Triton has no Gluon")
    cases = [{"kernel": "held_row", "warps": launch.HELD_ROW_WARPS, **case}
             for case, _ in _COMPILED_CASES]  # fmt: skip
    found = sm90_compile.run(cases)
    assert found == [expected for _, expected in _COMPILED_CASES]


@needs_held_row_gpu
@pytest.mark.parametrize(
    "shape, dtype, w_dtype, out_dtype",
    [
        ((300, WIDEST), torch.bfloat16, torch.bfloat16, None),  # programs walk several rows
        ((5, WIDEST), torch.float16, torch.float16, None),  # fewer rows than SMs
        ((200, launch.SINGLE_TILE_MAX_N + 16), torch.bfloat16, torch.bfloat16, None),  # masked
        ((150, 100000), torch.float16, torch.float32, None),
        ((140, WIDEST), torch.bfloat16, torch.bfloat16, torch.float32),
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, "same"),
)
def test_held_row_forward_matches_the_oracle(monkeypatch, shape, dtype, w_dtype, out_dtype):
    """Forced (the only forward path offered), then the backward as usual."""
    monkeypatch.setattr(launch, "_forward_paths", lambda m, n, device: [])
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy, out_dtype=out_dtype)
    assert "rmsnorm_fwd_held_row_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
def test_held_row_forward_with_strided_rows(monkeypatch):
    """Rows of a wider tensor (a 16-byte-aligned row stride): the kernel takes x's stride."""
    monkeypatch.setattr(launch, "_forward_paths", lambda m, n, device: [])
    n = WIDEST - 64
    wide = make_inputs((200, WIDEST), torch.bfloat16, DEVICE)
    x = wide.x[:, :n]
    assert x.stride(0) == WIDEST
    assert launch.forward_holds_row_on_chip(
        x, torch.empty_like(x, memory_format=torch.contiguous_format), False
    )
    launch.take_launch_configs()
    _assert_matches_oracle(x, wide.weight[:n].contiguous(), wide.dy[:, :n])
    assert "rmsnorm_fwd_held_row_kernel" in launch.take_launch_configs()
