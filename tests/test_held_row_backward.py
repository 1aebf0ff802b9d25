"""The held-row backward (gluon_kernels.rmsnorm_bwd_held_row_kernel): 16-bit rows of 16385 to
32768 columns, each staged whole in shared memory and read from HBM once. When the launch
offers it, how large its ring is, that it compiles for sm_90 (on any machine with Triton's
NVIDIA backend), and on an NVIDIA GPU that it matches the oracle."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import backward_launch, dispatch, held_launch, held_paths, launch
from impls.triton_rmsnorm.paths import Path
from tests import sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import H200_FACTS, ON_NVIDIA_GPU
from tests.helpers import assert_matches_oracle as _assert_matches_oracle
from tests.helpers import check_residual as _check_residual

WIDEST = launch.HELD_BACKWARD_MAX_N
NARROWEST = launch.BACKWARD_SINGLE_TILE_MAX_N + 16
#: Shared memory a program may ask for on the H100 and H200.
HOPPER_SHARED = 232448
needs_held_row_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and held_paths.gluon_kernels is not None
        and torch.cuda.get_device_capability() >= (9, 0)
        and launch._held_backward_ring(WIDEST, torch.device("cuda")) > 0
    ),
    reason="the held-row backward needs a Hopper-class NVIDIA GPU with 227 KB of shared memory "
    "a program and a Triton with Gluon",
)


def test_launch_offers_it_for_aligned_16_bit_rows_past_the_single_tile(pretend_device, monkeypatch):
    """16-bit x, dy and w, BACKWARD_SINGLE_TILE_MAX_N < N <= HELD_BACKWARD_MAX_N, N a multiple
    of 16, every row and w on 16 bytes (dh_out's too), Gluon present."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32

    def offered(n, x_dtype=bf16, dy_dtype=None, w_dtype=None, width=None, start=0, dh=None):
        x = torch.zeros(2, width or n, dtype=x_dtype)[:, start : start + n]
        dy = torch.zeros(2, n, dtype=dy_dtype or x_dtype)
        w = torch.zeros(n, dtype=w_dtype or x_dtype)
        return launch.backward_holds_row_on_chip(x, dy, w, dh)

    pretend_device(**H200_FACTS)
    assert offered(WIDEST) and offered(NARROWEST) and offered(WIDEST, fp16)
    assert offered(WIDEST, bf16, fp16, fp16)  # any 16-bit dtypes
    assert offered(WIDEST - 64, width=WIDEST)  # strided rows, aligned
    assert offered(WIDEST, dh=torch.zeros(2, WIDEST, dtype=fp32))  # dh_out read, not staged
    assert not offered(launch.BACKWARD_SINGLE_TILE_MAX_N)  # the single tile takes it
    assert not offered(WIDEST + 16)
    assert not offered(WIDEST, fp32) and not offered(WIDEST, bf16, fp32)
    assert not offered(WIDEST, w_dtype=fp32)  # w is staged in shared memory as 16-bit
    assert not offered(WIDEST - 8)  # row strides must divide by 16 elements
    assert not offered(WIDEST - 64, width=WIDEST - 8)
    assert not offered(WIDEST - 64, width=WIDEST, start=4)  # x 8 bytes off a 16-byte line
    assert not offered(WIDEST, dh=torch.zeros(2, WIDEST + 8)[:, :WIDEST])
    x = torch.zeros(2, WIDEST, dtype=bf16)
    w = torch.zeros(WIDEST, dtype=bf16)
    off_line = torch.zeros(2 * WIDEST + 4, dtype=bf16)[4:]  # 8 bytes off a 16-byte line
    assert not launch.backward_holds_row_on_chip(x, x, off_line[:WIDEST], None)  # w
    assert not launch.backward_holds_row_on_chip(x, off_line.view(2, WIDEST), w, None)  # dy
    dy_rows_8_apart = torch.zeros(2, WIDEST + 8, dtype=bf16)[:, :WIDEST]
    assert not launch.backward_holds_row_on_chip(x, dy_rows_8_apart, w, None)
    assert launch.backward_holds_row_on_chip(x, x, w, None)
    monkeypatch.setattr(held_paths, "gluon_kernels", None)
    assert not offered(WIDEST)


def test_device_part_of_the_decision(pretend_device, monkeypatch):
    """A CUDA device of compute capability 9.0 or later whose shared memory takes w and at least
    a row's ring slots (16 KB of x and 16 KB of dy a slot); the ring takes the most that fit."""
    assert not held_paths._held_row_backward_fits_device(torch.device("cpu"), WIDEST)
    cuda = torch.device("cuda", 0)
    for capability, shared, n, ring, fits in [
        ((9, 0), HOPPER_SHARED, WIDEST, 4, True),  # 4 x 32 KB beside 64 KB of w
        ((9, 0), HOPPER_SHARED, 24576, 5, True),
        ((9, 0), HOPPER_SHARED, NARROWEST, 5, True),
        ((9, 0), 166912, WIDEST, 0, False),  # 163 KB (the A100's): not even a row
        ((9, 0), 166912, 20480, 3, True),
        ((8, 0), HOPPER_SHARED, WIDEST, 4, False),
    ]:
        pretend_device(capability=capability, shared_bytes_per_block=shared)
        assert launch._held_backward_ring(n, cuda) == ring, (shared, n)
        assert held_paths._held_row_backward_fits_device(cuda, n) is fits, (capability, shared, n)


def test_backward_offers_it_beside_the_wide_path(monkeypatch):
    """Where it is offered, the backward's dispatch chooses between it (at 16 and at 32 warps)
    and the wide path (the default, first); where not, the wide path is the only one."""
    x = torch.zeros(4, WIDEST, dtype=torch.bfloat16)
    monkeypatch.setattr(launch, "backward_holds_row_on_chip", lambda *a: True)
    assert launch.backward_paths(x, x, x[0], None) == [
        launch._backward_wide,
        *launch._HELD_ROW_BACKWARDS,
    ]
    assert [p.settings["warps"] for p in launch._HELD_ROW_BACKWARDS] == [16, 32]
    assert launch.backward_paths(x[:, :1024], x[:, :1024], x[0, :1024], None) == [
        launch._backward_single_tile
    ]
    monkeypatch.setattr(launch, "backward_holds_row_on_chip", lambda *a: False)
    assert launch.backward_paths(x, x, x[0], None) == [launch._backward_wide]


def test_backward_measures_the_group_where_the_row_fills_its_slices(pretend_device, monkeypatch):
    """At the held row's widths the grouped backward is measured beside it in each
    configuration whose slices the row fills whole (24576 columns: 8192-column slices; 32768:
    8192 and 16384) and that the device fits; not where the last slice is part-filled (with
    16384-column slices it measured 0.64-0.88x there)."""
    bf16 = torch.bfloat16
    monkeypatch.setattr(launch, "backward_holds_row_on_chip", lambda *a: True)
    pretend_device(**H200_FACTS)  # the grouped configurations fit the device
    held = [launch._backward_wide, *launch._HELD_ROW_BACKWARDS]

    def offered(n):
        x = torch.zeros(2, n, dtype=bf16)
        return launch.backward_paths(x, x, x[0], None)

    narrow, wide = (launch._held_group_backward_path(c) for c in launch.HELD_GROUP_BACKWARDS)
    assert [c.slice_n for c in launch.HELD_GROUP_BACKWARDS] == [WIDEST // 4, WIDEST // 2]
    assert offered(WIDEST) == [*held, narrow, wide]
    assert offered(24576) == [*held, narrow]
    assert offered(WIDEST - 16) == held
    assert offered(20480) == held
    assert offered(NARROWEST) == held
    pretend_device(capability=(8, 0))  # not Hopper-class: no grouped configuration fits
    assert offered(WIDEST) == held


#: (x dtype, tile width, warps, with dh_out) -> 16-byte copies and 16-byte stores in the PTX. A
#: thread holds v 16-byte vectors of a 16-bit chunk (8192 columns over 32 x warps threads: v = 2
#: at 16 warps, 1 at 32) and 2v of an fp32 one. Copies: x and dy into the ring's first slots
#: (RING: 4 at 4 chunks, 5 at 3), w's chunks, x and dy of each chunk once the second pass is done
#: with it; stores: dx a chunk, and the dw partials at the end.
_COMPILED_CASES = [
    (("bf16", WIDEST, 16, False), {"staged vectors": 2 * (2 * 4 + 4 + 2 * 4),
                                   "vector stores": 2 * 4 + 4 * 4}),
    (("fp16", WIDEST, 32, True), {"staged vectors": 2 * 4 + 4 + 2 * 4,
                                  "vector stores": 4 + 2 * 4}),
    (("bf16", 24576, 16, False), {"staged vectors": 2 * (2 * 5 + 3 + 2 * 3),
                                  "vector stores": 2 * 3 + 4 * 3}),
]  # fmt: skip


def test_held_row_backward_compiles_for_sm90():
    """Gluon kernels cannot run under the interpreter, so CI compiles this one for sm_90 (no
    GPU), with the Gluon of the Triton installed: every copy into shared memory a 16-byte
    cp.async, every dx and dw store a 16-byte vector."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    if held_paths.gluon_kernels is None:
        pytest.skip("this Triton has no Gluon")
    cases = [{"kernel": "held_row_bwd", "x": x, "block_n": n, "warps": warps, "extra": dh}
             for (x, n, warps, dh), _ in _COMPILED_CASES]  # fmt: skip
    found = sm90_compile.run(cases)
    assert [{k: f[k] for k in ("staged vectors", "vector stores")} for f in found] == [
        expected for _, expected in _COMPILED_CASES
    ]
    # bf16 upcast in pairs (gluon_common._upcast_pairs), fp16 by Triton's own conversion
    assert [(f["bf16"], f["fp16"]) for f in found] == [
        (x == "bf16", False) for (x, _, _, _), _ in _COMPILED_CASES
    ]


def _force_held(force_paths, warps_index: int) -> None:
    """The held row at that warp count as the backward's only path."""
    force_paths(backward=dispatch.path_name(launch._HELD_ROW_BACKWARDS[warps_index]))


@needs_held_row_gpu
@pytest.mark.parametrize(
    "shape, dtype, warps_index",
    [
        ((300, WIDEST), torch.bfloat16, 0),  # programs walk several rows
        ((300, WIDEST), torch.float16, 1),
        ((5, WIDEST), torch.bfloat16, 0),  # fewer rows than SMs
        ((200, NARROWEST), torch.bfloat16, 0),  # 3 chunks, the last 16 columns of the row
        ((2, 140, 24576), torch.float16, 0),  # leading dims flattened, 3 whole chunks
        ((1001, 20480), torch.bfloat16, 1),  # 8 rows a program, the last with 1 on 132 SMs
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, str(p)),
)
def test_held_row_backward_matches_the_oracle(force_paths, shape, dtype, warps_index):
    _force_held(force_paths, warps_index)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    assert "rmsnorm_bwd_held_row_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
def test_held_row_backward_with_strided_rows_and_mixed_16_bit_dtypes(force_paths):
    """Rows of a wider tensor (the kernel takes x's stride), an fp16 dy with bf16 x and w."""
    _force_held(force_paths, 0)
    n = WIDEST - 64
    wide = make_inputs((200, WIDEST), torch.bfloat16, DEVICE)
    x = wide.x[:, :n]
    assert x.stride(0) == WIDEST
    launch.take_launch_configs()
    _assert_matches_oracle(x, wide.weight[:n].contiguous(), wide.dy[:, :n].half())
    assert "rmsnorm_bwd_held_row_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
@pytest.mark.parametrize("warps_index", [0, 1], ids=["16 warps", "32 warps"])
def test_held_row_backward_with_gemmas_offset(force_paths, warps_index):
    """w + 1 (Gemma's offset), added to w in both passes."""
    _force_held(force_paths, warps_index)
    inputs = make_inputs((300, WIDEST), torch.bfloat16, DEVICE)
    w = (0.1 * torch.randn(WIDEST)).to(DEVICE, torch.bfloat16)
    _assert_matches_oracle(inputs.x, w, inputs.dy, offset=1.0)


@needs_held_row_gpu
@pytest.mark.parametrize(
    "dtype, warps_index",
    [(torch.bfloat16, 0), (torch.float16, 0), (torch.bfloat16, 1)],
    ids=["bf16", "fp16", "bf16, 32 warps"],
)
def test_held_row_backward_with_a_residual(force_paths, dtype, warps_index):
    """The residual's gradient dh_out added to dx (HAS_DH_OUT): h, y, dx, dr, dw."""
    _force_held(force_paths, warps_index)
    launch.take_launch_configs()
    _check_residual((150, WIDEST), dtype)
    assert "rmsnorm_bwd_held_row_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
def test_held_row_backward_fp32_weight_takes_the_wide_path():
    """w is staged as 16-bit (an fp32 w would leave too few ring slots at 32768 columns): the
    wide path serves an fp32 w."""
    inputs = make_inputs((300, WIDEST), torch.bfloat16, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.float(), inputs.dy)
    assert "rmsnorm_bwd_held_row_kernel" not in launch.take_launch_configs()


# ---- rows wider than one SM holds: a group of programs a row ---------------------------------

GROUPED = 2 * WIDEST
#: The slice of the default (first) configuration, which the tests force.
SLICE = launch.HELD_GROUP_BACKWARDS[0].slice_n


def test_launch_offers_the_group_past_the_held_row(pretend_device, monkeypatch):
    """Past HELD_BACKWARD_MAX_N, under the same conditions on the tensors as the held row, the
    grouped held row (and the wide path first)."""
    bf16 = torch.bfloat16
    pretend_device(**H200_FACTS)

    def offered(n, w_dtype=bf16, width=None):
        x = torch.zeros(2, width or n, dtype=bf16)[:, :n]
        return launch.backward_holds_row_in_group(x, x, torch.zeros(n, dtype=w_dtype), None)

    assert offered(GROUPED) and offered(WIDEST + 16) and offered(2**20)
    assert offered(GROUPED - 64, width=GROUPED)
    assert not offered(WIDEST)  # one program holds it
    assert not offered(GROUPED, torch.float32)
    assert not offered(GROUPED - 8)
    x = torch.zeros(2, GROUPED, dtype=bf16)
    assert launch.backward_paths(x, x, x[0], None) == [
        launch._backward_wide,
        *(launch._held_group_backward_path(c) for c in launch.HELD_GROUP_BACKWARDS),
    ]
    assert launch._held_group_backward_path(launch.HELD_GROUP_BACKWARDS[0]) is (
        launch._held_group_backward_path(launch.HELD_GROUP_BACKWARDS[0])
    )  # one path object a configuration: the measured choice's key


def test_device_part_of_the_group_decision(pretend_device, monkeypatch):
    """Compute capability 9.0 or later, a program's shared memory (the 8192-column
    configuration's 5 ring slots and w's slice, 100 KB: 2 an SM where the SM's shared memory
    holds two, as the H100's and H200's 228 KB do, else 1; the 16384-column one's 196 KB: 1), and
    no more slices in a row than SMs in either."""
    narrow, wide = launch.HELD_GROUP_BACKWARDS
    assert not held_paths._held_group_fits_device(torch.device("cpu"), GROUPED, narrow)
    cuda = torch.device("cuda", 0)
    pretend_device(sm_count=132)
    for capability, per_block, per_sm, n, fits, programs in [
        ((9, 0), HOPPER_SHARED, 233472, GROUPED, True, 2),
        ((9, 0), HOPPER_SHARED, 233472, 132 * narrow.slice_n, True, 2),
        ((9, 0), HOPPER_SHARED, 233472, 132 * narrow.slice_n + 16, False, 2),  # 133 slices
        ((9, 0), HOPPER_SHARED, 166912, 132 * narrow.slice_n, True, 1),  # one program an SM
        ((9, 0), 65536, 233472, GROUPED, False, 0),  # a program's 100 KB does not fit
        ((8, 0), HOPPER_SHARED, 233472, GROUPED, False, 2),
    ]:
        pretend_device(
            capability=capability, shared_bytes_per_block=per_block, shared_bytes_per_sm=per_sm
        )  # a pretend_device call forgets the cached programs an SM
        assert launch._held_group_backward_programs_per_sm(0, narrow) == programs
        assert held_paths._held_group_fits_device(cuda, n, narrow) is fits, (
            capability,
            per_block,
            n,
        )
        if capability == (9, 0) and (per_block, per_sm) == (HOPPER_SHARED, 233472):
            assert launch._held_group_backward_programs_per_sm(0, wide) == 1
            assert held_paths._held_group_fits_device(cuda, 132 * wide.slice_n, wide)
            assert not held_paths._held_group_fits_device(cuda, 132 * wide.slice_n + 16, wide)


def test_two_programs_an_sm_cap_the_registers():
    """A configuration of 2 programs an SM launches with its registers capped at what lets both
    stay resident (fewer are resident otherwise: ptxas gave the 8192-column
    configuration 140-183 registers uncapped with dh_out or at 262144 columns and more, and 128
    with no spill capped, `probes/2026-11-30-0e25331f7a64-grouped-backward-registers.txt`),
    rounded down to the allocation unit of 8 and within a thread's 255; one an SM uncapped."""
    assert launch._register_cap(2, 8) == {"maxnreg": 128}
    assert launch._register_cap(1, 8) == {}
    assert launch._register_cap(4, 4) == {"maxnreg": 128}
    assert launch._register_cap(3, 4) == {"maxnreg": 168}  # 170, rounded down
    assert launch._register_cap(2, 4) == {"maxnreg": 255}  # 256 is over a thread's limit


@pytest.mark.parametrize("config_index", [0, 1])
@pytest.mark.parametrize("m, n", [(300, GROUPED), (3, 2**20), (4096, WIDEST)])
def test_the_grouped_launch_fits_its_programs_an_sm(
    pretend_device, monkeypatch, config_index, m, n
):
    """What the grouped backward launches, checked without a GPU (direct.launch recorded): an
    ordinary (not cooperative) grid of groups x programs a row within programs an SM x SMs, the
    registers of that many programs an SM within an SM's, the chunks of rows covering every row
    once, at most HELD_GROUP_CHUNKS_PER_GROUP a group and max(groups, SMs) (a dw partial row
    each), and the exchange (a word a row and slice; counters, heads and links after it)."""
    config = launch.HELD_GROUP_BACKWARDS[config_index]
    sms = 132
    pretend_device(sm_count=sms, shared_bytes_per_block=HOPPER_SHARED, shared_bytes_per_sm=233472)
    launches, reduced = [], []
    monkeypatch.setattr(launch.direct, "launch", lambda *a: launches.append(a))
    monkeypatch.setattr(
        backward_launch, "_reduce_partials", lambda partial, dw: reduced.append(partial)
    )
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    w = torch.zeros(n, dtype=torch.bfloat16)
    rstd = torch.zeros(m)
    launch._backward_held_group(x, x, w, rstd, 0.0, x, x, False, w, config=config)
    ((kernel, grid, args, meta, _),) = launches
    group = launch.cdiv(n, config.slice_n)
    assert (meta["GROUP"], meta["CHUNK"], meta["CHUNKS"]) == (group, config.chunk, config.chunks)
    assert "launch_cooperative_grid" not in meta and grid[0] % group == 0
    assert grid[0] <= config.per_sm * sms
    registers = meta.get("maxnreg", 255) * 32 * config.warps * config.per_sm
    assert registers <= launch.REGISTERS_PER_SM
    groups, rows_per_chunk, chunks = grid[0] // group, args[14], args[15]
    assert (chunks - 1) * rows_per_chunk < m <= chunks * rows_per_chunk
    assert chunks <= max(groups, sms) and chunks <= groups * launch.HELD_GROUP_CHUNKS_PER_GROUP
    assert reduced[0].shape == (chunks, n) and args[7].shape == (m * group,)
    assert args[8].shape == (2 + groups + chunks,) and args[8].data_ptr() % 16 == 0
    assert args[7].untyped_storage().data_ptr() == args[8].untyped_storage().data_ptr()
    assert launch.take_launch_configs()["rmsnorm_bwd_held_group_kernel"]["PROGRAMS_PER_SM"] == (
        config.per_sm
    )


@pytest.mark.parametrize(
    "m, groups, sms, expected",
    [
        (2048, 33, 132, (16, 128)),  # 4 chunks a group: 132 asked, 128 of 16 rows
        (300, 88, 132, (4, 75)),  # 88 groups: one chunk each (SMs // groups = 1), 75 of 4 rows
        (300, 66, 132, (3, 100)),  # 2 a group
        (3, 33, 132, (1, 3)),  # fewer rows than groups: a row each
        (1, 1, 132, (1, 1)),
        (100000, 2, 132, (12500, 8)),  # 4 a group, not 132: the partials stay at 8 rows
    ],
)
def test_held_group_row_chunks(m, groups, sms, expected):
    """The grouped backward's chunks of rows: up to HELD_GROUP_CHUNKS_PER_GROUP a group where the
    SM count allows, at most m, of equal rows but the last (so fewer where rows round up)."""
    assert launch.HELD_GROUP_CHUNKS_PER_GROUP == 4
    assert launch.held_group_row_chunks(m, groups, sms) == expected


def test_held_group_words_are_whole_in_every_warp_or_one_a_thread():
    """The exchanged words' tensor: up to 32, GROUP's next power of two (every warp holds all of
    them); past 32, at least one a thread, so that no warp repeats another's words with loads
    of its own (gluon_group_exchange._read_sums)."""
    words = launch.held_group_words
    assert [words(g, 8) for g in (1, 3, 4, 16, 17, 32)] == [1, 4, 4, 16, 32, 32]
    assert [words(g, 8) for g in (33, 64, 256, 257, 528)] == [256, 256, 256, 512, 1024]
    assert [words(g, 4) for g in (33, 64, 128, 256, 792)] == [128, 128, 128, 256, 1024]


def test_held_group_backward_compiles_for_sm90():
    """Compiled for sm_90 (no GPU): relaxed 64-bit exchanges (four: the first row's sum and the
    rows' after, the group's head and a chunk's link), relaxed 64-bit adds (three: the ticket,
    the first claim and the claims after), volatile 64-bit loads (ten: member 0's two polls of
    the tickets and claims, before and in its loop; the head's two; the sums' early one and
    poll; a link's early one and poll), no acquire or release, and no barrier from the poll loop through the fallback where a row has up to 32
    words (a program's warps may part there; at 128 their reductions cross warps); 16-byte
    copies and stores (8 warps over 4096-column chunks: 2 vectors of a 16-bit chunk a thread,
    4 of an fp32 one; 5 ring slots, w's 2 chunks, 2 chunks restaged a row; dx and the dw
    partials)."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    if held_paths.gluon_kernels is None:
        pytest.skip("this Triton has no Gluon")
    cases = [{"kernel": "held_group_bwd", "x": x, "block_n": n, "extra": dh}
             for x, n, dh in (("bf16", GROUPED, False), ("fp16", 40960, True),
                              ("bf16", 2**20, False))]  # fmt: skip
    cases.append({"kernel": "held_group_bwd", "x": "bf16", "block_n": GROUPED, "extra": True,
                  "config": 1})  # fmt: skip
    expected = {"relaxed exchanges": 4, "relaxed adds": 3, "acquires or releases": 0,
                "volatile loads": 10, "staged vectors": 2 * (2 * 5 + 2 + 2 * 2),
                "vector stores": 2 * 2 + 4 * 2}  # fmt: skip
    found = sm90_compile.run(cases)
    # 2 programs an SM: registers capped at 128 (8 warps); 1 an SM (16384-column slices): none
    assert [f["register cap"] for f in found] == [128, 128, 128, None]
    found = found[:3]
    assert [{k: f[k] for k in expected} for f in found] == [expected] * 3
    barriers = [f["barriers from the polls through the fallback"] for f in found]
    assert barriers[:2] == [0, 0] and barriers[2] > 0  # 8 and 5 words a row; 128: shared
    # bf16 upcast in pairs up to 32 words a row (8 here), Triton's own conversion at 128 and fp16
    pairs = [(True, False), (False, False), (False, False)]
    assert [(f["bf16"], f["fp16"]) for f in found] == pairs


def _force_group(force_paths, config: int = 0) -> None:
    """The grouped backward in that configuration as the backward's only path."""
    path = launch._held_group_backward_path(launch.HELD_GROUP_BACKWARDS[config])
    force_paths(backward=dispatch.path_name(path))


needs_group_gpu = pytest.mark.skipif(
    not (
        ON_NVIDIA_GPU
        and held_paths.gluon_kernels is not None
        and all(
            held_paths._held_group_fits_device(torch.device("cuda"), GROUPED, c)
            for c in launch.HELD_GROUP_BACKWARDS
        )
    ),
    reason="the grouped held-row backward needs a Hopper-class NVIDIA GPU with 196 KB of shared "
    "memory a program and a Triton with Gluon",
)


@needs_group_gpu
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((300, GROUPED), torch.bfloat16),  # 8 programs a row, several rows a group
        ((64, GROUPED), torch.float16),
        ((3, 2 * GROUPED), torch.bfloat16),  # fewer rows than groups
        ((40, 36864), torch.bfloat16),  # 5 slices, the last half outside the row
        ((4, 32 * SLICE), torch.bfloat16),  # 32 words a row: the most in pairs
        ((2, 5, 2**20), torch.bfloat16),  # 128 programs a row, leading dims
        ((2, 132 * SLICE), torch.bfloat16),  # 2 x 132 programs: every slot, the most a row
        ((1, GROUPED), torch.float16),  # one row
        ((50, WIDEST + 16), torch.bfloat16),  # the fifth slice holds 16 columns
        ((300, WIDEST), torch.bfloat16),  # 4 programs a row (the held row's width)
        ((3, 64, WIDEST), torch.float16),  # 4 programs a row, leading dims
        ((100, 24576), torch.bfloat16),  # 3 programs a row
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, str(p)),
)
def test_held_group_backward_matches_the_oracle(force_paths, shape, dtype):
    _force_group(force_paths)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    launched = launch.take_launch_configs()["rmsnorm_bwd_held_group_kernel"]
    assert (launched["CHUNK"], launched["PROGRAMS_PER_SM"], launched["maxnreg"]) == (4096, 2, 128)


@needs_group_gpu
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((300, GROUPED), torch.bfloat16),  # 4 programs a row
        ((2, 5, 2**20), torch.float16),  # 64 programs a row, leading dims
        ((50, WIDEST + 16), torch.bfloat16),  # the third slice holds 16 columns
        ((64, WIDEST), torch.bfloat16),  # 2 programs a row (the held row's width)
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, str(p)),
)
def test_held_group_backward_in_16384_column_slices_matches_the_oracle(force_paths, shape, dtype):
    _force_group(force_paths, config=1)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    launched = launch.take_launch_configs()["rmsnorm_bwd_held_group_kernel"]
    assert (launched["CHUNK"], launched["PROGRAMS_PER_SM"]) == (8192, 1)


def record_exchanges(monkeypatch) -> list:
    """The grouped kernels' exchange buffers (int64, zeroed by the launcher), as allocated."""
    recorded = []
    zeros = torch.zeros

    def recording_zeros(*size, **kwargs):
        out = zeros(*size, **kwargs)
        if out.dtype == torch.int64:
            recorded.append(out)
        return out

    monkeypatch.setattr(torch, "zeros", recording_zeros)
    return recorded


def assert_every_slice_published(words: torch.Tensor, m: int, group: int) -> None:
    """Every member's word of every row (the first m x group words of the exchange) carries
    that row's tag (row + 1)."""
    tags = words[: m * group].view(m, group) >> 32
    rows = torch.arange(1, m + 1, device=words.device)[:, None].expand(m, group)
    assert torch.equal(tags, rows)


@needs_group_gpu
@pytest.mark.parametrize(
    "spin_limit, tag_offset",
    [(0, 1), (8, 1), (0, 0), (1, 0)],
    ids=["never complete, no polls", "never complete, 8 polls", "no polls", "1 poll"],
)
def test_held_group_backward_falls_back_on_every_row(
    force_paths, monkeypatch, spin_limit, tag_offset
):
    """Readers that look for tags one past the writers' never find a group complete: every
    program, after its polls are spent (all its rows together), sums every row alone from
    global memory and still publishes its own sums. With the writers' tags and no poll or one,
    whether a row is complete when first read is a race, and a program's warps, which poll on
    their own, may see it differently: those that fall back must not stall
    those that do not (no barrier where they part). Either way the result matches the
    oracle, and the exchange shows every program's sum on every row."""
    _force_group(force_paths)
    monkeypatch.setattr(held_launch, "HELD_GROUP_SPIN_LIMIT", spin_limit)
    monkeypatch.setattr(held_launch, "HELD_GROUP_TAG_OFFSET", tag_offset)
    exchanges = record_exchanges(monkeypatch)
    inputs = make_inputs((300, GROUPED), torch.bfloat16, DEVICE)
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    assert len(exchanges) == 1
    assert_every_slice_published(exchanges[0], 300, launch.cdiv(GROUPED, SLICE))


@needs_group_gpu
def test_held_group_backward_with_mixed_16_bit_dtypes(force_paths):
    """An fp16 dy with bf16 x and w, staged each in its own dtype."""
    _force_group(force_paths)
    inputs = make_inputs((200, GROUPED), torch.bfloat16, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy.half())
    assert "rmsnorm_bwd_held_group_kernel" in launch.take_launch_configs()


@needs_group_gpu
def test_held_group_backward_with_a_residual_and_strided_rows(force_paths):
    _force_group(force_paths)
    launch.take_launch_configs()
    _check_residual((100, GROUPED), torch.bfloat16)
    n = GROUPED - 64
    wide = make_inputs((150, GROUPED), torch.float16, DEVICE)
    _assert_matches_oracle(wide.x[:, :n], wide.weight[:n].contiguous(), wide.dy[:, :n])
    assert "rmsnorm_bwd_held_group_kernel" in launch.take_launch_configs()


@needs_held_row_gpu
def test_the_measured_choice_is_remembered_and_captured(monkeypatch):
    """Tuned (dispatch.tuning) and unforced: the first call measures the wide path, the held row at 16 and
    32 warps and, the row filling two slices, the group (the tuner's CUDA graphs of the Gluon
    launches, the group's among them), later calls reuse the choice, and
    a CUDA graph captured after that gives the same gradients as an eager call."""
    inputs = make_inputs((1024, WIDEST), torch.bfloat16, DEVICE)
    with dispatch.tuning(allow_group=True) as table:  # the first call measures
        _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
        chosen = [e for e in table.entries() if e.key.direction == "bwd"]
        groups = (launch._held_group_backward_path(c) for c in launch.HELD_GROUP_BACKWARDS)
        offered = (launch._backward_wide, *launch._HELD_ROW_BACKWARDS, *groups)
        assert len(chosen) == 1 and chosen[0].path in map(dispatch.path_name, offered)
        _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
        assert [e for e in table.entries() if e.key.direction == "bwd"] == chosen

        x = inputs.x.detach().requires_grad_(True)
        w = inputs.weight.detach().requires_grad_(True)
        graph = torch.cuda.CUDAGraph()
        from impls.triton_rmsnorm import rmsnorm

        static = {}
        with torch.cuda.graph(graph):
            y = rmsnorm(x, w, 1e-5)
            static["dx"], static["dw"] = torch.autograd.grad(y, (x, w), inputs.dy)
        graph.replay()
        torch.cuda.synchronize()
        y_eager = rmsnorm(x, w, 1e-5)
        dx, dw = torch.autograd.grad(y_eager, (x, w), inputs.dy)
        assert torch.equal(static["dx"], dx) and torch.equal(static["dw"], dw)


def test_an_optional_path_that_fails_is_left_out(monkeypatch):
    """A path after the default that raises at its first call (a kernel that does not compile on
    this GPU) is dropped with a warning; the default keeps the call."""
    ran = []

    def default(*args):
        ran.append("default")

    def broken(*args):
        raise RuntimeError("PassManager::run failed")

    measured = []

    def fastest(paths, launch_fn, args, passes=1):
        assert passes == launch.PATH_MEASURE_PASSES  # paths are timed more than once
        measured.append(list(paths))
        return paths[0]

    monkeypatch.setattr(launch.tuning, "fastest", fastest)
    default_path, broken_path = Path(default, "default"), Path(broken, "broken")
    with pytest.warns(RuntimeWarning, match="broken path failed at its first call"):
        assert launch._fastest([default_path, broken_path], ()) is default_path
    assert ran == ["default"] and measured == [[default_path]]
