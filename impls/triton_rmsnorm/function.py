"""The differentiable op: input checks, [..., N] <-> [M, N] flattening, autograd wiring.

Two doors to the same kernels:
- eager calls go through ``RMSNormFunction`` (a torch.autograd.Function: the least host
  overhead per call);
- under torch.compile they go through the custom op ``rmsnorm_bench::rmsnorm`` (registered with
  torch.library, with fake implementations and a registered backward), so a compiled model keeps
  our kernels, forward and backward, with no graph break.
"""

from __future__ import annotations

import math

import torch

from . import dispatch, host_path, launch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def validate_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> None:
    """Raise a clear error, naming the argument, for anything the kernels do not support."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if x.dim() == 0:
        raise ValueError("x: expected at least one dimension [..., N], got a 0-d tensor")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x: the last dimension N must be > 0, got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x: dtype {x.dtype} is not supported; expected one of {SUPPORTED_DTYPES}")
    if weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"weight: dtype {weight.dtype} is not supported; expected one of {SUPPORTED_DTYPES}"
        )
    if out_dtype is not None and out_dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"out_dtype: {out_dtype} is not supported; expected one of {SUPPORTED_DTYPES}"
        )
    if tuple(weight.shape) != (n,):
        raise ValueError(
            f"weight: expected shape ({n},) to match x's last dimension, got {tuple(weight.shape)}"
        )
    if weight.device != x.device:
        raise ValueError(
            f"weight: on {weight.device} but x is on {x.device}; put both on one device"
        )
    for name, value in (("eps", eps), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, _SCALARS):
            raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    if not torch.compiler.is_compiling():
        check_scalars(eps, offset)
    launch.check_hidden_size(n)


#: Under torch.compile, after a second value dynamo passes eps (and offset) as symbolic floats:
#: math.isfinite cannot trace them, so while compiling their values are checked at run time,
#: inside the custom op (_rmsnorm_fwd_op), where they are real again.
_SCALARS = (int, float, torch.SymFloat, torch.SymInt)


def check_scalars(eps: float, offset: float) -> None:
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps}")
    if not math.isfinite(offset):
        raise ValueError(f"offset: expected a finite number, got {offset}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t's rows as a 2-D [M, N] tensor, a view of t where the kernels can address one: its last
    dimension contiguous and, for t of more than 2 dimensions, its leading dimensions merging
    into one row stride (t.reshape makes a view: slices of wider rows, say). Otherwise a
    contiguous copy (one): a last dimension that is not contiguous, or leading dimensions that
    do not merge, such as a [tokens, heads, head_dim] view of a packed QKV projection (the
    forward's x avoids that copy: _x_rows). A 2-D t is used as it is (no reshape: each tensor op
    costs host time at small shapes)."""
    t2d = t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


def _x_rows(x: torch.Tensor) -> torch.Tensor:
    """x's rows as the kernels read them, for a call without a residual: _rows(x), except where
    x's leading dimensions do not merge into one row stride but do into two, (outer, heads),
    over unit-stride rows of at most launch.TWO_LEVEL_MAX_N columns: the per-head norm of a
    packed projection, q = qkv[:, :4096].view(tokens, 32, 128) (row r at (r // 32) * 6144 +
    (r % 32) * 128). There a [outer, heads, N] view of x, which the forward and the backward read
    in place (launch.rmsnorm_forward); _rows would copy it. Other layouts that do not merge
    (three levels or more) are copied as _rows copies them."""
    if x.dim() > 2 and not x.is_contiguous():
        levels = _two_levels(x)
        if levels is not None:
            return x if x.dim() == 3 else x.view(*levels, x.shape[-1])
    return _rows(x)


def _two_levels(x: torch.Tensor) -> tuple[int, int] | None:
    """(outer, heads) where x's leading dimensions merge into exactly two strided levels (as
    torch.view merges dimensions: size-1 ones aside, a dimension joins the one inside it when
    its stride is that one's stride times its size) over unit-stride rows that the two-level
    kernels take; else None."""
    sizes, strides = x.shape, x.stride()
    if strides[-1] != 1 or sizes[-1] > launch.TWO_LEVEL_MAX_N:
        return None
    levels = []  # [size, stride] of each merged level, innermost first
    for size, stride in zip(reversed(sizes[:-1]), reversed(strides[:-1]), strict=True):
        if size == 1:
            continue
        if levels and stride == levels[-1][0] * levels[-1][1]:
            levels[-1][0] *= size
        elif len(levels) == 2:
            return None
        else:
            levels.append([size, stride])
    if len(levels) != 2:
        return None
    (heads, _), (outer, _) = levels
    return outer, heads


def _shaped(t2d: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """t2d [M, N] viewed as shape (no view op when shape is already 2-D)."""
    return t2d if len(shape) == 2 else t2d.view(shape)


# ---- eager door: autograd.Function -------------------------------------------------------------


class RMSNormFunction(torch.autograd.Function):
    """Fused RMSNorm with a fused backward; saves the normalized input (x, or h = x + residual),
    the weight and one fp32 rstd per row."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, offset, out_dtype):
        # x2d: [M, N] rows, or x's [outer, heads, N] view (_x_rows), which the backward reads too
        x2d = _rows(x) if residual is not None else _x_rows(x)
        residual2d = None if residual is None else _rows(residual)
        y2d, rstd, h2d = launch.rmsnorm_forward(
            x2d, weight, float(eps), float(offset), out_dtype, residual2d
        )
        ctx.save_for_backward(x2d if h2d is None else h2d, weight, rstd)
        ctx.offset = float(offset)
        ctx.has_residual = residual is not None
        ctx.shape = x.shape
        ctx.overrides = dispatch.backward_overrides_in_effect()  # for autograd's thread
        if h2d is None:
            return _shaped(y2d, x.shape)
        ctx.set_materialize_grads(False)  # an unused y or h sends no gradient
        return _shaped(y2d, x.shape), _shaped(h2d, x.shape)

    @staticmethod
    def backward(ctx, dy, dh=None):
        normalized2d, weight, rstd = ctx.saved_tensors
        if dy is None:  # only h was used downstream: y sends nothing, so dx = dr = dh, dw = 0
            return dh, torch.zeros_like(weight), dh, None, None, None
        dh2d = None if dh is None else _rows(dh)
        args = (_rows(dy), normalized2d, weight, rstd, ctx.offset, dh2d)
        if ctx.overrides:  # (no context manager on the common path: host time)
            with dispatch.overrides_of_forward(ctx.overrides):
                dx2d, dw = launch.rmsnorm_backward(*args)
        else:
            dx2d, dw = launch.rmsnorm_backward(*args)
        dx = _shaped(dx2d, ctx.shape)
        # h = x + r: x and the residual get the same gradient (autograd copies if it must)
        grads = (dx, dw, dx if ctx.has_residual else None, None, None, None)
        if torch.is_grad_enabled():  # create_graph=True: autograd records a graph of the grads
            rows_need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[2]  # x, residual
            return _raising_if_differentiated(grads, normalized2d, weight, rows_need_grad)
        return grads


def _c_apply(function: type):
    """torch.autograd.Function.apply's C core bound to `function`, or None where this torch
    does not expose it (then the Python classmethod serves every call)."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)
    except (AttributeError, KeyError, TypeError):
        return None


_RMSNORM_C_APPLY = _c_apply(RMSNormFunction)
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def _apply_rmsnorm(x, weight, residual, eps, offset, out_dtype):
    """RMSNormFunction.apply(...), with the C core called directly outside functorch transforms:
    there the Python classmethod only unwraps dead functorch wrappers (done here too) and binds
    default arguments for a Function with setup_context (this one has none), and it cost
    several µs a call on the H200's host (docs/perf-log.md). Under a transform (torch.func.*)
    the classmethod runs, and raises as before: this Function defines no setup_context."""
    if (_RMSNORM_C_APPLY is None or _unwrap_if_dead is None
            or torch._C._are_functorch_transforms_active()):  # fmt: skip
        return RMSNormFunction.apply(x, weight, residual, eps, offset, out_dtype)
    if residual is not None:
        residual = _unwrap_if_dead(residual)
    return _RMSNORM_C_APPLY(
        _unwrap_if_dead(x), _unwrap_if_dead(weight), residual, eps, offset, out_dtype
    )


DOUBLE_BACKWARD_ERROR = (
    "rmsnorm: double backward is not supported: the kernels' gradients cannot be differentiated "
    "again (torch.nn.functional.rms_norm's can)"
)


def _raising_if_differentiated(grads: tuple, normalized2d, weight, rows_need_grad: bool) -> tuple:
    """grads as returned under create_graph=True: aliases whose graph node raises if a later
    backward reaches it, instead of the kernels' gradients, which have no graph and would add
    nothing to a second-order gradient. The node's inputs include the saved rows' source (x, the
    tensor x's rows view, or the returned h) and w, so that a later backward towards x, r or w
    does reach it. torch's once_differentiable links only the incoming gradient, which needs no
    grad when dy is a constant. Where x or r needs a gradient and the saved rows link to neither
    (x's rows copied in the forward; h a [..., N] view's 2-D base), it raises now."""
    rows = normalized2d if normalized2d._base is None else normalized2d._base
    if rows_need_grad and not rows.requires_grad:
        raise RuntimeError(DOUBLE_BACKWARD_ERROR)
    anchors = [t for t in (rows, weight) if t.requires_grad]
    raising = torch._C._functions.DelayedError(
        DOUBLE_BACKWARD_ERROR.encode(), len(grads) + len(anchors)
    )
    return tuple(raising(*grads, *anchors)[: len(grads)])


# ---- compiled door: torch.library custom ops ------------------------------------------------------


@torch.library.custom_op("rmsnorm_bench::rmsnorm_fwd", mutates_args=())
def _rmsnorm_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None,
    eps: float,
    offset: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, rstd, h); h is an empty tensor when there is no residual."""
    check_scalars(eps, offset)  # real values here, also when traced symbolic (validate_inputs)
    residual2d = None if residual is None else _rows(residual)
    x2d = _x_rows(x) if residual is None else _rows(x)
    y2d, rstd, h2d = launch.rmsnorm_forward(x2d, weight, eps, offset, out_dtype, residual2d)
    h = x.new_empty(0) if h2d is None else h2d.view(x.shape)
    return y2d.view(x.shape), rstd, h


@_rmsnorm_fwd_op.register_fake
def _(x, weight, residual, eps, offset, out_dtype):
    rows = x.numel() // x.shape[-1]
    h = (
        x.new_empty(0)
        if residual is None
        else torch.empty_like(x, memory_format=torch.contiguous_format)
    )
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((rows,), dtype=torch.float32), h


@torch.library.custom_op("rmsnorm_bench::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd_op(
    dy: torch.Tensor,
    normalized: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    offset: float,
    dh_out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    dh2d = None if dh_out is None else _rows(dh_out)
    normalized2d = _x_rows(normalized) if dh_out is None else _rows(normalized)
    dx2d, dw = launch.rmsnorm_backward(_rows(dy), normalized2d, weight, rstd, offset, dh2d)
    return dx2d.view(normalized.shape), dw


@_rmsnorm_bwd_op.register_fake
def _(dy, normalized, weight, rstd, offset, dh_out):
    dx = torch.empty_like(normalized, memory_format=torch.contiguous_format)
    return dx, torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, residual, _eps, offset, _out_dtype = inputs
    _y, rstd, h = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if ctx.has_residual else x, weight, rstd)
    ctx.offset = offset


def _backward(ctx, dy, _drstd, dh):
    normalized, weight, rstd = ctx.saved_tensors
    if dy is None:  # only h was used downstream
        return dh, torch.zeros_like(weight), dh, None, None, None
    dh_out = dh if ctx.has_residual else None
    dx, dw = _rmsnorm_bwd_op(dy, normalized, weight, rstd, ctx.offset, dh_out)
    return dx, dw, dx if ctx.has_residual else None, None, None, None


_rmsnorm_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the public op ---------------------------------------------------------------------------------


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * (offset + weight).

    x: [..., N] in fp16, bf16 or fp32. Read in place when its last dimension is contiguous and
    its rows are one stride apart (a slice of a wider tensor) or, without a residual and N <=
    16384, in two levels (a [tokens, heads, head_dim] view of a packed QKV projection, as for
    per-head QK-norm); any other x is copied once (_rows, _x_rows). weight: [N] on x's device, fp16, bf16 or
    fp32 (e.g. an fp32 weight on bf16 activations). offset: 0 (Llama) or 1 (Gemma's 1 + w).
    out_dtype: the output dtype, default x's. Differentiable in x and weight, once: under
    create_graph=True, a second backward through the gradients raises; dx comes back in x's
    dtype, dw in weight's. Statistics in fp32; the output is rounded once.

    residual: pre-norm residual add. With r of x's shape and dtype, returns (y, h) where
    h = x + r (rounded once to x's dtype, the new residual stream) and y = RMSNorm(h); x and r
    are read once, y and h written once, and the backward carries h's gradient to x and r.
    """
    host = host_path.MODULE
    if (host is not None and residual is None and out_dtype is None and type(eps) is float
            and type(offset) is float and _host_may_serve(x, weight)):  # fmt: skip
        y = host.forward(x, weight, eps, offset)  # None: Python's path serves this call
        if y is not None:
            return y
    validate_inputs(x, weight, eps, offset, out_dtype)
    if residual is not None:
        _validate_residual(x, residual)
    if weight.stride(0) != 1:
        weight = weight.contiguous()  # the kernels read w unit-strided; N elements, gradient flows
    out_dtype = out_dtype or x.dtype
    if torch.compiler.is_compiling():
        y, _rstd, h = _rmsnorm_fwd_op(x, weight, residual, float(eps), float(offset), out_dtype)
        return y if residual is None else (y, h)
    if not _needs_grad(x, weight, residual):  # inference: no autograd node to build
        residual2d = None if residual is None else _rows(residual)
        x2d = _x_rows(x) if residual is None else _rows(x)
        y2d, _rstd, h2d = launch.rmsnorm_forward(
            x2d, weight, float(eps), float(offset), out_dtype, residual2d, keep_rstd=False
        )
        y = _shaped(y2d, x.shape)
        return y if h2d is None else (y, _shaped(h2d, x.shape))
    return _apply_rmsnorm(x, weight, residual, eps, offset, out_dtype)


#: The tensor types the C++ host path takes (a subclass's __torch_function__, a tensor without
#: storage, would be bypassed there): Python's path serves the rest.
_HOST_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _host_may_serve(x, weight) -> bool:
    """Whether the C++ host path (host_path.py) may take this call: plain tensors, and nothing
    in effect that the C++ node does not model (torch.compile, jit tracing, forward-mode AD,
    functorch transforms, a dispatch override, Triton launch hooks or debug mode)."""
    return (
        type(x) in _HOST_TENSORS
        and type(weight) in _HOST_TENSORS
        and dispatch.replay_tag() == ()
        and torch.autograd.forward_ad._current_level < 0
        and not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
        and torch._C._get_tracing_state() is None
        and not launch.direct.tritons_path_required()
    )


def _needs_grad(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Autograd will want a backward from this call, or forward-mode AD is active (dual tensors
    do not require grad; the autograd.Function then says it has no jvp instead of dropping the
    tangent)."""
    if torch.autograd.forward_ad._current_level >= 0:
        return True
    if not torch.is_grad_enabled():
        return False
    return (
        x.requires_grad or weight.requires_grad or (residual is not None and residual.requires_grad)
    )


def _validate_residual(x: torch.Tensor, residual: torch.Tensor) -> None:
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual: expected a torch.Tensor or None, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(
            f"residual: expected x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    if residual.dtype != x.dtype:
        raise TypeError(f"residual: dtype {residual.dtype} must match x's dtype {x.dtype}")
    if residual.device != x.device:
        raise ValueError(f"residual: on {residual.device} but x is on {x.device}")


def _host_backward(dy2d, x2d, weight, rstd, offset: float, rows_need_grad: bool):
    """The C++ host path's backward where it has no entry (host_path.py): Python's, as
    RMSNormFunction.backward runs it (with create_graph=True, gradients whose graph raises if
    differentiated again)."""
    dx2d, dw = launch.rmsnorm_backward(dy2d, x2d, weight, rstd, offset, None)
    if torch.is_grad_enabled():
        dx2d, dw = _raising_if_differentiated((dx2d, dw), x2d, weight, rows_need_grad)
    return dx2d, dw


host_path.BACKWARD = _host_backward
host_path.turn_on_as_set()
