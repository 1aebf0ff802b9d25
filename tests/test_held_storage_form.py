"""The single-tile kernels holding 16-bit rows as loaded between their passes
(HOLD_STORAGE_FORM: the backward at 16384-wide tiles, the forward from
FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N): when the launch asks for it, that the inline PTX
compiles for sm_90 (on any machine), and on a GPU the numerics, against the oracle and against
the plain kernels."""

from __future__ import annotations

import pytest
import torch

from harness.inputs import make_inputs
from impls.triton_rmsnorm import backward_launch, common, kernel_launch, launch
from tests import helpers, sm90_compile
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import assert_matches_oracle as _assert_matches_oracle

WIDEST = launch.BACKWARD_SINGLE_TILE_MAX_N
needs_nvidia_gpu = helpers.needs_nvidia_gpu("HOLD_STORAGE_FORM runs inline PTX")


def test_launch_asks_for_it_at_wide_16_bit_tiles_on_nvidia_gpus_only(monkeypatch):
    """The decision: 16384-wide tiles with x or dy 16-bit, never under the interpreter or on
    ROCm; and the single-tile backward's launch passes it to the kernel."""
    bf16, fp32 = torch.bfloat16, torch.float32
    monkeypatch.setattr(common, "interpreting", lambda: True)
    assert not launch.backward_holds_storage_form(WIDEST, bf16, bf16)
    monkeypatch.setattr(common, "interpreting", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.0")
    assert not launch.backward_holds_storage_form(WIDEST, bf16, bf16)
    monkeypatch.setattr(torch.version, "hip", None)
    assert launch.backward_holds_storage_form(WIDEST, bf16, bf16)
    assert launch.backward_holds_storage_form(WIDEST, fp32, torch.float16)
    assert not launch.backward_holds_storage_form(WIDEST, fp32, fp32)
    assert not launch.backward_holds_storage_form(WIDEST // 2, bf16, bf16)

    launched = []
    monkeypatch.setattr(
        kernel_launch, "_launch", lambda name, grid, *args, **kw: launched.append(kw)
    )
    monkeypatch.setattr(backward_launch, "_reduce_partials", lambda partial, dw: None)
    for n, x_dtype, dy_dtype in ((WIDEST // 2, bf16, bf16), (WIDEST // 2 + 1, bf16, bf16),
                                 (WIDEST, bf16, fp32), (WIDEST, fp32, fp32)):  # fmt: skip
        x, dy = torch.zeros(4, n, dtype=x_dtype), torch.zeros(4, n, dtype=dy_dtype)
        launch._backward_single_tile(dy, x, x[0], torch.empty(4), 0.0, x, x, False, x[0])
    assert [kw["HOLD_STORAGE_FORM"] for kw in launched] == [False, True, True, False]


#: (kernel, x, dy, HOLD_STORAGE_FORM, HAS_DH_OUT or HAS_RESIDUAL, tile width, num_warps,
#: LOOP_STAGES, the forward's PERSISTENT) -> the inline upcasts expected
_COMPILED_CASES = [
    (("bwd", "bf16", "bf16", True, False, 16384, 16, 1, None), {"bf16": True, "fp16": False}),
    (("bwd", "bf16", "bf16", False, False, 16384, 16, 1, None), {"bf16": False, "fp16": False}),
    (("bwd", "fp16", "fp16", True, True, 16384, 32, 3, None), {"bf16": False, "fp16": True}),
    (("bwd", "bf16", "fp32", True, False, 16384, 16, 4, None), {"bf16": True, "fp16": False}),
    (("bwd", "fp32", "fp16", True, False, 16384, 32, 1, None), {"bf16": False, "fp16": True}),
    (("fwd", "bf16", None, True, False, 65536, 32, 1, False), {"bf16": True, "fp16": False}),
    (("fwd", "bf16", None, False, False, 65536, 32, 1, False), {"bf16": False, "fp16": False}),
    (("fwd", "fp16", None, True, True, 32768, 16, 1, False), {"bf16": False, "fp16": True}),
    # the configuration the H200's tuner picked at 2048x32768: programs walk the tiles, pipelined
    (("fwd", "bf16", None, True, False, 32768, 16, 3, True), {"bf16": True, "fp16": False}),
    (("fwd", "fp16", None, True, False, 32768, 16, 3, True), {"bf16": False, "fp16": True}),
]
_CASE_FIELDS = ("kernel", "x", "dy", "hold", "extra", "block_n", "warps", "stages", "persistent")


def test_held_kernels_compile_for_sm90_with_their_inline_upcasts():
    """The interpreter cannot run inline PTX, so CI compiles the held kernels for sm_90 instead
    (Triton's bundled ptxas, no GPU) and checks that each 16-bit operand's second-pass upcast is
    the inline one, and that the plain kernels have none: a dropped branch, asm that ptxas
    rejects, or a pack the layout cannot take fails here."""
    pytest.importorskip(
        "triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend"
    )
    cases = [dict(zip(_CASE_FIELDS, case, strict=True)) for case, _ in _COMPILED_CASES]
    found = sm90_compile.run(cases)
    assert found == [expected for _, expected in _COMPILED_CASES]


@needs_nvidia_gpu
@pytest.mark.parametrize(
    "shape, dtype, w_dtype, out_dtype",
    [
        ((64, 16384), torch.bfloat16, torch.bfloat16, None),
        ((64, 16384), torch.float16, torch.float16, None),
        ((37, 12289), torch.bfloat16, torch.bfloat16, None),  # masked tail, rows misaligned
        ((37, 12289), torch.float16, torch.float32, None),
        ((300, 16384), torch.bfloat16, torch.float32, None),  # several rows a program
        ((64, 16384), torch.bfloat16, torch.bfloat16, torch.float32),  # dy fp32, x bf16
        ((64, 16384), torch.float32, torch.float32, torch.bfloat16),  # dy bf16, x fp32
    ],
    ids=["bf16-64x16384", "fp16-64x16384", "bf16-37x12289", "fp16-fp32w-37x12289",
         "bf16-fp32w-300x16384", "bf16-fp32out-64x16384", "fp32-bf16out-64x16384"],
)  # fmt: skip
def test_held_backward_matches_the_oracle(shape, dtype, w_dtype, out_dtype):
    dy_dtype = out_dtype or dtype
    assert launch.backward_holds_storage_form(launch.block_size(shape[1]), dtype, dy_dtype)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy, out_dtype=out_dtype)
    # odd N: rows not 16-byte aligned take the shifted kernel (tests/test_shifted_rows.py)
    kernel = "rmsnorm_bwd_shifted_kernel" if shape[1] % 2 else "rmsnorm_bwd_kernel"
    assert kernel in launch.take_launch_configs()


@needs_nvidia_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
def test_held_backward_with_a_residual(dtype):
    """The gradient arriving on h (HAS_DH_OUT) added in the held backward."""
    from tests.helpers import check_residual as _check

    assert launch.backward_holds_storage_form(WIDEST, dtype, dtype)
    _check((41, WIDEST), dtype)


@needs_nvidia_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
def test_held_and_plain_kernels_agree(dtype):
    """Both kernels at one configuration on the same inputs. The dw partials bit for bit (the
    same fma chain). dx: the same formula, but the compiler contracts g - x_hat * mean into a
    different fma once g is recomputed, so the two unrounded values may differ by the rounding
    of either product (2**-24 relative each, bounded here by 2**-22 of |g| + |x_hat * mean|,
    times rstd), and each is then rounded once to the storage dtype (one ulp between them)."""
    from impls.triton_rmsnorm import kernels

    m, n = 300, WIDEST
    inputs = make_inputs((m, n), dtype, DEVICE)
    x, w, dy = inputs.x, inputs.weight, inputs.dy
    rstd = torch.rand(m, device=DEVICE) + 0.5
    programs, rows_per_program = launch._single_tile_backward_grid(m, x.device)
    config = launch._heuristic_config("rmsnorm_bwd_kernel", n)
    outputs = {}
    for hold in (False, True):
        dx = torch.full_like(x, float("nan"))
        partial = torch.full((programs, n), float("nan"), device=DEVICE)
        args = launch._single_tile_backward_args(dy, x, w, rstd, 0.0, dx, dy, partial,
                                                 rows_per_program)  # fmt: skip
        kernels.rmsnorm_bwd_kernel[(programs,)](
            *args, BLOCK_N=n, HAS_DH_OUT=False, HOLD_STORAGE_FORM=hold, **config
        )
        outputs[hold] = dx.float(), partial
    (dx_plain, partial_plain), (dx_held, partial_held) = outputs[False], outputs[True]
    assert torch.equal(partial_held, partial_plain)

    x_hat = x.float() * rstd[:, None]
    g = w.float() * dy.float()
    x_hat_mean = x_hat * ((g * x_hat).sum(dim=1, keepdim=True) / n)
    slack = 2.0**-22 * (g.abs() + x_hat_mean.abs()) * rstd[:, None]
    info = torch.finfo(dtype)
    magnitude = torch.maximum(dx_plain.abs(), dx_held.abs()).clamp_min(info.tiny)
    ulp = info.eps * torch.exp2(torch.floor(torch.log2(magnitude)))
    assert bool(((dx_held - dx_plain).abs() <= ulp + slack).all())


# ---- the forward -------------------------------------------------------------------------------

FORWARD_FROM = launch.FORWARD_HOLD_STORAGE_FORM_FROM_BLOCK_N


def test_forward_launch_asks_for_it_at_wide_16_bit_tiles_on_nvidia_gpus_only(monkeypatch):
    bf16, fp32 = torch.bfloat16, torch.float32
    monkeypatch.setattr(common, "interpreting", lambda: True)
    assert not launch.forward_holds_storage_form(FORWARD_FROM, bf16)
    monkeypatch.setattr(common, "interpreting", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.0")
    assert not launch.forward_holds_storage_form(FORWARD_FROM, bf16)
    monkeypatch.setattr(torch.version, "hip", None)
    assert launch.forward_holds_storage_form(FORWARD_FROM, bf16)
    assert launch.forward_holds_storage_form(FORWARD_FROM, torch.float16)
    assert not launch.forward_holds_storage_form(FORWARD_FROM, fp32)
    assert not launch.forward_holds_storage_form(FORWARD_FROM // 2, bf16)

    launched = []
    monkeypatch.setattr(
        kernel_launch, "_launch", lambda name, grid, *args, **kw: launched.append(kw)
    )
    for n, dtype in (
        (FORWARD_FROM // 2, bf16),
        (FORWARD_FROM // 2 + 1, bf16),
        (FORWARD_FROM, fp32),
    ):
        x = torch.zeros(2, n, dtype=dtype)
        rstd = torch.empty(2)
        launch._forward_single_tile(x, x[0], x, rstd, x, x, (n,) * 4, 1e-6, 0.0, False)
    assert [kw["HOLD_STORAGE_FORM"] for kw in launched] == [False, True, False]


@needs_nvidia_gpu
@pytest.mark.parametrize(
    "shape, dtype, w_dtype",
    [
        ((64, FORWARD_FROM), torch.bfloat16, torch.bfloat16),
        ((16, 65536), torch.float16, torch.float16),
        ((37, 40001), torch.bfloat16, torch.bfloat16),  # masked tail, rows misaligned
        ((37, 40001), torch.float16, torch.float32),
    ],
    ids=lambda p: "x".join(map(str, p)) if isinstance(p, tuple) else DTYPE_NAMES[p],
)
def test_held_forward_matches_the_oracle(shape, dtype, w_dtype):
    """The single tile (the tests' fixed path for these widths; a GPU run with autotuning
    measures it against the looped kernel)."""
    assert launch.forward_holds_storage_form(launch.block_size(shape[1]), dtype)
    inputs = make_inputs(shape, dtype, DEVICE)
    launch.take_launch_configs()
    _assert_matches_oracle(inputs.x, inputs.weight.to(w_dtype), inputs.dy)
    # odd N: rows not 16-byte aligned take the shifted kernel (tests/test_shifted_rows.py)
    kernel = "rmsnorm_fwd_shifted_kernel" if shape[1] % 2 else "rmsnorm_fwd_kernel"
    assert kernel in launch.take_launch_configs()


@needs_nvidia_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
def test_held_forward_with_a_residual(dtype):
    """h = x + r is formed, rounded, written, and held as rounded."""
    from tests.helpers import check_residual as _check

    assert launch.forward_holds_storage_form(FORWARD_FROM, dtype)
    _check((9, FORWARD_FROM), dtype)


#: A tile a program (the heuristic's), and the configuration the H200's tuner picked at
#: 2048x32768: four programs an SM walking the tiles, their loop pipelined three stages deep.
_FORWARD_GRIDS = {
    "one_per_tile": None,
    "persistent": {"BLOCK_M": 1, "PROGRAMS_PER_SM": 4, "LOOP_STAGES": 3, "num_warps": 16,
                   "num_stages": 3},
}  # fmt: skip


@needs_nvidia_gpu
@pytest.mark.parametrize("grid_name", sorted(_FORWARD_GRIDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: DTYPE_NAMES[d])
def test_held_and_plain_forwards_agree_bit_for_bit(dtype, grid_name):
    """y = x * rstd * w from the same values, with no sum to contract: identical bits. Enough
    rows that the persistent programs walk several tiles each."""
    from impls.triton_rmsnorm import kernels

    m, n = 1100, FORWARD_FROM
    x, w = make_inputs((m, n), dtype, DEVICE).x, make_inputs((m, n), dtype, DEVICE).weight
    args_config = _FORWARD_GRIDS[grid_name] or launch._heuristic_config("rmsnorm_fwd_kernel", n)
    outputs = {}
    for hold in (False, True):
        y, rstd = torch.full_like(x, float("nan")), torch.full((m,), float("nan"), device=DEVICE)
        args = launch._single_tile_forward_args(x, w, y, rstd, x, x, (n,) * 4, 1e-6, 0.0)
        grid, meta = launch._kernel_grid_and_meta(
            "rmsnorm_fwd_kernel", lambda meta: (launch._tile_programs(m, meta, x.device),),
            {"BLOCK_N": n, "HAS_RESIDUAL": False, "ROWS_CONTIGUOUS": True,
             "HOLD_STORAGE_FORM": hold, **args_config},
        )  # fmt: skip
        kernels.rmsnorm_fwd_kernel[grid](*args, **meta)
        outputs[hold] = y, rstd
    assert torch.equal(outputs[True][0], outputs[False][0])
    assert torch.equal(outputs[True][1], outputs[False][1])
