"""The two-role backward (kernels.rmsnorm_bwd_two_role_kernel): row programs write dx, column
programs beside them write dw, in one launch and without partials. Where the launch offers it,
that the first call measures it against the single tile, that it matches the oracle in every
variant the single tile serves at those widths (run through the interpreter on the CPU), and
that a recorded call replays its one launch."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import backward_launch, direct, dispatch, launch, rmsnorm
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import H200_FACTS
from tests.helpers import assert_matches_oracle as _assert_matches_oracle
from tests.helpers import check_residual as _check_residual

KERNEL = "rmsnorm_bwd_two_role_kernel"


def test_launch_offers_it_for_small_aligned_rows(pretend_device):
    """TWO_ROLE_MIN_N to TWO_ROLE_MAX_N columns, up to TWO_ROLE_MAX_ELEMENTS elements, wherever
    the single tile's plain kernel takes the rows (not the shifted kernel's rows, off 16 bytes
    alike in x, dy and dh_out), the device's part taken as given."""
    pretend_device(l2_bytes=H200_FACTS["l2_bytes"])
    bf16 = torch.bfloat16

    def offered(m, n, dtype=bf16, width=None, dh_width=None):
        x = torch.zeros(m, width or n, dtype=dtype)[:, :n]
        dh = None if dh_width is None else torch.zeros(m, dh_width, dtype=dtype)[:, :n]
        return launch.backward_takes_two_roles(x, torch.zeros(m, n, dtype=dtype), dh)

    assert offered(512, 2048) and offered(512, 8192) and offered(2, 2048, torch.float32)
    assert offered(1024, 4096, torch.float16) and offered(2048, 2048)
    assert offered(512, 4088, width=4096)  # strided rows on 16 bytes
    assert offered(256, 16384) and offered(1, 16384)  # decode-sized rows of the widest tile
    assert not offered(512, 16384)  # 8M elements: past TWO_ROLE_MAX_ELEMENTS
    assert not offered(1, launch.TWO_ROLE_MAX_N + 8)  # the looped backward's widths
    assert not offered(2048, launch.TWO_ROLE_MIN_N - 8)  # few column programs, long walks
    assert not offered(1024, 8192) and not offered(4096, 2048)  # past TWO_ROLE_MAX_ELEMENTS
    assert not offered(512, 4092)  # rows 8 bytes off 16 alike: the shifted kernel's
    assert not offered(512, 4092, dh_width=4092)
    assert offered(512, 4092, dh_width=4096)  # dh_out's rows apart from x's: the plain kernel's


def test_device_part_of_the_decision(pretend_device):
    """A GPU whose L2 holds x and dy twice over; never the interpreter's CPU (no L2)."""
    assert not backward_launch._two_role_fits_device(torch.device("cpu"), 1)
    pretend_device(l2_bytes=60 << 20)
    cuda = torch.device("cuda", 0)
    assert backward_launch._two_role_fits_device(cuda, 30 << 20)
    assert not backward_launch._two_role_fits_device(cuda, (30 << 20) + 1)
    pretend_device(l2_bytes=0)
    assert not backward_launch._two_role_fits_device(cuda, 1)


def test_column_tiles_follow_the_tile_width():
    """The probe's best column tile at 2048, 4096 and 8192 columns, 16384's the same count of
    column programs; narrower rows take 2048's."""
    assert launch.two_role_column_tile(64) == launch.two_role_column_tile(2048) == (16, 128, 3)
    assert launch.two_role_column_tile(4096) == (32, 128, 4)
    assert launch.two_role_column_tile(8192) == (64, 64, 3)
    assert launch.two_role_column_tile(16384) == (128, 32, 3)


def test_backward_offers_it_beside_the_single_tile(monkeypatch):
    """Where it is offered, the single tile (the default) comes first and the two-role path
    second: the dispatch table (or a tuning's measurement) chooses between them."""
    x = torch.zeros(4, 2048, dtype=torch.bfloat16)
    monkeypatch.setattr(launch, "backward_takes_two_roles", lambda *a: True)
    assert launch.backward_paths(x, x, x[0], None) == [
        launch._backward_single_tile,
        launch._backward_two_role,
    ]
    monkeypatch.setattr(launch, "backward_takes_two_roles", lambda *a: False)
    assert launch.backward_paths(x, x, x[0], None) == [launch._backward_single_tile]


@pytest.fixture
def two_roles():
    """The two-role backward as the only backward path of the test, offered or not (the public
    kernel-test override)."""
    launch.take_launch_configs()
    with dispatch.override(backward="two_role", offered_only=False):
        yield
    assert KERNEL in launch.take_launch_configs()


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((37, 100), torch.bfloat16),  # tail columns, rows not a multiple of the row step
        ((300, 130), torch.float16),  # the column programs' row loop takes 3 steps
        ((2, 9, 768), torch.float32),  # leading dims flattened
        ((5, 2048), torch.bfloat16),  # fewer rows than programs
        ((40, 4096), torch.float16),  # the 4096- and 8192-column tiles of the table
        ((7, 8192), torch.bfloat16),
        ((3, 16384), torch.bfloat16),  # the widest tile: 128 column programs of 128 columns
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES.get(p, str(p)),
)
def test_two_role_backward_matches_the_oracle(two_roles, shape, dtype):
    inputs = make_inputs(shape, dtype, DEVICE)
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)


def test_two_role_backward_weights_offset_and_strided_rows(two_roles):
    """An fp32 w (dw in fp32), Gemma's offset (w + 1 in dx, not in dw), rows of a wider tensor
    and an fp16 dy beside bf16 x."""
    wide = make_inputs((64, 1040), torch.bfloat16, DEVICE)
    x = wide.x[:, :1000]
    assert x.stride(0) == 1040
    w = (0.1 * torch.randn(1000)).to(DEVICE, torch.float32)
    _, _, dw = _assert_matches_oracle(x, w, wide.dy[:, :1000].half(), offset=1.0)
    assert dw.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_two_role_backward_with_a_residual(two_roles, dtype):
    """The residual's gradient dh_out added to dx by the row programs: h, y, dx, dr, dw."""
    _check_residual((48, 512), dtype)


def test_two_role_backward_repeats_its_bits_and_replays_one_launch(two_roles):
    """dw's fixed order: three calls give the same bits; the later two replay one launch each."""
    x = torch.randn(40, 256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    before = direct.replayed_launches
    results = []
    for _ in range(3):
        y = rmsnorm(x, w)
        results.append(torch.autograd.grad(y, (x, w), dy))
    for later in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], later, strict=True))
    assert direct.replayed_launches - before == 2 * 2  # calls 2 and 3: the forward, the backward


def test_two_role_replays_keep_the_offset_and_the_residual(two_roles):
    """Replays of the one launch with Gemma's offset and a residual's gradient (dh_out) give the
    first call's bits (the forward with a residual is not replayed: one launch a later call)."""
    x = torch.randn(24, 512, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(512, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy, dh = torch.randn_like(x), torch.randn_like(x)
    before = direct.replayed_launches
    results = []
    for _ in range(3):
        y, h = rmsnorm(x, w, 1e-6, offset=1.0, residual=r)
        results.append(torch.autograd.grad((y, h), (x, r, w), (dy, dh)))
    for later in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], later, strict=True))
    assert direct.replayed_launches - before == 2
    _check_residual((24, 512), torch.bfloat16)  # a replayed call, against the oracle
