"""Probe: how much of FlashInfer's forward lead at decode and M = 1 shapes is programmatic
dependent launch (PDL), and what would PDL give our single-tile forward?

FlashInfer's rmsnorm launches with PDL on Hopper by default: each kernel starts with
griddepcontrol.wait and triggers its dependents at its end, so in the harness's timed graphs
(back-to-back calls of one op over rotating inputs) a call's launch and prologue overlap the
previous call's tail. At 1x4096 bf16 it ran 1.34 us against our 1.69 (a copy kernel of that
shape: 1.20; decode-leaders-bf16 at dd71229acd5f). Our kernels launch without PDL.

Variants, device-only, by the product tuner's timer (a CUDA graph over rotating inputs past the
L2, which keeps PDL's programmatic edges), our kernel at the configuration a default call
launches (the dispatch table's, after the one-row-tile rule):
- "ours": launch.rmsnorm_forward, as a default call runs it (rstd stored);
- "ours, kernel": rmsnorm_fwd_kernel launched straight at that configuration (the same binary:
  the gap to "ours" is the graph's share of the host path, expected ~0);
- "ours, pdl": a wrapper kernel, griddepcontrol.wait first, then rmsnorm_fwd_kernel's body
  inlined, launched with launch_pdl=True (the dependents triggered at its exit);
- "ours, pdl, signal first": the same, triggering its dependents right after the wait (the next
  call's programs may then take SM slots while they wait);
- "flashinfer" / "flashinfer, no pdl": flashinfer.norm.rmsnorm with enable_pdl True / False,
  where FlashInfer imports.
Each timed three times, interleaved, the best kept. y of every variant of ours is compared bit
for bit with the default call's (the same arithmetic: the PDL wait changes nothing else).

Run from the repository root on an sm_90 GPU (peers' environment sourced for FlashInfer):
    PYTHONPATH=. python experiments/pdl_forward_ab.py out.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from ab_timing import time_runs

from impls.triton_rmsnorm import launch, tuning
from impls.triton_rmsnorm.common import block_size
from impls.triton_rmsnorm.configs import _kernel_grid_and_meta, _tile_programs
from impls.triton_rmsnorm.forward_launch import (
    _single_tile_forward_args,
    forward_holds_storage_form,
)
from impls.triton_rmsnorm.kernels import rmsnorm_fwd_kernel

KERNEL = "rmsnorm_fwd_kernel"
EPS = 1e-6


@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def fwd_pdl_kernel(
    X, W, Y, RSTD, R, H,
    stride_x_row, stride_y_row, stride_r_row, stride_h_row,
    M, N: tl.constexpr, eps, offset, ROWS_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PERSISTENT: tl.constexpr, LOOP_STAGES: tl.constexpr,
    ROWS_CONTIGUOUS: tl.constexpr = False, HOLD_STORAGE_FORM: tl.constexpr = False,
    W_EARLY: tl.constexpr = False, HEADS: tl.constexpr = 1, STRIDE_X_OUTER: tl.constexpr = 0,
    STORE_RSTD: tl.constexpr = True, SIGNAL_FIRST: tl.constexpr = False,
):  # fmt: skip
    """rmsnorm_fwd_kernel after a griddepcontrol.wait (its inputs are visible only once the
    kernel ahead has finished), triggering its dependents first thing when SIGNAL_FIRST."""
    tl.extra.cuda.gdc_wait()
    if SIGNAL_FIRST:
        tl.extra.cuda.gdc_launch_dependents()
    rmsnorm_fwd_kernel(
        X, W, Y, RSTD, R, H, stride_x_row, stride_y_row, stride_r_row, stride_h_row,
        M, N, eps, offset, ROWS_BUCKET, BLOCK_M, BLOCK_N, HAS_RESIDUAL, PERSISTENT, LOOP_STAGES,
        ROWS_CONTIGUOUS, HOLD_STORAGE_FORM, W_EARLY, HEADS, STRIDE_X_OUTER, STORE_RSTD,
    )  # fmt: skip


SHAPES = [(m, n) for n in (2048, 4096, 8192) for m in (1, 4, 16, 64, 256)] + [
    (1, 2880), (1, 5120), (1, 7168), (1, 16384), (2048, 4096), (2048, 8192),
]  # fmt: skip


def _flashinfer_rmsnorm():
    try:
        from flashinfer.norm import rmsnorm

        return rmsnorm
    except Exception as error:  # not installed on this machine: its rows are left out
        print("flashinfer:", type(error).__name__, str(error)[:160], flush=True)
        return None


def _our_runs(m: int, n: int, x: torch.Tensor, w: torch.Tensor) -> tuple[dict, dict]:
    """The variants of ours over an argument set (x, w, y, rstd), and the configuration."""
    launch.take_launch_configs()
    launch.rmsnorm_forward(x, w, EPS)
    launched = launch.take_launch_configs()
    if set(launched) != {KERNEL}:
        raise RuntimeError(f"{m}x{n}: a default call launched {sorted(launched)}, not {KERNEL}")
    config = launched[KERNEL]
    constexprs = {
        "BLOCK_N": block_size(n), "HAS_RESIDUAL": False, "ROWS_CONTIGUOUS": True,
        "HOLD_STORAGE_FORM": forward_holds_storage_form(block_size(n), x.dtype),
    }  # fmt: skip
    grid, meta = _kernel_grid_and_meta(
        KERNEL, lambda mt: (_tile_programs(m, mt, x.device),), {**constexprs, **config}
    )

    def args_of(a):
        x, w, y, rstd = a
        return _single_tile_forward_args(x, w, y, rstd, x, x, (n, n, n, n), EPS, 0.0)

    runs = {
        "ours": lambda a: launch.rmsnorm_forward(a[0], a[1], EPS),
        "ours, kernel": lambda a: rmsnorm_fwd_kernel[grid](*args_of(a), **meta),
        "ours, pdl": lambda a: fwd_pdl_kernel[grid](*args_of(a), **meta, launch_pdl=True),
        "ours, pdl, signal first": lambda a: fwd_pdl_kernel[grid](
            *args_of(a), **meta, SIGNAL_FIRST=True, launch_pdl=True
        ),
    }
    return runs, config


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    flashinfer_rmsnorm = _flashinfer_rmsnorm()
    rows = []
    print("device us of each variant; y bitwise the default call's", flush=True)
    for m, n in SHAPES:
        x = torch.randn(m, n, dtype=torch.bfloat16).cuda()
        w = torch.randn(n, dtype=torch.bfloat16).cuda()
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        try:
            runs, config = _our_runs(m, n, x, w)
        except Exception as error:
            print(f"{m}x{n}:", type(error).__name__, str(error)[:200], flush=True)
            continue
        if flashinfer_rmsnorm is not None:
            runs["flashinfer"] = lambda a: flashinfer_rmsnorm(a[0], a[1], EPS, enable_pdl=True)
            runs["flashinfer, no pdl"] = lambda a: flashinfer_rmsnorm(
                a[0], a[1], EPS, enable_pdl=False
            )
        arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream, passes=3)
        reference = launch.rmsnorm_forward(x, w, EPS)[0]
        same = {}
        for name, run in runs.items():
            if not name.startswith("ours, "):
                continue
            y.fill_(float("nan"))
            try:
                run((x, w, y, rstd))
                torch.cuda.synchronize()
                same[name] = bool(torch.equal(y, reference))
            except Exception as error:
                print(name, "untimed run:", type(error).__name__, str(error)[:160], flush=True)
        cells = "  ".join(f"{name}: {us:6.2f}" for name, us in times.items())
        print(f"{m:5d}x{n:5d}  {cells}  same bits: {same}  [{config}]", flush=True)
        rows.append({"m": m, "n": n, "dtype": "bf16", "config": config, "us": times,
                     "same_bits": same})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "torch": torch.__version__, "rows": rows}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
