"""Our op as users call it: rmsnorm(), the RMSNorm module, its limits and its errors."""

from __future__ import annotations

import pytest
import torch

from harness.checks import check_backend
from harness.inputs import make_inputs
from harness.oracle import TOLERANCES, compare, reference
from impls import get_backend
from impls.triton_rmsnorm import MAX_N, RMSNorm, dispatch, forward_launch, launch, rmsnorm
from impls.triton_rmsnorm.function import RMSNormFunction, _rmsnorm_fwd_op
from impls.triton_rmsnorm.launch import BACKWARD_SINGLE_TILE_MAX_N, SINGLE_TILE_MAX_N
from tests.conftest import DEVICE, ON_GPU

#: Our kernel's bounds: fused_fp32 on a GPU, the interpreter's variant on a CPU.
OURS = TOLERANCES[get_backend("triton").numerics]


def test_module_matches_torch_rmsnorm_semantics():
    """RMSNorm(N) with eps=None uses finfo(dtype).eps and a learnable weight, like torch's."""
    n = 768
    ours = RMSNorm(n, device=DEVICE, dtype=torch.bfloat16)
    theirs = torch.nn.RMSNorm(n, device=DEVICE, dtype=torch.bfloat16)
    assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]
    with torch.no_grad():
        ours.weight.copy_(torch.randn(n) * 0.3 + 1)
    x = make_inputs((2, 5, n), torch.bfloat16, DEVICE).x
    y = ours(x)
    ref = reference(x, ours.weight.detach(), torch.finfo(torch.bfloat16).eps)
    report = compare("y", y, ref.y, torch.bfloat16, OURS["y"], n)
    assert report.passed, report.summary()
    y.float().sum().backward()
    assert ours.weight.grad is not None and ours.weight.grad.shape == (n,)


def test_module_without_affine(monkeypatch):
    norm = RMSNorm((512,), eps=1e-5, elementwise_affine=False)
    assert norm.weight is None and list(norm.parameters()) == []
    x = make_inputs((8, 512), torch.float32, DEVICE).x
    ones = torch.ones(512, device=DEVICE)
    ref = reference(x, ones, 1e-5)
    report = compare("y", norm(x), ref.y, torch.float32, OURS["y"], 512)
    assert report.passed, report.summary()
    assert norm.state_dict() == {} and list(norm.buffers()) == []  # as torch.nn.RMSNorm's
    made = []
    real_ones = torch.ones
    monkeypatch.setattr(torch, "ones", lambda *a, **k: made.append(a) or real_ones(*a, **k))
    norm(x)
    assert made == []  # the unit weight is made once, not at every call
    y16 = norm(x.to(torch.bfloat16))  # another dtype: a weight of x's dtype, y in x's dtype
    assert y16.dtype == torch.bfloat16 and len(made) == 1
    with torch.device("meta"):  # built on meta, then materialized: no uninitialised state
        lazy = RMSNorm((512,), eps=1e-5, elementwise_affine=False)
    lazy.to_empty(device=DEVICE)
    assert torch.equal(lazy(x), norm(x))


def test_module_rejects_multi_dim_normalized_shape():
    with pytest.raises(ValueError, match="normalized_shape"):
        RMSNorm((4, 512))


def test_empty_batch_returns_empty():
    x = torch.empty(0, 256, device=DEVICE, dtype=torch.float16, requires_grad=True)
    w = torch.ones(256, device=DEVICE, dtype=torch.float16, requires_grad=True)
    y = rmsnorm(x, w)
    assert y.shape == (0, 256)
    y.sum().backward()
    assert x.grad.shape == (0, 256) and torch.equal(w.grad, torch.zeros_like(w))


def test_hidden_size_above_int32_raises():
    x = torch.empty(0, MAX_N + 1, device="meta", dtype=torch.bfloat16)
    w = torch.empty(MAX_N + 1, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"N={MAX_N + 1} exceeds {MAX_N}"):
        rmsnorm(x, w)


@pytest.mark.parametrize(
    "shape, dtype",
    [((3, SINGLE_TILE_MAX_N + 1), torch.bfloat16), ((5, 2 * SINGLE_TILE_MAX_N + 3), torch.float16),
     ((2, 3, 70000), torch.float32), ((6, BACKWARD_SINGLE_TILE_MAX_N + 100), torch.bfloat16)],
    ids=["bf16-3x65537", "fp16-5x131075", "fp32-2x3x70000", "bf16-6x16484-looped-bwd-only"],
)  # fmt: skip
def test_rows_wider_than_one_tile(shape, dtype):
    """The looped and split paths: no hidden-size cap at the single-tile limit. Fewer rows than
    the programs cap (3 here on the CPU, under 132 SMs on an H200) split each row across
    programs; more rows go one program per row."""
    rows = shape[0] if len(shape) == 2 else shape[0] * shape[1]
    split = launch.rows_are_split(rows, torch.device(DEVICE))
    assert split == (rows < launch._programs_cap(torch.device(DEVICE)))
    inputs = make_inputs(shape, dtype, DEVICE)
    result = check_backend(get_backend("triton"), rmsnorm, inputs)
    assert result.passed, result.summary()


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_looped_forward_serves_rows_the_single_tile_also_serves(monkeypatch, with_residual):
    """Rows in (FORWARD_LOOPED_FROM_N, SINGLE_TILE_MAX_N] may take the persistent looped forward
    when it measures faster: force it there, with more rows than programs (the row loop), and
    N not a multiple of its chunk."""
    monkeypatch.setattr(forward_launch, "SINGLE_TILE_MAX_N", launch.FORWARD_LOOPED_FROM_N)
    shape = (9 if DEVICE == "cpu" else 1000, launch.FORWARD_LOOPED_FROM_N + 1000)
    assert launch.forward_is_looped(shape[1])
    op = "add_rmsnorm" if with_residual else "rmsnorm"
    backend = get_backend("triton-add" if with_residual else "triton")
    inputs = make_inputs(shape, torch.bfloat16, DEVICE, with_residual=with_residual)
    result = check_backend(backend, backend.build(), inputs)
    assert result.passed, (op, result.summary())


@pytest.mark.parametrize(
    "shape, dtype",
    [((1000, 128), torch.bfloat16), ((77, 64), torch.float16), ((2, 5, 300), torch.float32)],
    ids=["bf16-1000x128", "fp16-77x64", "fp32-2x5x300"],
)  # fmt: skip
def test_narrow_rows_several_per_program(shape, dtype):
    """Narrow rows go BLOCK_M at a time (a [BLOCK_M, BLOCK_N] tile): M not a multiple of BLOCK_M,
    and backward chunks that end inside a tile, must leave the masked rows out."""
    n = shape[-1]
    assert launch.rows_per_tile("rmsnorm_fwd_kernel", launch.block_size(n)) > 1
    rows = shape[0] if len(shape) == 2 else shape[0] * shape[1]
    assert rows % launch.rows_per_tile("rmsnorm_bwd_kernel", launch.block_size(n)) != 0
    inputs = make_inputs(shape, dtype, DEVICE)
    result = check_backend(get_backend("triton"), rmsnorm, inputs)
    assert result.passed, result.summary()


@pytest.mark.parametrize(
    "make_args, error, match",
    [
        (lambda x, w: (x, w[:-1], 1e-6), ValueError, r"weight: expected shape \(256,\)"),
        (lambda x, w: (x, w.double(), 1e-6), TypeError, "weight: dtype torch.float64"),
        (lambda x, w: (x.to(torch.int32), w, 1e-6), TypeError, "x: dtype"),
        (lambda x, w: (x[:, :0], w[:0], 1e-6), ValueError, "x: the last dimension N must be > 0"),
        (lambda x, w: (x, w, -1.0), ValueError, "eps: expected a finite number >= 0"),
        (lambda x, w: (x, w, float("nan")), ValueError, "eps: expected a finite number >= 0"),
        (lambda x, w: (x, w, "1e-6"), TypeError, "eps: expected a float"),
        (lambda x, w: (x.sum(), w, 1e-6), ValueError, "x: expected at least one dimension"),
        (lambda x, w: (x.double(), w.double(), 1e-6), TypeError, "x: dtype torch.float64"),
        (lambda x, w: (x, w.to("meta"), 1e-6), ValueError, "weight: on meta but x is on"),
        (lambda x, w: (x, w, float("inf")), ValueError, "eps: expected a finite number >= 0"),
        (lambda x, w: (x.tolist(), w, 1e-6), TypeError, "x: expected a torch.Tensor"),
    ],
    ids=["weight-shape", "weight-dtype", "int-x", "n-zero", "negative-eps", "nan-eps",
         "str-eps", "scalar-x", "float64", "weight-device", "inf-eps", "list-x"],
)  # fmt: skip
def test_bad_input_names_the_argument(make_args, error, match):
    x = torch.randn(4, 256, device=DEVICE, dtype=torch.float16)
    w = torch.ones(256, device=DEVICE, dtype=torch.float16)
    with pytest.raises(error, match=match):
        rmsnorm(*make_args(x, w))


def test_bad_keyword_arguments_name_the_argument():
    x = torch.randn(4, 256, device=DEVICE, dtype=torch.float16)
    w = torch.ones(256, device=DEVICE, dtype=torch.float16)
    with pytest.raises(TypeError, match="out_dtype: torch.int8 is not supported"):
        rmsnorm(x, w, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="offset: expected a finite number"):
        rmsnorm(x, w, offset=float("inf"))
    with pytest.raises(TypeError, match="offset: expected a float"):
        rmsnorm(x, w, offset=None)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_inference_calls_skip_autograd_and_give_the_same_bits(with_residual):
    """Without gradients wanted (no_grad, inference_mode, or no input requiring grad) the op
    launches the same kernels without building an autograd node: same outputs, bit for bit."""
    inputs = make_inputs((3, 5, 300), torch.bfloat16, DEVICE, with_residual=with_residual)
    kwargs = {"residual": inputs.residual} if with_residual else {}
    x = inputs.x.detach().requires_grad_(True)
    trained = rmsnorm(x, inputs.weight, inputs.eps, **kwargs)
    trained = trained if with_residual else (trained,)
    assert all(t.grad_fn is not None for t in trained)

    def no_autograd_function(*args, **kwargs):
        raise AssertionError("an inference call went through RMSNormFunction")

    for context in (torch.no_grad, torch.inference_mode):
        with context(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(RMSNormFunction, "apply", no_autograd_function)
            out = rmsnorm(x, inputs.weight, inputs.eps, **kwargs)
        out = out if with_residual else (out,)
        assert len(out) == len(trained)
        for got, want in zip(out, trained, strict=True):
            assert got.grad_fn is None and got.shape == want.shape
            assert torch.equal(got, want.detach())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RMSNormFunction, "apply", no_autograd_function)
        plain = rmsnorm(inputs.x, inputs.weight, inputs.eps, **kwargs)  # nothing requires grad
    plain = plain if with_residual else (plain,)
    assert all(torch.equal(got, want.detach()) for got, want in zip(plain, trained, strict=True))


def test_a_residual_alone_requiring_grad_gets_its_gradient():
    """Only r requires grad: the call must still build the autograd node (not the inference
    shortcut), and r's gradient is dh + dx."""
    inputs = make_inputs((4, 256), torch.float32, DEVICE, with_residual=True)
    r = inputs.residual.detach().requires_grad_(True)
    y, h = rmsnorm(inputs.x, inputs.weight, inputs.eps, residual=r)
    assert y.requires_grad and h.requires_grad
    (y * inputs.dy).sum().backward()
    h_ref = (inputs.x + inputs.residual).detach().requires_grad_(True)
    ref = h_ref * torch.rsqrt(h_ref.pow(2).mean(-1, keepdim=True) + inputs.eps) * inputs.weight
    (ref * inputs.dy).sum().backward()
    torch.testing.assert_close(r.grad, h_ref.grad, rtol=1e-4, atol=1e-5)


def test_forward_mode_ad_says_it_is_unsupported_instead_of_dropping_the_tangent():
    """Dual tensors do not require grad; the call must not take the inference shortcut, which
    would return a plain tensor and lose the tangent silently."""
    import torch.autograd.forward_ad as fwad

    inputs = make_inputs((4, 256), torch.float32, DEVICE)
    with fwad.dual_level(), pytest.raises((NotImplementedError, RuntimeError)):
        dual = fwad.make_dual(inputs.x, torch.ones_like(inputs.x))
        rmsnorm(dual, inputs.weight, inputs.eps)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_the_direct_apply_gives_the_functions_outputs_node_and_gradients(
    monkeypatch, with_residual, python_host_path
):
    """rmsnorm calls autograd.Function.apply's C core directly (function._apply_rmsnorm): the
    same outputs, graph node and gradients as RMSNormFunction.apply, which serves when the core
    is not exposed (the fallback, forced here)."""
    from impls.triton_rmsnorm import function

    inputs = make_inputs((6, 256), torch.bfloat16, DEVICE, with_residual=with_residual)

    def call():
        x = inputs.x.detach().requires_grad_(True)
        w = inputs.weight.detach().requires_grad_(True)
        r = inputs.residual.detach().requires_grad_(True) if with_residual else None
        out = rmsnorm(x, w, inputs.eps, residual=r)
        y = out[0] if with_residual else out
        leaves = (x, w) if r is None else (x, w, r)
        return y, type(y.grad_fn).__name__, torch.autograd.grad(y, leaves, inputs.dy)

    assert function._RMSNORM_C_APPLY is not None  # this torch exposes it
    direct = call()
    monkeypatch.setattr(function, "_RMSNORM_C_APPLY", None)
    classmethod_ = call()
    assert direct[1] == classmethod_[1] == "RMSNormFunctionBackward"
    assert torch.equal(direct[0], classmethod_[0])
    assert all(torch.equal(a, b) for a, b in zip(direct[2], classmethod_[2], strict=True))


def test_a_dead_functorch_wrapper_is_unwrapped_as_the_classmethod_does():
    """A tensor leaked out of a finished torch.func transform (a dead wrapper) is unwrapped
    before the direct apply, as Function.apply's classmethod unwraps it: a plain result."""
    leaked = []

    def keep(x):
        leaked.append(x)
        return x.sum()

    inputs = make_inputs((4, 256), torch.float32, DEVICE)
    torch.func.grad(keep)(inputs.x)
    (dead,) = leaked
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead)
    w = inputs.weight.detach().requires_grad_(True)
    y = rmsnorm(dead, w, inputs.eps)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(y)
    assert torch.equal(y, rmsnorm(inputs.x, w, inputs.eps))
    (dw,) = torch.autograd.grad(y, (w,), inputs.dy)
    assert dw.shape == w.shape


def test_functorch_transforms_take_the_classmethod_and_its_error():
    """Under torch.func.grad the Function's classmethod runs (not the direct C call), and says
    that this Function does not support functorch transforms, as it always did."""
    inputs = make_inputs((4, 256), torch.float32, DEVICE)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: rmsnorm(x, inputs.weight, inputs.eps).sum())(inputs.x)


@pytest.mark.parametrize("shape", [(4, 256), (2, 3, 256)], ids=["2d", "3d"])
def test_double_backward_raises_instead_of_dropping_the_term(shape):
    """create_graph=True: the first-order gradients come back right, and a second backward
    through them must raise, not add nothing (a gradient penalty through the norm would
    silently lose its term), even when dy is a constant; both doors."""
    inputs = make_inputs(shape, torch.float32, DEVICE)
    x = inputs.x.clone().requires_grad_(True)
    w = inputs.weight.clone().requires_grad_(True)
    want = reference(inputs.x, inputs.weight, inputs.eps, inputs.dy).dx
    y = rmsnorm(x, w, inputs.eps)
    (dx,) = torch.autograd.grad((y * inputs.dy).sum(), x, create_graph=True)
    torch.testing.assert_close(dx, want.to(dx.dtype), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(dx.pow(2).sum() + x.sum(), x)
    # with a residual the saved rows are h, which a 3-D call returns only as a view
    y, _h = rmsnorm(x, w, inputs.eps, residual=torch.randn_like(inputs.x))
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        (dx,) = torch.autograd.grad((y * inputs.dy).sum(), x, create_graph=True)
        torch.autograd.grad(dx.pow(2).sum() + x.sum(), x)
    # the custom op (torch.compile's door) has no formula for its backward's backward
    y, _rstd, _h = _rmsnorm_fwd_op(x, w, None, inputs.eps, 0.0, x.dtype)
    (dx,) = torch.autograd.grad((y * inputs.dy).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx.pow(2).sum() + x.sum(), x)


def test_create_graph_is_fine_where_no_second_backward_reaches_the_norm():
    """A penalty on a later layer's gradient under create_graph=True differentiates the norm's
    forward only, once: no error, and the same gradient as without create_graph."""
    inputs = make_inputs((4, 256), torch.float32, DEVICE)
    w = inputs.weight.clone().requires_grad_(True)
    head = torch.randn_like(inputs.x, requires_grad=True)
    x = inputs.x.clone().requires_grad_(True)
    loss = (rmsnorm(x, w, inputs.eps) * head).sum()
    _dx, dhead = torch.autograd.grad(loss, (x, head), create_graph=True)
    (dw,) = torch.autograd.grad(dhead.pow(2).sum(), w)
    w_ref = inputs.weight.clone().requires_grad_(True)
    y_ref = rmsnorm(inputs.x, w_ref, inputs.eps)
    (dw_ref,) = torch.autograd.grad(y_ref.pow(2).sum(), w_ref)
    torch.testing.assert_close(dw, dw_ref)


def test_gradients_reach_leaf_inputs_of_any_rank():
    inputs = make_inputs((2, 3, 4, 640), torch.float16, DEVICE)
    x = inputs.x.clone().requires_grad_(True)
    w = inputs.weight.clone().requires_grad_(True)
    y = rmsnorm(x, w, inputs.eps)
    y.backward(inputs.dy)
    ref = reference(inputs.x, inputs.weight, inputs.eps, inputs.dy)
    tol = OURS
    for name, got, want, k in (("dx", x.grad, ref.dx, 640), ("dw", w.grad, ref.dw, 24)):
        report = compare(name, got, want, torch.float16, tol[name], k)
        assert report.passed, report.summary()


@pytest.mark.skipif(not ON_GPU, reason="autotuning needs a GPU to time configs")
def test_autotuned_launch_matches_the_oracle():
    """Every kernel tuned (dispatch.tuning: single tile, looped, residual variants), then the
    calls served by the tuned entries, against the oracle."""
    shapes = [
        (512, 4096),
        (8, BACKWARD_SINGLE_TILE_MAX_N * 2),  # forward: the faster of two paths, measured
        (4, SINGLE_TILE_MAX_N * 2),  # split rows
        (300, SINGLE_TILE_MAX_N * 2 + 8),  # persistent looped forward, its grid tuned
    ]
    with dispatch.tuning() as table:
        for shape in shapes:
            result = check_backend(
                get_backend("triton"), rmsnorm, make_inputs(shape, torch.bfloat16, DEVICE)
            )
            assert result.passed, result.summary()
        assert len(table) >= len(shapes)


@pytest.mark.parametrize("kernel_name", ["rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"])
def test_autotune_space_has_configs_for_every_single_tile_width(kernel_name):
    """The tuner's pruned space (CPU-checkable: it is plain Python) is never empty, holds whole
    rows per tile within MAX_TILE elements, and takes narrow rows several at a time."""
    prune = launch._prune_tiles(kernel_name)
    configs = launch._configs(kernel_name)
    widest = (
        forward_launch.SINGLE_TILE_MAX_N if kernel_name == "rmsnorm_fwd_kernel"
        else launch.BACKWARD_SINGLE_TILE_MAX_N
    )  # fmt: skip
    x = torch.empty(0)
    for log_n in range(0, widest.bit_length()):
        block_n = 2**log_n
        kept = prune(configs, {"M": 1 << 20, "X": x, "rows_per_program": 1 << 13}, BLOCK_N=block_n)
        assert kept, f"N={block_n}: no config left"
        for config in kept:
            tile = config.kwargs["BLOCK_M"] * block_n
            assert tile <= launch.MAX_TILE
            h = launch.rows_per_tile(kernel_name, block_n)
            assert config.kwargs["BLOCK_M"] >= (
                h // 2 if kernel_name == "rmsnorm_fwd_kernel" else h
            )
        if block_n <= 256:
            assert min(c.kwargs["BLOCK_M"] for c in kept) > 1
    if kernel_name == "rmsnorm_bwd_kernel":  # a program with 5 rows gets no taller tile than 8
        kept = prune(configs, {"M": 660, "X": x, "rows_per_program": 5}, BLOCK_N=128)
        assert kept and {c.kwargs["BLOCK_M"] for c in kept} == {8}
