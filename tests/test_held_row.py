"""The held-row forwards: gluon_kernels.rmsnorm_fwd_held_row_kernel (16-bit rows of 65537 to
131072 columns held on one SM in registers and shared memory) and, past it,
rmsnorm_fwd_held_group_kernel (each row held by a group of programs). When the launch offers
them, that they compile for sm_90 (on any machine with Triton's NVIDIA backend), and on an
NVIDIA GPU that they match the oracle."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle import compare, reference
from impls.triton_rmsnorm import common, dispatch, held_launch, held_paths, launch
from tests import sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import H200_FACTS, ON_NVIDIA_GPU, TOL
from tests.helpers import assert_matches_oracle as _assert_matches_oracle
from tests.test_held_row_backward import (
    assert_every_slice_published,
    record_exchanges,
)

WIDEST = launch.HELD_ROW_MAX_N
needs_held_row_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and held_paths.gluon_kernels is not None
        and held_paths._held_row_fits_device(torch.device("cuda"), WIDEST)
    ),
    reason="the held-row forward needs an NVIDIA GPU with 196 KB of shared memory a program and "
    "a Triton with Gluon",
)


def test_launch_offers_it_for_aligned_16_bit_rows_past_the_single_tile(pretend_device, monkeypatch):
    """The decision, with the device's part (shared memory, NVIDIA, not the interpreter) taken
    as given: 16-bit, SINGLE_TILE_MAX_N < N <= HELD_ROW_MAX_N, N a multiple of 8, rows of x and
    y 16-byte aligned, no residual, Gluon present."""
    pretend_device(**H200_FACTS)
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
    monkeypatch.setattr(held_paths, "gluon_kernels", None)
    assert not offered(WIDEST)


def test_device_part_of_the_decision(pretend_device, monkeypatch):
    """Compute capability 9.0 or later, and the shared memory its buffers need: 2 buffers up to
    98304 columns (131 KB), 3 beyond (196 KB)."""
    cuda = torch.device("cuda", 0)
    assert not held_paths._held_row_fits_device(torch.device("cpu"), WIDEST)
    for capability, shared, n, fits in [
        ((9, 0), 232448, WIDEST, True),
        ((9, 0), 166912, WIDEST, False),
        ((9, 0), 166912, 98304, True),
        ((8, 0), 232448, 98304, False),
    ]:
        pretend_device(capability=capability, shared_bytes_per_block=shared)
        assert held_paths._held_row_fits_device(cuda, n) is fits, (capability, shared, n)


def _offered_forward_paths(monkeypatch, n: int, **decisions) -> list:
    """The paths offered to the forward's dispatch for [4, n] when each decision named answers
    as given (launch's function of that name replaced; the others none)."""
    monkeypatch.setattr(launch, "forward_holds_row_on_chip", lambda *args: False)
    monkeypatch.setattr(launch, "held_group_forwards", lambda *args: ())
    for name, answer in decisions.items():
        monkeypatch.setattr(launch, name, lambda *args, answer=answer: answer)
    x = torch.zeros(4, n, dtype=torch.bfloat16, device=DEVICE)
    return [launch.forward_paths(x, x, x[0], False)]


def test_forward_measures_it_beside_the_default_path(monkeypatch):
    """Where it is offered, the forward's first call measures it against the default path
    (looped or split) rather than taking it blindly."""
    offered = _offered_forward_paths(monkeypatch, WIDEST, forward_holds_row_on_chip=True)
    assert offered == [
        [*launch._forward_paths(4, WIDEST, torch.device(DEVICE)), launch._forward_held_row]
    ]


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
    if held_paths.gluon_kernels is None:
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
def test_held_row_forward_matches_the_oracle(force_paths, shape, dtype, w_dtype, out_dtype):
    """Forced (the forward's only path), then the backward as usual."""
    force_paths(forward="held_row")
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy, out_dtype=out_dtype)
    assert "rmsnorm_fwd_held_row_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
def test_held_row_forward_with_strided_rows(force_paths):
    """Rows of a wider tensor (a 16-byte-aligned row stride): the kernel takes x's stride."""
    force_paths(forward="held_row")
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


# ---- rows wider than one SM holds: a group of programs a row ---------------------------------

GROUPED = 2 * WIDEST
CONFIGS = held_paths.HELD_GROUP_FORWARDS
CONFIG_IDS = [f"{c.slice_n}-column slices" for c in CONFIGS]


def test_launch_offers_the_group_past_the_single_tile(pretend_device, monkeypatch):
    """Past SINGLE_TILE_MAX_N (beside the held row up to HELD_ROW_MAX_N): 16-bit x and w, N a
    multiple of 8, x's and y's rows and w on 16 bytes, no residual, Gluon present; every
    configuration the device fits (here all: the device's part taken as given)."""
    pretend_device(**H200_FACTS)
    bf16 = torch.bfloat16

    def offered(n, dtype=bf16, w_dtype=bf16, has_residual=False, width=None, start=0, w_start=0):
        x = torch.zeros(2, width or n, dtype=dtype)[:, start : start + n]
        y = torch.empty(2, n, dtype=dtype)
        w = torch.zeros(n + 8, dtype=w_dtype)[w_start : w_start + n]
        configs = launch.held_group_forwards(x, y, w, has_residual)
        assert configs in ((), CONFIGS)
        return bool(configs)

    assert offered(GROUPED) and offered(WIDEST + 16) and offered(2**20)
    assert offered(WIDEST) and offered(launch.SINGLE_TILE_MAX_N + 16)  # beside the held row
    assert offered(GROUPED, torch.float16) and offered(GROUPED, w_dtype=torch.float16)
    assert offered(GROUPED - 64, width=GROUPED)  # strided rows, aligned
    assert not offered(launch.SINGLE_TILE_MAX_N)  # the single tile holds it in registers
    assert not offered(GROUPED, torch.float32)
    assert not offered(GROUPED, w_dtype=torch.float32)  # w is staged 16-bit
    assert not offered(GROUPED, has_residual=True)
    assert not offered(GROUPED - 4)
    assert not offered(GROUPED - 64, width=GROUPED + 8)  # rows not 16-byte aligned
    assert not offered(GROUPED - 64, width=GROUPED, start=4)  # x's data 8 bytes off
    assert not offered(GROUPED - 64, w_start=4)  # w's 8 bytes off
    monkeypatch.setattr(held_paths, "gluon_kernels", None)
    assert not offered(GROUPED)


def test_launch_offers_the_configurations_the_device_fits(pretend_device, monkeypatch):
    """Each configuration on its own: one the device does not fit is left out."""
    pretend_device(inline_ptx=True)
    x = torch.zeros(2, GROUPED, dtype=torch.bfloat16)
    for fitting in CONFIGS:
        monkeypatch.setattr(held_paths, "_held_group_forward_fits_device",
                            lambda device, n, c, fitting=fitting: c == fitting)  # fmt: skip
        assert launch.held_group_forwards(x, x, x[0], False) == (fitting,)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_device_part_of_the_group_forward_decision(pretend_device, monkeypatch, config):
    """Compute capability 9.0 or later, the shared memory of a program (its ring slots and w's
    slice, with the scratch), and a program slot for every slice of a row at up to the
    configuration's programs an SM (as many as the SM's shared memory holds)."""
    assert not held_paths._held_group_forward_fits_device(torch.device("cpu"), GROUPED, config)
    cuda = torch.device("cuda", 0)
    pretend_device(sm_count=132)
    shared = launch._held_group_forward_shared_bytes(config)
    assert shared == (config.ring + 1) * config.slice_n * 2 + launch.HELD_ROW_SCRATCH_BYTES
    every_slot = config.per_sm * 132 * config.slice_n
    for capability, block, per_sm, n, fits in [
        ((9, 0), 232448, config.per_sm, GROUPED, True),
        ((9, 0), 232448, config.per_sm, every_slot, True),
        ((9, 0), 232448, config.per_sm, every_slot + 8, False),  # a slice more than slots
        ((9, 0), 232448, config.per_sm - 1, every_slot, False),
        ((9, 0), shared, config.per_sm, GROUPED, True),
        ((9, 0), shared - 1, config.per_sm, GROUPED, False),
        ((8, 0), 232448, config.per_sm, GROUPED, False),
    ]:
        pretend_device(capability=capability, shared_bytes_per_block=block)
        monkeypatch.setattr(held_paths, "_held_group_forward_programs_per_sm",
                            lambda i, c, p=per_sm: p)  # fmt: skip
        assert held_paths._held_group_forward_fits_device(cuda, n, config) is fits, (block, n)


def test_programs_an_sm_follow_its_shared_memory(pretend_device):
    """Each configuration's programs an SM (6 and 4) where 228 KB an SM holds them (the H100's
    and H200's), fewer where less (each pretend_device call forgets the cached answers)."""

    def per_sm() -> list[int]:
        return [held_paths._held_group_forward_programs_per_sm(0, c) for c in CONFIGS]

    pretend_device(shared_bytes_per_sm=233472)
    assert per_sm() == [6, 4]
    pretend_device(shared_bytes_per_sm=167936)  # 164 KB: the A100's
    assert per_sm() == [4, 3]


@pytest.mark.parametrize("n", [GROUPED, WIDEST], ids=["past the held row", "beside it"])
def test_forward_measures_the_group_beside_the_other_paths(monkeypatch, n):
    """Where it is offered, the forward's first call measures each configuration against the
    default path (and the held row, where that is offered too)."""
    offered = _offered_forward_paths(monkeypatch, n, forward_holds_row_on_chip=n <= WIDEST,
                                     held_group_forwards=CONFIGS)  # fmt: skip
    default = launch._forward_paths(4, n, torch.device(DEVICE))
    held_row = [launch._forward_held_row] if n <= WIDEST else []
    groups = [launch._held_group_forward_path(c) for c in CONFIGS]
    assert offered == [[*default, *held_row, *groups]]
    assert groups[0] is launch._held_group_forward_path(CONFIGS[0])  # one object: keys hold it


def test_held_group_forward_compiles_for_sm90():
    """Compiled for sm_90 (no GPU) in each configuration: relaxed 64-bit exchanges, adds and
    volatile loads as the grouped backward's (test_held_group_backward_compiles_for_sm90: sums,
    tickets, claims and links), no acquire or release, and no barrier from the poll loop through the fallback
    where a row has up to 32 words (a program's warps may part there; past 32 their reductions
    cross warps); 16-byte copies and stores (4 vectors of a 16-bit
    slice a thread in both: 4096 columns over 4 warps, 8192 over 8; staged for w, each ring
    slot, and a slot restaged a row; y stored)."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    if held_paths.gluon_kernels is None:
        pytest.skip("this Triton has no Gluon")
    assert [(c.slice_n, c.ring, c.warps) for c in CONFIGS] == [(4096, 3, 4), (8192, 2, 8)]
    widths = (("bf16", GROUPED), ("fp16", launch.SINGLE_TILE_MAX_N + 16),
              ("bf16", GROUPED), ("fp16", WIDEST + 16))  # fmt: skip
    cases = [{"kernel": "held_group_fwd", "x": x, "block_n": n, "config": i // 2}
             for i, (x, n) in enumerate(widths)]  # fmt: skip
    expected = [{"relaxed exchanges": 4, "relaxed adds": 3, "acquires or releases": 0,
                 "volatile loads": 10, "staged vectors": 4 * (1 + ring + 1), "vector stores": 4}
                for ring in (3, 3, 2, 2)]  # fmt: skip
    found = sm90_compile.run(cases)
    assert [{k: f[k] for k in expected[0]} for f in found] == expected
    # registers capped so that 6 programs of 4 warps, or 4 of 8, share an SM's 64K
    assert [f["register cap"] for f in found] == [80, 80, 64, 64]
    # bf16 upcast in pairs (gluon_common._upcast_pairs), fp16 by Triton's own conversion
    assert [(f["bf16"], f["fp16"]) for f in found] == [(True, False), (False, False)] * 2
    # 64 words a row (4096-column slices of 262144): shared reductions; 17-32: none
    barriers = [f["barriers from the polls through the fallback"] for f in found]
    assert barriers[0] > 0 and barriers[1:] == [0, 0, 0]


def _force_group(force_paths, config) -> None:
    """The grouped forward in this configuration the call's only path."""
    force_paths(forward=dispatch.path_name(launch._held_group_forward_path(config)))


needs_group_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and held_paths.gluon_kernels is not None
        and all(
            held_paths._held_group_forward_fits_device(torch.device("cuda"), GROUPED, c)
            for c in CONFIGS
        )
    ),
    reason="the grouped held-row forward needs a Hopper-class NVIDIA GPU with the shared "
    "memory of each configuration (6 programs of 36 KB an SM, 4 of 52 KB) and a Triton with Gluon",
)
group_config = pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)


def _every_slot(config) -> int:
    """Columns whose slices fill every program slot of the GPU: one group, the whole grid."""
    per_sm = held_paths._held_group_forward_programs_per_sm(0, config)
    return per_sm * common._sm_count(0) * config.slice_n


@needs_group_gpu
@group_config
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((300, GROUPED), torch.bfloat16),  # 32 programs a row, several rows a group
        ((64, GROUPED), torch.float16),
        ((3, 2**20), torch.bfloat16),  # fewer rows than groups
        ((40, WIDEST + 8192 + 16), torch.bfloat16),  # the last slice holds 16 columns
        ((200, WIDEST), torch.bfloat16),  # where the held row also serves
        ((64, 65552), torch.float16),  # just past the single tile: 16 columns in the last slice
        ((2, 5, 2**20), torch.bfloat16),  # 128 programs a row, leading dims
        ((1, GROUPED), torch.float16),  # one row
        ((50, 200016), torch.bfloat16),  # a masked last slice, N not a power of two
        ((2, "every slot"), torch.bfloat16),  # one group of every program slot
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, str(p)),
)
def test_held_group_forward_matches_the_oracle(force_paths, config, shape, dtype):
    _force_group(force_paths, config)
    shape = tuple(_every_slot(config) if d == "every slot" else d for d in shape)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    assert "rmsnorm_fwd_held_group_kernel" in launch.take_launch_configs()


@needs_group_gpu
@group_config
@pytest.mark.parametrize(
    "spin_limit, tag_offset",
    [(0, 1), (8, 1), (0, 0), (1, 0)],
    ids=["never complete, no polls", "never complete, 8 polls", "no polls", "1 poll"],
)
def test_held_group_forward_falls_back_on_every_row(
    force_paths, monkeypatch, config, spin_limit, tag_offset
):
    """Readers that look for tags one past the writers' never find a group complete: every
    program, once its polls are spent, sums every row alone from global memory and still
    publishes its own sums. With the writers' tags and no poll or one, whether a row is
    complete when first read is a race, which a program's warps (polling on their own) may see
    differently: those that fall back must not stall those that do not (no barrier where they
    part). Either way y and rstd match the reference, and the
    exchange shows every program's sum on every row."""
    _force_group(force_paths, config)
    monkeypatch.setattr(held_launch, "HELD_GROUP_SPIN_LIMIT", spin_limit)
    monkeypatch.setattr(held_launch, "HELD_GROUP_TAG_OFFSET", tag_offset)
    exchanges = record_exchanges(monkeypatch)
    inputs = make_inputs((300, GROUPED), torch.bfloat16, DEVICE)
    y, rstd, _ = launch.rmsnorm_forward(inputs.x, inputs.weight, 1e-5)
    ref = reference(inputs.x, inputs.weight, 1e-5, inputs.dy)
    report = compare("y", y, ref.y, y.dtype, TOL["y"], GROUPED)
    assert report.passed, report.summary()
    rstd_ref = torch.rsqrt(inputs.x.double().pow(2).mean(1) + 1e-5)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-6, atol=0)
    assert len(exchanges) == 1
    assert_every_slice_published(exchanges[0], 300, launch.cdiv(GROUPED, config.slice_n))


@needs_group_gpu
@group_config
@pytest.mark.parametrize(
    "w_dtype, out_dtype, offset",
    [(torch.float16, None, 0.0), (torch.bfloat16, torch.float32, 0.0),
     (torch.bfloat16, None, 1.0)],
    ids=["fp16 w", "fp32 y", "Gemma's offset"],
)  # fmt: skip
def test_held_group_forward_weights_outputs_and_offset(
    force_paths, config, w_dtype, out_dtype, offset
):
    """An fp16 w with bf16 x (staged in its own dtype), an fp32 y, and w + 1 (Gemma's)."""
    _force_group(force_paths, config)
    inputs = make_inputs((100, GROUPED), torch.bfloat16, DEVICE)
    w = inputs.weight if offset == 0.0 else 0.1 * inputs.weight
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, w.to(w_dtype), inputs.dy, out_dtype=out_dtype,
                           offset=offset)  # fmt: skip
    assert "rmsnorm_fwd_held_group_kernel" in launch.take_launch_configs()


@needs_group_gpu
@group_config
def test_held_group_forward_with_strided_rows(force_paths, config):
    """Rows of a wider tensor (a 16-byte-aligned row stride): the kernel takes x's stride."""
    _force_group(force_paths, config)
    n = GROUPED - 64
    wide = make_inputs((150, GROUPED), torch.float16, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(wide.x[:, :n], wide.weight[:n].contiguous(), wide.dy[:, :n])
    assert "rmsnorm_fwd_held_group_kernel" in launch.take_launch_configs()


@needs_group_gpu
def test_held_group_forward_fp32_weight_takes_the_default_path():
    """w is staged 16-bit: an fp32 w leaves the rows to the looped path, which matches the
    oracle."""
    inputs = make_inputs((300, GROUPED), torch.bfloat16, DEVICE)  # not split: looped
    w = inputs.weight.float()
    assert launch.held_group_forwards(inputs.x, inputs.x, w, False) == ()
    assert launch.held_group_forwards(inputs.x, inputs.x, inputs.weight, False) == CONFIGS
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, w, inputs.dy)
    launched = launch.take_launch_configs()
    assert "rmsnorm_fwd_looped_kernel" in launched
    assert "rmsnorm_fwd_held_group_kernel" not in launched
