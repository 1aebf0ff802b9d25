"""Probe: the two-role backward at 16384 columns and 1-256 rows, where the single tile and its
dw reduction trail torch.compile (issue 30 item 7; issue 34's fp8 backward takes the same path).

Runs 28 and 54 (models preset): our backward at 1x16384 takes 5.90 µs (bf16) and 5.73 (fp16)
against torch.compile's 4.96 and 4.38, while at 1x8192 it takes 2.24 and 2.13, where the table
picks the two-role kernel (dx from row programs, dw from column programs beside them, one
launch, no partials). At 16384 the table takes the single tile (rmsnorm_bwd_kernel, then
rmsnorm_dw_reduce_kernel): two launches, and the reduction alone is ~2 µs of a small backward
(`2026-11-30-daf182be02dc-backward-small-breakdown.txt`). b960cd9 offers the two-role kernel up
to 16384 columns (4M elements: up to 256 rows there), with a column tile of 128 columns x 32 rows
(128 column programs, one an SM, as at 2048-8192); sm_90 ptxas: no spills at 8-32 warps.

Per (dtype, M, N), device-only by harness.fp8_bench's timer (the harness's: a CUDA graph of the
backward calls over rotating inputs, the forwards run before on the capture stream):
- the table's call (no override);
- the two-role kernel forced (dispatch.override(backward="two_role", backward_configs=...)) at
  8, 16 and 32 warps, BLOCK_M 1, LOOP_STAGES 1.
Each variant is first checked by harness.checks.check_backend (the fp32 oracle, and the mirrored
second call); dx's bits are compared with the table's call (the row programs' arithmetic is the
single tile's: the same bits where the warps match); each row records the launch configurations
that ran (launch.take_launch_configs).

Prediction: at 1-16 rows x 16384 the two-role kernel at 2.6-3.2 µs (1.8-2.2x the table's path,
ahead of torch.compile's 4.4-5.0), its gain falling with M; at 256 rows within 10% of the single
tile either way. 8192 is timed as the reference (the table's two-role there). If so, `tune
--merge --retune --directions bwd --n 16384 --m 1,8,16,64,256` writes the table's entries.

    PYTHONPATH=.:experiments:$PYTHONPATH python experiments/backward_two_role_16384_ab.py OUT.json

A few minutes (each shape class and warp count compiles its kernels): give it 300 s.
"""

from __future__ import annotations

import sys

import torch
from ab_timing import write_probe_json

from impls.triton_rmsnorm import dispatch, launch, rmsnorm

SHAPES = [(1, 16384), (4, 16384), (16, 16384), (64, 16384), (256, 16384), (1, 8192), (64, 8192)]
WARPS = (8, 16, 32)
EPS = 1e-6
KERNEL = "rmsnorm_bwd_two_role_kernel"


def variants() -> dict:
    """name -> the override's keywords (None: the table's call)."""
    out = {"table": None}
    for warps in WARPS:
        config = {"BLOCK_M": 1, "LOOP_STAGES": 1, "num_warps": warps, "num_stages": 1}
        out[f"two_role_w{warps}"] = {"backward": "two_role", "backward_configs": {KERNEL: config}}
    return out


def forward(x, w, forced):
    """rmsnorm(x, w) with the backward forced as `forced` says (the override must hold the
    forward: its autograd node keeps the forced path)."""
    if forced is None:
        return rmsnorm(x, w, EPS)
    with dispatch.override(**forced):
        return rmsnorm(x, w, EPS)


def _checked(shape, dtype, forced) -> tuple[bool, str]:
    from harness.checks import check_backend
    from harness.inputs import make_inputs
    from impls import get_backend

    inputs = make_inputs(shape, dtype, "cuda", eps=EPS)
    result = check_backend(get_backend("triton"), lambda x, w, eps: forward(x, w, forced), inputs)
    failed = [f"{r.quantity}: {r.detail}" for r in result.reports if not r.passed]
    return result.passed, result.error or "; ".join(failed)[:300]


def _dx(x, w, dy, forced):
    x = x.detach().requires_grad_(True)
    return torch.autograd.grad(forward(x, w, forced), x, dy)[0]


def main(out_path: str) -> None:
    from harness import traffic
    from harness.fp8_bench import _time
    from harness.inputs import make_inputs
    from harness.timing import rotating_sets

    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for m, n in SHAPES:
            count = rotating_sets(traffic.counted_bytes("bwd", m, n, dtype.itemsize))
            sets = [make_inputs((m, n), dtype, "cuda", eps=EPS, seed=2000 + i)
                    for i in range(count)]  # fmt: skip
            reference_dx = _dx(sets[0].x, sets[0].weight, sets[0].dy, None)
            for name, forced in variants().items():
                row = {"dtype": str(dtype).removeprefix("torch."), "m": m, "n": n, "variant": name}
                try:
                    row["passed"], row["detail"] = _checked((m, n), dtype, forced)
                    launch.take_launch_configs()
                    dx = _dx(sets[0].x, sets[0].weight, sets[0].dy, forced)
                    row["launched"] = launch.take_launch_configs()  # what ran: a config outside
                    # the kernel's space would have been replaced by the heuristic's, silently
                    row["dx_same_bits_as_table"] = torch.equal(dx, reference_dx)
                    calls, stream = [], torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    for s in sets:
                        x = s.x.detach().requires_grad_(True)
                        w = s.weight.detach().requires_grad_(True)
                        with torch.cuda.stream(stream):  # autograd replays on this stream
                            y = forward(x, w, forced)
                        calls.append(lambda y=y, x=x, w=w, dy=s.dy: torch.autograd.grad(
                            y, (x, w), dy, retain_graph=True))  # fmt: skip
                    row["us"] = _time(calls, stream).ms * 1e3
                except Exception as exc:  # a variant that fails is a row: the probe goes on
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(row, flush=True)
            del sets
            torch.cuda.empty_cache()
            write_probe_json(out_path, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1])
