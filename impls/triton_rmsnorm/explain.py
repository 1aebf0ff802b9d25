"""Which path and launch configurations a call would get, and why, without running it:

    from impls.triton_rmsnorm.explain import explain
    print(explain(x, weight))                       # x, weight as you would call rmsnorm

    python -m impls.triton_rmsnorm.explain 2048x4096 --dtype bf16 [--residual] [--device cuda]
    python -m impls.triton_rmsnorm.explain 2048x4096 --gpu nvidia-h200    # no GPU needed

For each direction: the paths offered for the call (the default first) and why the others are
not (offers.py), the one that serves it and where that came from (the dispatch table's entry and the point it was measured at, an
override, or the heuristic and why), and its kernels' configurations. It asks what a call
asks (dispatch.choose), so under dispatch.override it says what the override does; an opt-in
runtime tuning would measure the offered paths first (dispatch.py).

With --gpu (a GPU class with a committed table, as tables/ names it) it reads that table alone,
on any machine: the entry each direction's call would take there and the point it was measured
at. It cannot say there which paths that GPU offers for the call (the offers ask the device);
on the GPU itself, an entry whose path is not offered for a call (strides, say) gives way to
the default, as the full form above says.
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import common, configs, dispatch, dispatch_table, forward_launch, launch, offers
from .function import _rows, _x_rows


def _lines(direction: str, dtypes: tuple, residual: bool, n: int, m: int, paths: list,
           device: torch.device, families: list, element_size: int = 2,
           pdl_kernel: str | None = None) -> list[str]:  # fmt: skip
    choice = dispatch.choose(direction, dtypes, residual, n, m, paths, device)
    offered = ", ".join(dispatch.path_name(p) for p in paths)
    config_text = "heuristic"
    if choice.configs is not None:
        config_text = ", ".join(
            _config_text(kernel, c) for kernel, c in sorted(choice.configs.items())
        )
    left_out = [f"    {o.name}: {o.reason}" for o in families if o.reason is not None]
    return [f"{direction}: {dispatch.path_name(choice.path)}  ({choice.describe()})",
            f"  offered: {offered}", f"  configs: {config_text}",
            *_one_row_tiles_line(choice, m, n, element_size, device),
            *_pdl_line(choice, pdl_kernel, device),
            *(["  not offered:", *left_out] if left_out else [])]  # fmt: skip


def _config_text(kernel: str, config: dict) -> str:
    """A kernel's configuration as the table gives it, marked where the kernel does not take it
    (a hand-edited entry outside its configuration space: the heuristic runs instead)."""
    text = f"{kernel} {dict(sorted(config.items()))}"
    if not configs.in_config_space(kernel, config):
        text += " (not in the kernel's configuration space: the heuristic runs instead)"
    return text


def _pdl_line(choice, kernel: str | None, device: torch.device) -> list[str]:
    """Where the chosen path launches its kernel with programmatic dependent launch
    (common.pdl_switches: the plain single-tile forward on compute capability >= 9), a line
    saying so."""
    if kernel != "rmsnorm_fwd_kernel" or dispatch.path_name(choice.path) != "single_tile":
        return []
    if not common.pdl_switches(device):
        return []
    return [
        "  launch: rmsnorm_fwd_kernel with programmatic dependent launch (it may start before "
        "the kernel ahead finishes and waits on it before any access; RMSNORM_TRITON_PDL=0 "
        "turns it off)"
    ]


def _one_row_tiles_line(choice, m: int, n: int, element_size: int, device) -> list[str]:
    """Where the plain single-tile forward's table configuration launches with one row a tile at
    this M (configs.one_row_tiles), a line saying so."""
    config = (choice.configs or {}).get("rmsnorm_fwd_kernel")
    if config is None or device.type != "cuda":
        return []
    sms = common._programs_cap(device)
    launched = configs.one_row_tiles(config, m, common.block_size(n), element_size, sms)
    if launched == config:
        return []
    return [
        f"  launched: rmsnorm_fwd_kernel with BLOCK_M 1 at M={m} (its tiles of "
        f"{config['BLOCK_M']} rows would fill fewer than the {sms} SMs; the same bits: "
        "configs.one_row_tiles)"
    ]


def explain(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    dy: torch.Tensor | None = None,
) -> str:
    """The forward's and the backward's choice for rmsnorm(x, weight, residual=residual,
    out_dtype=out_dtype), the backward's for an incoming gradient like dy (default: contiguous,
    y's dtype), as text."""
    x2d = _rows(x) if residual is not None else _x_rows(x)
    m, n = launch.rows_and_width(x2d)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    has_residual = residual is not None
    lines = [f"rmsnorm on {x.device}: M={m}, N={n}, x {x.dtype}, weight {weight.dtype}"
             + (", residual" if has_residual else "")]  # fmt: skip
    with launch._on_device(x):
        paths = launch.forward_paths(x2d, y, weight, has_residual)
        families = offers.forward_offers(x2d, y, weight, has_residual)
        sizes = (
            x.element_size(),
            y.element_size(),
            *(() if residual is None else (residual.element_size(),)),
        )
        kernel = forward_launch.single_tile_kernel(x2d, y, residual)
        lines += _lines("fwd", (x.dtype, weight.dtype, y.dtype), has_residual, n, m, paths,
                        x.device, families, min(sizes), kernel)  # fmt: skip
        grad = torch.empty((m, n), dtype=y.dtype, device=x.device) if dy is None else _rows(dy)
        dh = grad if has_residual else None
        paths = launch.backward_paths(x2d, grad, weight, dh)
        dtypes = (x.dtype, weight.dtype, grad.dtype, grad.dtype)
        families = offers.backward_offers(x2d, grad, weight, dh)
        lines += _lines("bwd", dtypes, has_residual, n, m, paths, x.device, families)
    return "\n".join(lines)


def committed_gpus() -> list[str]:
    """The GPU classes with a committed dispatch table (their file stems in tables/)."""
    return sorted(p.stem for p in dispatch_table.TABLES_DIR.glob("*.json"))


def explain_table(gpu: str, m: int, n: int, dtype: torch.dtype, *, residual: bool = False) -> str:
    """What the committed table of GPU class `gpu` ("nvidia-h200", or its name "NVIDIA H200")
    gives an [m, n] call of x, weight and y in `dtype` (dy and dx too), per direction, as text:
    read from the table's file alone, no device asked (see the module docstring)."""
    path = dispatch_table.committed_table_path(gpu)
    if not path.exists():
        raise ValueError(f"gpu: expected a GPU class with a committed table "
                         f"({', '.join(committed_gpus()) or 'none'}), got {gpu!r}")  # fmt: skip
    table = dispatch_table.Table.load(path)
    lines = [f"rmsnorm on {table.meta.get('gpu', path.stem)} (its committed table, {path.name}): "
             f"M={m}, N={n}, x {dtype}, weight {dtype}" + (", residual" if residual else "")]  # fmt: skip
    for direction, count in (("fwd", 3), ("bwd", 4)):
        key = dispatch.entry_key(direction, (dtype,) * count, residual)
        entry = table.lookup(key, n, m)
        if entry is None:
            lines.append(f"{direction}: no entry for these dtypes, residual and padded width: "
                         "the default path in heuristic configurations")  # fmt: skip
            continue
        lines += [f"{direction}: {entry.path}  (the table's entry n={entry.n}, m={entry.m})",
                  *(f"  configs: {_config_text(k, c)}" for k, c in sorted(entry.configs.items()))]  # fmt: skip
    lines.append("(the paths that GPU offers for the call are not asked here: where the entry's "
                 "path is not offered, by the call's strides say, the default runs there)")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m impls.triton_rmsnorm.explain",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("shape", help="MxN, e.g. 2048x4096")
    p.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--residual", action="store_true", help="a pre-norm residual add")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the call would run (default: cuda where there is one, else cpu)")  # fmt: skip
    p.add_argument("--gpu", default=None, metavar="CLASS",
                   help="read the committed table of this GPU class instead, on any machine "
                   f"(committed: {', '.join(committed_gpus()) or 'none'})")  # fmt: skip
    args = p.parse_args(argv)
    try:
        m, n = (int(v) for v in args.shape.lower().split("x"))
    except ValueError:
        p.error(f"argument shape: expected MxN with integers, got {args.shape!r}")
    if m < 1 or n < 1:
        p.error(f"argument shape: expected M and N of at least 1, got {args.shape!r}")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if args.gpu is not None:
        try:
            print(explain_table(args.gpu, m, n, dtype, residual=args.residual))
        except ValueError as error:
            p.error(f"argument --gpu: {str(error).removeprefix('gpu: ')}")
        return 0
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("argument --device: cuda, but this machine has no CUDA device: without one the "
                "kernels run through Triton's interpreter (--device cpu), where the dispatch "
                "tables are not read; the H200's table is impls/triton_rmsnorm/tables/"
                "nvidia-h200.json (its format: dispatch_table.py; --gpu nvidia-h200 reads "
                "it here)")  # fmt: skip
    x = torch.empty((m, n), dtype=dtype, device=args.device)
    w = torch.empty((n,), dtype=dtype, device=args.device)
    r = torch.empty_like(x) if args.residual else None
    print(explain(x, w, residual=r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
