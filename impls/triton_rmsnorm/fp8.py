"""RMSNorm with fp8 output: ``rmsnorm_fp8``, its launcher and its autograd wiring.

Layers as the plain op's: fp8_kernels.py (@triton.jit) -> the launcher here
(rmsnorm_fp8_forward: allocation, launch configuration) -> RMSNormFp8Function (eager door) and
the custom op ``rmsnorm_bench::rmsnorm_fp8_fwd`` (torch.compile door) -> ``rmsnorm_fp8``.

Convention: q = sat(rn(y / scale)) in the fp8 format, y ~ q * scale. Dynamic scales (per token,
1 x 128 blocks) are amax(|y|) / fp8_max, floored at FLT_MIN; a static (per-tensor) scale is the
caller's fp32 tensor of one element, read on the device.

Block scales are [M, ceil(N / 128)] fp32, one per 128 columns of a row, in one of two layouts:
- "column_major" (default): strides (1, align(M, 4)), the M-major, TMA-aligned layout that
  DeepGEMM's fp8 GEMMs read for the activations' scales (its get_mn_major_tma_aligned_tensor;
  vLLM's and SGLang's per_token_group_quant_fp8 with column_major_scales=True);
- "row_major": contiguous [M, G] (vLLM's and SGLang's default, FlashInfer's).

Backward: straight through the quantization. The gradient arrives for the dequantized y; dx and
dw come from the saved rstd through the plain op's backward (launch.rmsnorm_backward), no second
reduction. Autograd converts any gradient for an fp8 tensor to fp8 (it casts to the tensor's
dtype), so the gradient cannot travel on q itself: with ``grad_port=True`` the op also returns
``dy_port``, an [..., N] tensor of x's dtype with zero strides (one element, never read) whose
gradient is taken as dy. An fp8 GEMM's autograd function takes q, the scales and dy_port, and
returns its dgrad for dy_port.
"""

from __future__ import annotations

import contextlib

import torch

from . import common, fp8_kernels, fp8_table, launch
from .function import _needs_grad, _rows, _shaped, _validate_residual, validate_inputs

SCALINGS = ("per_token", "per_tensor", "block")
_SCALING_CODES = {"per_token": 0, "per_tensor": 1, "block": 2}
#: The fp8 formats and their largest finite values.
FP8_MAX = {dt: torch.finfo(dt).max for dt in (torch.float8_e4m3fn, torch.float8_e5m2)}
#: Columns per block scale (DeepSeek-V3's 1 x 128 activation blocks).
BLOCK_GROUP = 128
SCALE_LAYOUTS = ("column_major", "row_major")
#: Rows of column-major block scales are padded to this many (16 bytes of fp32: TMA's alignment).
SCALE_ROW_ALIGN = 4
#: Widest row the single-tile fp8 kernel takes (x, y and the codes in registers); wider rows
#: are walked in FP8_LOOPED_CHUNK-column steps by one program each
#: (fp8_kernels.rmsnorm_fp8_fwd_looped_kernel).
FP8_SINGLE_TILE_MAX_N = 32768
#: The looped kernel's step: a multiple of BLOCK_GROUP (each block's scale from one step).
FP8_LOOPED_CHUNK = 4096
#: The looped kernel's warps (not tuned: ~16 columns a thread a step).
FP8_LOOPED_WARPS = 8

#: Configurations set in this process: (scaling, BLOCK_N, x's itemsize, TAIL_N) -> {"BLOCK_M",
#: "num_warps"}, read before the GPU's committed launch table (fp8_table.py).
FP8_LAUNCH_TABLE: dict[tuple[str, int, int, int], dict] = {}


@contextlib.contextmanager
def launch_table_entry(key: tuple[str, int, int, int], config: dict | None):
    """FP8_LAUNCH_TABLE[key] = config inside the with block (None leaves the entry as it is),
    then the entry as it was: the tuner and the probes time a configuration this way."""
    saved = FP8_LAUNCH_TABLE.get(key)
    if config is not None:
        FP8_LAUNCH_TABLE[key] = config
    try:
        yield
    finally:
        if saved is None:
            FP8_LAUNCH_TABLE.pop(key, None)
        else:
            FP8_LAUNCH_TABLE[key] = saved


def fp8_block_n(n: int, scaling: str) -> int:
    """The kernel's tile width: the row padded to a power of two (a whole group at least)."""
    block_n = launch.next_power_of_2(n)
    return max(block_n, BLOCK_GROUP) if scaling == "block" else block_n


def fp8_tiles(n: int, scaling: str, split: bool = False) -> tuple[int, int]:
    """(BLOCK_N, TAIL_N): the one tile padded to a power of two (TAIL_N 0), or with split, where
    it has fewer columns, the largest power of two <= n and a tail tile for the rest (a power of
    two, a whole group at least with block scaling): 4608 -> (4096, 512) instead of 8192."""
    padded = fp8_block_n(n, scaling)
    main = 1 << (n.bit_length() - 1)
    if not split or main == n or (scaling == "block" and main < BLOCK_GROUP):
        return padded, 0
    tail = launch.next_power_of_2(n - main)
    if scaling == "block":
        tail = max(tail, BLOCK_GROUP)
    return (main, tail) if main + tail < padded else (padded, 0)


def _entry_config(key: tuple, device: torch.device | None) -> dict | None:
    """FP8_LAUNCH_TABLE's configuration for key, else the committed table's of device's GPU
    class (a CUDA device), else None."""
    entry = FP8_LAUNCH_TABLE.get(key)
    if entry is not None:
        return dict(entry)
    if device is not None and device.type == "cuda" and not launch.interpreting():
        tabled = fp8_table.committed(common.gpu_name(device.index or 0)).get(key)
        if tabled is not None:
            return tabled.config
    return None


def choose_tiles(n: int, scaling: str, itemsize: int, device: torch.device | None = None,
                 split: bool | None = None) -> tuple[int, int]:  # fmt: skip
    """(BLOCK_N, TAIL_N) for a row of n columns: split None takes the split tile where it has
    fewer columns than the padded one and a table holds an entry for it (fp8_tune writes one
    only where the split timed faster), else the padded tile; True or False forces it."""
    if split is not None:
        return fp8_tiles(n, scaling, split)
    tiles = fp8_tiles(n, scaling, True)
    if tiles[1] and _entry_config((scaling, tiles[0], itemsize, tiles[1]), device) is not None:
        return tiles
    return fp8_tiles(n, scaling)


def fp8_launch_config(
    n: int, scaling: str, itemsize: int, device: torch.device | None = None,
    tiles: tuple[int, int] | None = None,
) -> dict:  # fmt: skip
    """BLOCK_M and num_warps for a row of n columns in tiles (BLOCK_N, TAIL_N; default the padded
    tile): FP8_LAUNCH_TABLE's entry, else the launch table of device's GPU class (fp8_table.py;
    a CUDA device), else the plain single-tile forward's heuristic for the BLOCK_N tile (about
    TILE_TARGET elements a tile, ~256 a warp)."""
    block_n, tail_n = tiles or fp8_tiles(n, scaling)
    config = _entry_config((scaling, block_n, itemsize, tail_n), device)
    if config is not None:
        return config
    return heuristic_fp8_launch_config(block_n)


def heuristic_fp8_launch_config(block_n: int) -> dict:
    """The plain single-tile forward's heuristic for a tile of block_n columns."""
    block_m = launch.rows_per_tile("rmsnorm_fwd_kernel", block_n)
    return {"BLOCK_M": block_m, "num_warps": launch.heuristic_num_warps(block_m * block_n)}


def block_scales_shape(m: int, n: int) -> tuple[int, int]:
    return m, launch.cdiv(n, BLOCK_GROUP)


def _empty_scales(m: int, n: int, scaling: str, layout: str, device) -> torch.Tensor:
    if scaling == "per_token":
        return torch.empty((m,), dtype=torch.float32, device=device)
    groups = launch.cdiv(n, BLOCK_GROUP)
    if layout == "row_major":
        return torch.empty((m, groups), dtype=torch.float32, device=device)
    aligned = launch.cdiv(m, SCALE_ROW_ALIGN) * SCALE_ROW_ALIGN
    return torch.empty_strided((m, groups), (1, aligned), dtype=torch.float32, device=device)


def rmsnorm_fp8_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    scaling: str,
    scale: torch.Tensor | None,
    fp8_dtype: torch.dtype,
    residual: torch.Tensor | None = None,
    scale_layout: str = "column_major",
    cast_in_kernel: bool | None = None,
    reciprocal: bool = True,
    clamp_before_cast: bool | None = None,
    split_tile: bool | None = None,
    amax_with_sum: bool = True,
    w_as_row: bool = True,
    narrow_codes: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(q, scales, rstd, h) for a 2-D x [M, N] with a contiguous last dimension; scales is None
    per tensor (the caller has it), h None without a residual. Allocates q, the scales, rstd
    (and h) only, so it can be captured in a CUDA graph once the kernel is compiled.
    cast_in_kernel: None (default) converts to fp8 in the kernel except under the interpreter;
    False stores the saturated fp32 values and converts them with torch (the GPU test compares
    the two bitwise). reciprocal (default): multiply by one correctly rounded 1 / scale per scale
    instead of dividing each element (fp8_kernels.rmsnorm_fp8_fwd_kernel's RECIPROCAL: faster, and
    within the fp8 oracle; docs/perf-log.md); False divides exactly. clamp_before_cast (single
    tile): None (default) leaves the clamp to +-max to the conversion instruction where the cast
    is in the kernel on sm_89 or later (cvt.rn.satfinite clamps and keeps NaN: the same codes),
    and clamps first elsewhere; True always clamps first; False never (the in-kernel cast only;
    fp8_kernels' SATURATE). split_tile (single tile only): True, a power-of-two tile and a tail
    tile where that has fewer columns than the padded tile (fp8_tiles; the kernel's TAIL_N);
    False, the padded tile; None (default), as the launch table says (choose_tiles).
    amax_with_sum (per token, single tile; default True): the row's amax in the sum of squares'
    reduction (the kernel's AMAX_WITH_SUM). w_as_row (single tile; default True): w loaded as a
    [1, BLOCK_N] row in x's layout, not converted through shared memory (the kernel's W_AS_ROW;
    the same arithmetic). The three defaults were timed on the H200 (docs/perf-log.md,
    thirty-fourth session); False keeps the earlier form of each. narrow_codes (single tile):
    the codes stored 8 a thread, the layout of h's 16-bit store, so a tile with a residual is not
    converted through shared memory (the kernel's NARROW_CODES; another layout, so the sum of
    squares' bits may differ); None (default) stores them so with a residual per token and per
    tensor, where the H200 timed it faster (per 1x128 block it was not; docs/perf-log.md,
    thirty-fifth session)."""
    launch._check_runnable(x)
    m, n = x.shape
    launch.check_hidden_size(n)
    interpreting = launch.interpreting()
    if cast_in_kernel is None:
        cast_in_kernel = not interpreting
    for name, value, may_be_none in (("split_tile", split_tile, True),
                                     ("clamp_before_cast", clamp_before_cast, True),
                                     ("amax_with_sum", amax_with_sum, False),
                                     ("w_as_row", w_as_row, False),
                                     ("narrow_codes", narrow_codes, True)):  # fmt: skip
        if type(value) is not bool and not (may_be_none and value is None):
            wanted = "True, False or None" if may_be_none else "True or False"
            raise TypeError(f"{name}: expected {wanted}, got {value!r}")
    clamp_before_cast = clamps_before_cast(clamp_before_cast, cast_in_kernel, x.device)
    if narrow_codes is None:
        narrow_codes = residual is not None and scaling != "block"
    q_dtype = fp8_dtype if cast_in_kernel else torch.float32
    q = torch.empty((m, n), dtype=q_dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    scales = (
        None if scaling == "per_tensor" else _empty_scales(m, n, scaling, scale_layout, x.device)
    )
    h = None if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m > 0:
        r_arg, h_arg = (x, x) if residual is None else (residual, h)
        s_arg = rstd if scales is None else scales
        s_strides = (s_arg.stride(0), s_arg.stride(1) if s_arg.dim() == 2 else 0)
        static = rstd if scale is None else scale
        common_args = (x, weight, q, s_arg, rstd, r_arg, h_arg, static, x.stride(0), q.stride(0),
                       r_arg.stride(0), h_arg.stride(0), *s_strides)  # fmt: skip
        if n > FP8_SINGLE_TILE_MAX_N:
            with launch._on_device(x):
                launch._launch_fixed(
                    fp8_kernels.rmsnorm_fp8_fwd_looped_kernel, (m,), *common_args,
                    m, n, eps, offset, num_warps=4 if interpreting else FP8_LOOPED_WARPS,
                    FP8_MAX=FP8_MAX[fp8_dtype], SCALING=_SCALING_CODES[scaling],
                    GROUP=BLOCK_GROUP, CHUNK=FP8_LOOPED_CHUNK, HAS_RESIDUAL=residual is not None,
                    CAST_IN_KERNEL=cast_in_kernel, RECIPROCAL=reciprocal,
                )  # fmt: skip
            return _converted(q, fp8_dtype, cast_in_kernel), scales, rstd, h
        block_n, tail_n = choose_tiles(n, scaling, x.element_size(), x.device, split_tile)
        config = fp8_launch_config(n, scaling, x.element_size(), x.device, (block_n, tail_n))
        block_m = config["BLOCK_M"]
        programs = launch.cdiv(m, block_m)
        with launch._on_device(x):
            launch._launch_fixed(
                fp8_kernels.rmsnorm_fp8_fwd_kernel, (programs,), *common_args, m, n, eps, offset,
                num_warps=4 if interpreting else config["num_warps"],
                FP8_MAX=FP8_MAX[fp8_dtype], SCALING=_SCALING_CODES[scaling], GROUP=BLOCK_GROUP,
                GROUPS=block_n // BLOCK_GROUP, BLOCK_M=block_m, BLOCK_N=block_n,
                HAS_RESIDUAL=residual is not None, CAST_IN_KERNEL=cast_in_kernel,
                ROWS_CONTIGUOUS=all(t.stride(0) == n for t in (x, q, r_arg, h_arg)),
                RECIPROCAL=reciprocal, SATURATE=clamp_before_cast, TAIL_N=tail_n,
                AMAX_WITH_SUM=amax_with_sum and scaling == "per_token", W_AS_ROW=w_as_row,
                ROW_SCALARS=block_m == 1 and tail_n > 0, NARROW_CODES=narrow_codes,
                W_EARLY=common.loads_w_early(programs, x.device), **common.pdl_switches(x.device),
            )  # fmt: skip
    return _converted(q, fp8_dtype, cast_in_kernel), scales, rstd, h


def clamps_before_cast(asked: bool | None, cast_in_kernel: bool, device: torch.device) -> bool:
    """Whether the kernel clamps to +-max before its fp8 cast (the kernel's SATURATE): as asked,
    or (None) unless the cast is in the kernel, compiled (not the interpreter, whose cast does
    not saturate) and saturating on this device (common.cast_saturates)."""
    if asked is None:
        return not (cast_in_kernel and not launch.interpreting() and common.cast_saturates(device))
    if not asked and not cast_in_kernel:
        raise ValueError("clamp_before_cast=False needs the in-kernel cast (cast_in_kernel): "
                         "torch's conversion of the stored fp32 values does not saturate")  # fmt: skip
    return asked


def _converted(q: torch.Tensor, fp8_dtype: torch.dtype, cast_in_kernel: bool) -> torch.Tensor:
    """q as fp8 codes: the kernel's own, or (the interpreter, whose fp8 conversion is wrong)
    the saturated fp32 values it stored, converted by torch."""
    return q if cast_in_kernel else q.to(fp8_dtype)


def _dy_port(x: torch.Tensor) -> torch.Tensor:
    """The straight-through gradient's carrier: x's shape and dtype, one element of storage."""
    return torch.empty_strided(tuple(x.shape), (0,) * x.dim(), dtype=x.dtype, device=x.device)


# ---- eager door: autograd.Function -------------------------------------------------------------


class RMSNormFp8Function(torch.autograd.Function):
    """Saves the normalized rows (x, or h = x + residual), the weight and rstd; the gradient of
    the dequantized y arrives on dy_port (q and the scales are not differentiable)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, offset, scaling, scale, fp8_dtype, scale_layout):
        x2d = _rows(x)
        residual2d = None if residual is None else _rows(residual)
        q2d, scales, rstd, h2d = rmsnorm_fp8_forward(
            x2d, weight, eps, offset, scaling, scale, fp8_dtype, residual2d, scale_layout
        )
        ctx.save_for_backward(x2d if h2d is None else h2d, weight, rstd)
        ctx.offset = offset
        ctx.has_residual = residual is not None
        ctx.shape = x.shape
        ctx.set_materialize_grads(False)
        q = _shaped(q2d, x.shape)
        outputs = [q, _dy_port(x)]
        if scales is not None:
            outputs.insert(1, scales)
        ctx.mark_non_differentiable(*outputs[:-1])
        if h2d is not None:
            outputs.append(_shaped(h2d, x.shape))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        dy, dh = (grads[-2], grads[-1]) if ctx.has_residual else (grads[-1], None)
        normalized2d, weight, rstd = ctx.saved_tensors
        if dy is None:  # only h was used: dx = dr = dh, dw = 0
            dw = torch.zeros_like(weight)
            return dh, dw, dh, None, None, None, None, None, None
        dh2d = None if dh is None else _rows(dh)
        dx2d, dw = launch.rmsnorm_backward(_rows(dy), normalized2d, weight, rstd, ctx.offset, dh2d)
        dx = _shaped(dx2d, ctx.shape)
        return dx, dw, dx if ctx.has_residual else None, None, None, None, None, None, None


# ---- compiled door: torch.library custom op ------------------------------------------------------


@torch.library.custom_op("rmsnorm_bench::rmsnorm_fp8_fwd", mutates_args=())
def _rmsnorm_fp8_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None,
    eps: float,
    offset: float,
    scaling: str,
    scale: torch.Tensor | None,
    fp8_dtype: torch.dtype,
    scale_layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scales, rstd, h, dy_port); scales and h are empty tensors where there are none."""
    residual2d = None if residual is None else _rows(residual)
    q2d, scales, rstd, h2d = rmsnorm_fp8_forward(
        _rows(x), weight, eps, offset, scaling, scale, fp8_dtype, residual2d, scale_layout
    )
    scales = x.new_empty(0, dtype=torch.float32) if scales is None else scales
    h = x.new_empty(0) if h2d is None else h2d.view(x.shape)
    return q2d.view(x.shape), scales, rstd, h, _dy_port(x)


@_rmsnorm_fp8_fwd_op.register_fake
def _(x, weight, residual, eps, offset, scaling, scale, fp8_dtype, scale_layout):
    n = x.shape[-1]
    m = x.numel() // n
    if scaling == "per_tensor":
        scales = x.new_empty(0, dtype=torch.float32)
    else:
        scales = _empty_scales(m, n, scaling, scale_layout, x.device)
    h = (
        x.new_empty(0)
        if residual is None
        else torch.empty_like(x, memory_format=torch.contiguous_format)
    )
    q = x.new_empty(x.shape, dtype=fp8_dtype)
    return q, scales, x.new_empty((m,), dtype=torch.float32), h, _dy_port(x)


def _setup_context(ctx, inputs, output):
    x, weight, residual, _eps, offset, _scaling, _scale, _fp8, _layout = inputs
    q, scales, rstd, h, _port = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if ctx.has_residual else x, weight, rstd)
    ctx.offset = offset
    ctx.mark_non_differentiable(q, scales, rstd)


def _backward(ctx, _dq, _dscales, _drstd, dh, dy):
    normalized, weight, rstd = ctx.saved_tensors
    if dy is None:
        return dh, torch.zeros_like(weight), dh, None, None, None, None, None, None
    from .function import _rmsnorm_bwd_op

    dh_out = dh if ctx.has_residual else None
    dx, dw = _rmsnorm_bwd_op(dy, normalized, weight, rstd, ctx.offset, dh_out)
    return dx, dw, dx if ctx.has_residual else None, None, None, None, None, None, None


_rmsnorm_fp8_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the public op ---------------------------------------------------------------------------------


def rmsnorm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    offset: float = 0.0,
    scaling: str = "per_token",
    scale: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    scale_layout: str = "column_major",
    grad_port: bool = False,
) -> tuple[torch.Tensor, ...]:
    """RMSNorm over the last dimension, quantized to fp8 in the same pass.

    Returns (q, scales), (q, scales, h) with a residual, and dy_port last with grad_port=True.
    q: x's shape in fp8_dtype (torch.float8_e4m3fn or torch.float8_e5m2), q = sat(rn(y / s)).
    scales (fp32): per_token [...] (x's leading dims), one per row; per_tensor the caller's
    ``scale`` (one fp32 element on x's device) itself; block [M, ceil(N / 128)] (M = rows of x
    flattened), in scale_layout ("column_major": strides (1, align(M, 4)), DeepGEMM's; or
    "row_major"). y = x / sqrt(mean(x^2) + eps) * (offset + w) in fp32, never rounded before
    the quantization; saturates at the format's max; NaN stays NaN. residual: h = x + r
    (x's dtype) is returned and normalized. x: [..., N], fp16/bf16/fp32 (rows wider than
    FP8_SINGLE_TILE_MAX_N are walked in steps).
    Differentiable in x, weight and residual through dy_port (see the module docstring).
    """
    validate_inputs(x, weight, eps, offset)
    if residual is not None:
        _validate_residual(x, residual)
    _validate_fp8_args(x, scaling, scale, fp8_dtype, scale_layout)
    if weight.stride(0) != 1:
        weight = weight.contiguous()
    eps, offset = float(eps), float(offset)
    if torch.compiler.is_compiling():
        q, scales, _rstd, h, port = _rmsnorm_fp8_fwd_op(
            x, weight, residual, eps, offset, scaling, scale, fp8_dtype, scale_layout
        )
        outputs = (q, scale if scaling == "per_tensor" else _per_token_shape(scales, x, scaling))
    elif not _needs_grad(x, weight, residual):  # inference: no autograd node to build
        residual2d = None if residual is None else _rows(residual)
        q2d, scales, _rstd, h2d = rmsnorm_fp8_forward(
            _rows(x), weight, eps, offset, scaling, scale, fp8_dtype, residual2d, scale_layout
        )
        q, port = _shaped(q2d, x.shape), _dy_port(x) if grad_port else None
        h = None if h2d is None else _shaped(h2d, x.shape)
        scales = scale if scaling == "per_tensor" else scales
        outputs = (q, _per_token_shape(scales, x, scaling))
    else:
        outs = RMSNormFp8Function.apply(
            x, weight, residual, eps, offset, scaling, scale, fp8_dtype, scale_layout
        )
        q, port = outs[0], outs[-2] if residual is not None else outs[-1]
        scales = scale if scaling == "per_tensor" else outs[1]
        h = outs[-1] if residual is not None else None
        outputs = (q, _per_token_shape(scales, x, scaling))
    if residual is not None:
        outputs = (*outputs, h)
    return (*outputs, port) if grad_port else outputs


def _per_token_shape(scales: torch.Tensor, x: torch.Tensor, scaling: str) -> torch.Tensor:
    if scaling == "per_token" and x.dim() != 2:
        return scales.view(x.shape[:-1])
    return scales


def _validate_fp8_args(x, scaling, scale, fp8_dtype, scale_layout) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling: expected one of {SCALINGS}, got {scaling!r}")
    if fp8_dtype not in FP8_MAX:
        raise TypeError(f"fp8_dtype: expected one of {tuple(FP8_MAX)}, got {fp8_dtype}")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout: expected one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    if scaling != "per_tensor":
        if scale is not None:
            raise ValueError(f"scale: only scaling='per_tensor' takes a scale (got {scaling!r})")
        return
    if not isinstance(scale, torch.Tensor):
        raise TypeError(
            "scale: scaling='per_tensor' needs the scale as an fp32 tensor of one element on x's "
            f"device (a tensor, so that no host sync is needed), got {type(scale).__name__}"
        )
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise ValueError(f"scale: expected one fp32 element, got {scale.numel()} of {scale.dtype}")
    if scale.device != x.device:
        raise ValueError(f"scale: on {scale.device} but x is on {x.device}")
