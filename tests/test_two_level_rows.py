"""Rows read in two levels: a [tokens, heads, head_dim] view of a packed QKV projection (per-head
QK-norm), whose rows no one stride describes, reaches the kernels without a copy (function.py's
_x_rows, the single tile's HEADS), forward and backward, with the bits of the same call on a
contiguous copy; other layouts keep their copy; only the paths that read such rows serve them."""

from __future__ import annotations

import pytest
import torch

from harness.layouts import make_case_inputs
from harness.shapes import HeadView
from impls.triton_rmsnorm import direct, dispatch, launch, rmsnorm
from impls.triton_rmsnorm.function import _x_rows
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import H200_FACTS, assert_matches_oracle, grads

#: Few tokens: the interpreter runs every program on the CPU (M = TOKENS * heads rows, with
#: tiles that end inside a token's heads at every head count below).
TOKENS = 5
#: The KV heads packed after q in the projection: the token stride is (heads + 16) * head_dim.
KV_HEADS = 8


def _launch_calls(monkeypatch) -> dict:
    """Record the x that each launch.rmsnorm_forward and rmsnorm_backward call is given (and the
    forward's outputs), calling through."""
    seen = {"fwd": [], "bwd": []}
    forward, backward = launch.rmsnorm_forward, launch.rmsnorm_backward

    def recording_forward(x, *args, **kwargs):
        out = forward(x, *args, **kwargs)
        seen["fwd"].append((x, out))
        return out

    def recording_backward(dy, x, *args, **kwargs):
        seen["bwd"].append(x)
        return backward(dy, x, *args, **kwargs)

    monkeypatch.setattr(launch, "rmsnorm_forward", recording_forward)
    monkeypatch.setattr(launch, "rmsnorm_backward", recording_backward)
    return seen


def _in_place(got: torch.Tensor, x: torch.Tensor) -> bool:
    """got addresses x's own elements (a copy, whatever made it, has memory of its own)."""
    return (
        got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        and got.data_ptr() == x.data_ptr()
        and got.shape[-1] == x.shape[-1]
        and got.numel() == x.numel()
    )


def _assert_same_bits(view_run: tuple, copy_run: tuple) -> None:
    for name, got, want in zip(("y", "rstd", "dx", "dw"), view_run, copy_run, strict=True):
        assert torch.equal(got.reshape(want.shape), want), f"{name} differs from the copy's"


CASES = [(h, d, dt) for dt in (torch.bfloat16, torch.float16) for h in (8, 32, 40)
         for d in (64, 128, 256)]  # fmt: skip


@pytest.mark.parametrize(
    "heads, head_dim, dtype", CASES,
    ids=[f"{DTYPE_NAMES[dt]}-{TOKENS}x{h}x{d}" for h, d, dt in CASES],
)  # fmt: skip
def test_head_view_is_read_in_place_with_the_bits_of_a_copy(monkeypatch, heads, head_dim, dtype):
    """q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim): the forward and the backward
    get x itself (no copy of it anywhere), y, rstd, dx and dw are bitwise those of the call on
    x.contiguous(), and within our bounds of the fp32 oracle."""
    shape = HeadView(TOKENS, heads, head_dim, KV_HEADS)
    inputs = make_case_inputs(shape, dtype, DEVICE, seed=heads * head_dim)
    x = inputs.x
    assert x.stride() == (shape.packed_width, head_dim, 1) and not x.is_contiguous()
    seen = _launch_calls(monkeypatch)
    y, dx, dw = assert_matches_oracle(x, inputs.weight, inputs.dy)
    [(forward_x, (_, rstd, _))], [backward_x] = seen["fwd"], seen["bwd"]
    assert forward_x.dim() == 3 and _in_place(forward_x, x), "the forward got a copy of x"
    assert backward_x.dim() == 3 and _in_place(backward_x, x), "the backward got a copy of x"
    y_copy, dx_copy, dw_copy = grads(x.contiguous(), inputs.weight, inputs.dy)
    (_, (_, rstd_copy, _)) = seen["fwd"][1]
    assert seen["fwd"][1][0].dim() == 2  # the copy ran as [M, N] rows
    _assert_same_bits((y, rstd, dx, dw), (y_copy, rstd_copy, dx_copy, dw_copy))


def _packed(dims: tuple, width: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(*dims, width, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    "make_x, levels",
    [
        # [batch, tokens, heads, head_dim]: batch and tokens merge into one level
        (lambda: _packed((2, 3), 12 * 64)[..., : 8 * 64].view(2, 3, 8, 64), (6, 8)),
        # q and k of a packed qkv as [tokens, 2, heads, head_dim]: (2, heads) merge
        (lambda: _packed((3,), 5 * 128)[:, : 4 * 128].view(3, 2, 2, 128), (3, 4)),
        # batch rows apart from tokens (tokens sliced): three levels, copied
        (lambda: _packed((2, 4), 12 * 64)[:, :3, : 8 * 64].view(2, 3, 8, 64), None),
    ],
    ids=["4d-batch-tokens-merge", "4d-q-and-k-heads-merge", "three-levels-copied"],
)  # fmt: skip
def test_other_layouts_read_in_place_or_copied(monkeypatch, make_x, levels):
    """Leading dimensions that merge into two levels are read in place as [outer, heads, N]
    (and match the copy's bits); three levels are copied, as before."""
    x = make_x()
    n = x.shape[-1]
    weight = torch.randn(n, device=DEVICE).to(x.dtype)
    dy = torch.randn(x.shape, device=DEVICE).to(x.dtype)
    seen = _launch_calls(monkeypatch)
    y, dx, dw = assert_matches_oracle(x, weight, dy)
    [(forward_x, (_, rstd, _))], [backward_x] = seen["fwd"], seen["bwd"]
    if levels is None:
        assert forward_x.dim() == 2 and forward_x.is_contiguous()
        assert not _in_place(forward_x, x) and _in_place(backward_x, forward_x)
        return
    assert tuple(forward_x.shape) == (*levels, n) and _in_place(forward_x, x)
    assert _in_place(backward_x, x)
    y_copy, dx_copy, dw_copy = grads(x.contiguous(), weight, dy)
    _assert_same_bits((y, rstd, dx, dw), (y_copy, seen["fwd"][1][1][1], dx_copy, dw_copy))


def test_with_a_residual_the_view_is_copied(monkeypatch):
    """h and the residual are [M, N]: a residual call takes x's rows copied, as before."""
    inputs = make_case_inputs(HeadView(3, 4, 64, 2), torch.bfloat16, DEVICE, seed=3)
    residual = torch.randn(inputs.x.shape, device=DEVICE).to(torch.bfloat16)
    seen = _launch_calls(monkeypatch)
    y, h = rmsnorm(inputs.x, inputs.weight, inputs.eps, residual=residual)
    [(forward_x, _)] = seen["fwd"]
    assert forward_x.dim() == 2 and not _in_place(forward_x, inputs.x)
    y_copy, h_copy = rmsnorm(inputs.x.contiguous(), inputs.weight, inputs.eps, residual=residual)
    assert torch.equal(y, y_copy) and torch.equal(h, h_copy)


def test_wide_heads_and_unit_layouts_are_not_two_level():
    """Past launch.TWO_LEVEL_MAX_N columns (where the single tile would not serve both
    directions) the view is copied; a layout that one stride describes stays a 2-D view."""
    n = launch.TWO_LEVEL_MAX_N + 8
    wide = torch.empty(2, 3 * n, device="meta")[:, : 2 * n].view(2, 2, n)
    assert _x_rows(wide).dim() == 2 and _x_rows(wide).is_contiguous()
    one_stride = torch.empty(4, 2, 80)[..., :64]  # [4, 2, 64]: rows 80 apart, tokens 160
    assert not one_stride.is_contiguous() and _x_rows(one_stride).stride() == (80, 1)
    assert _x_rows(one_stride).data_ptr() == one_stride.data_ptr()
    sliced_tokens = torch.empty(8, 2, 64)[::2]  # token stride 256, heads 2 x 64: two levels
    assert _x_rows(sliced_tokens) is sliced_tokens
    heads_of_one = torch.empty(4, 3 * 64)[:, :64].view(4, 1, 64)  # one level: a 2-D view
    assert _x_rows(heads_of_one).dim() == 2
    assert _x_rows(heads_of_one).data_ptr() == heads_of_one.data_ptr()


def test_launch_refuses_what_it_cannot_read_in_two_levels():
    w = torch.ones(64, device=DEVICE)
    x = torch.randn(3, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="heads > 1"):
        launch.rmsnorm_forward(x[:, :1], w, 1e-6)
    with pytest.raises(ValueError, match="take no residual"):
        launch.rmsnorm_forward(x, w, 1e-6, residual=torch.randn(6, 64, device=DEVICE))
    wide = torch.randn(1, 2, launch.TWO_LEVEL_MAX_N + 1, device=DEVICE)
    with pytest.raises(ValueError, match=f"N <= {launch.TWO_LEVEL_MAX_N}"):
        launch.rmsnorm_forward(wide, torch.ones(wide.shape[-1], device=DEVICE), 1e-6)


def test_only_the_single_tile_serves_two_level_rows(pretend_device):
    """Where [M, N] rows are offered the two-role backward too (the device part taken as given),
    two-level rows are offered the single tile alone, in both directions: neither the dispatch
    table (its entry's path must be offered) nor an override can send them elsewhere."""
    pretend_device(l2_bytes=H200_FACTS["l2_bytes"])
    inputs = make_case_inputs(HeadView(2, 2, 2048, 1), torch.bfloat16, DEVICE, seed=5)
    x, w = inputs.x, inputs.weight
    dy, y = inputs.dy.reshape(4, 2048), torch.empty(4, 2048, device=DEVICE, dtype=x.dtype)
    copy = x.reshape(4, 2048)
    names = [dispatch.path_name(p) for p in launch.backward_paths(copy, dy, w, None)]
    assert names == ["single_tile", "two_role"]
    assert launch.backward_paths(x, dy, w, None) == [launch._backward_single_tile]
    assert launch.forward_paths(x, y, w, False) == [launch._forward_single_tile]
    with (
        dispatch.override(backward="two_role"),
        pytest.raises(ValueError, match="offered: single_tile$"),
    ):
        grads(x, w, inputs.dy)
    with (
        dispatch.override(forward="looped"),
        pytest.raises(ValueError, match="offered: single_tile$"),
    ):
        rmsnorm(x, w)


def test_a_head_view_replays_its_launches(python_host_path):
    """A later call of the same view's signature repeats the recorded launches (forward: one;
    backward: the kernel and the dw reduction) with the same bits; another token stride is
    another signature."""
    inputs = make_case_inputs(HeadView(3, 8, 64, 2), torch.bfloat16, DEVICE, seed=11)
    first = grads(inputs.x, inputs.weight, inputs.dy)
    before = direct.replayed_launches
    again = grads(inputs.x, inputs.weight, inputs.dy)
    assert direct.replayed_launches - before == 3
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    other = make_case_inputs(HeadView(3, 8, 64, 4), torch.bfloat16, DEVICE, seed=11).x
    key = launch._forward_replay_key(inputs.x, inputs.weight, None)
    assert launch._forward_replay_key(other, inputs.weight, None) != key
    assert launch._forward_replay_key(inputs.x.reshape(24, 64), inputs.weight, None) != key


def test_two_level_kernels_compile_for_sm90():
    """The interpreter never compiles: the forward (one program a tile with W_EARLY, and a
    persistent grid, at 32 and 40 heads) and the backward with HEADS compile for sm_90 (Triton's
    bundled ptxas, no GPU needed)."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    from tests import sm90_compile

    base = {"x": "bf16", "stages": 1, "block_n": 128, "extra": False, "hold": False, "warps": 4}
    cases = [
        {**base, "kernel": "fwd", "persistent": False,
         "constexprs": {"HEADS": 32, "STRIDE_X_OUTER": 6144, "W_EARLY": True}},
        {**base, "kernel": "fwd", "persistent": True,
         "constexprs": {"HEADS": 40, "STRIDE_X_OUTER": 7168}},
        {**base, "kernel": "bwd", "dy": "bf16", "persistent": False,
         "constexprs": {"HEADS": 32, "STRIDE_X_OUTER": 6144}},
    ]  # fmt: skip
    assert len(sm90_compile.run(cases)) == len(cases)
