"""Probe: rmsnorm_fp8's forward where its tile is padded to a power of two (issue 34).

Run 76 (`results/nvidia-h200/probes/2026-12-03-b8190903480f-fp8-bench-models-seed.log`): at
16384 rows, per tensor, our fp8 forward took 93.0, 93.2, 93.9, 96.7 and 105.3 µs at N = 4608,
5120, 5376, 6144 and 7168, all tiles of 8192 columns, and 113.6 at 8192. The time follows the
padded tile, not the bytes. The plain bf16 forward, with the same tile and launch configuration
(BLOCK_M 1, 8 warps), took 75-116 µs, and FlashInfer's rmsnorm_quant 59-95. The 4096-column
tile is fine: 53.2 µs at 4096, 44.7-49.8 at 2560-3584.

Reading: the kernel is bound by instructions issued per tile element, padding included. The
plain forward issues fewer per element and stays bound by memory. Compiled for sm_90
(tests/sm90_compile_fp8.py, 4608 columns, 8 warps), the kernel has 591-754 PTX instructions a
thread. The explicit clamp to +-FP8_MAX ahead of the cast is 128-227 of them. The cast itself
(cvt.rn.satfinite) already clamps and keeps NaN: SATURATE=False (clamp_before_cast=False) drops
the clamp, and the kernel falls to 463-527 instructions.

Timed here, one process, device-only (harness.fp8_bench's timer: a CUDA graph over rotating
inputs), at 16384 x {4096, 4608, 5120, 5376, 6144, 7168, 8192}, 2048 x {4608, 5120} and
1 x {2048, 4608, 8192} (one row: latency, where per token's second reduction shows; run 76 had
per token 1.64x the plain forward at 1 x 2048), per token, per tensor and per 1x128 block:
- the product's call (its fp8 launch table);
- the same with the clamp left to the cast: its codes and scales should equal the product's bit
  for bit (bitwise_as_product says whether they do);
- the split tile (split_tile: a power-of-two tile and a tail, 4608 = 4096 + 512; its sum of
  squares runs in another order, so only the oracle judges it), with and without the clamp;
- w loaded as a [1, BLOCK_N] row in x's layout (w_as_row; the same arithmetic, so its codes
  should equal the product's bit for bit). Loaded as a vector, w takes a layout of its own and
  Triton converts it through shared memory: at 8192 columns, 8 warps, 8 KB and 4 barriers a
  row in the sm_90 PTX (Triton 3.6: per tensor 6 barriers -> 2, per token 9 -> 5);
- per token, the amax in the sum of squares' reduction (amax_with_sum: one cross-warp reduction
  instead of two; y's product in another order, so only the oracle judges it), alone and with
  the two above;
- BLOCK_M {1, 2} x num_warps {4, 8, 16, 32} through FP8_LAUNCH_TABLE, for the product's form
  and for the split tile without the clamp;
- beside them: our plain forward, and FlashInfer's rmsnorm_quant (per tensor) where installed.
Each variant also passes the fp8 oracle first. Registers and spills of each compiled kernel are
recorded.

The sm_90 PTX a thread at 4608 columns, 8 warps, as Triton 3.6 compiles it (tests/sm90_compile_fp8.py;
the full table is in docs/perf-log.md, thirty-third session): per token 732 instructions, 9
barriers and 8 KB of shared memory (the product); 481, 5 and 32 B without the clamp and with w
as a row; 355, 5 and 64 B with all four switches. Per tensor 583, 6, 8 KB -> 431, 2, 32 B (no
clamp, w as a row) -> 302, 5, 32 B (and the split tile, one row a tile).

Prediction: without the clamp, 0.80-0.90 of the product's time at the padded widths (16384 x
4608-7168); no change at 4096 and 8192 (bound by memory). Split and without the clamp, per
token and per tensor at 16384 x 4608: near the bytes' time (~60 µs, FlashInfer's 59); per block
less gain (a worse tail). The amax with the sum, per token: toward the per-tensor time at the
same shape (16384 x 8192: 127 -> ~114 µs; per tensor 113.6), since one of its two cross-warp
reductions goes (sm_90 PTX, Triton 3.9, at 8192 columns and 8 warps: 7 -> 6 barriers).

    PYTHONPATH=.:$PYTHONPATH python experiments/fp8_padded_tile_ab.py OUT.json [--quick | --sweep] [--shapes MxN ...]

Each shape compiles its own kernels (N is a compile-time constant): about 25 s a shape, and
the configuration sweep (SWEEP_SHAPES only; --quick skips it, --sweep runs it at every shape)
about 60 s more for each of those. --shapes runs a subset, so the probe can be spread over
calls. The peers' PYTHONPATH is kept: FlashInfer is timed only where it imports.
"""

from __future__ import annotations

import sys

import torch
from ab_timing import shapes_argument, write_probe_json

from harness.fp8_bench import _sets, _static_scale, _time
from harness.oracle_fp8 import check_fp8
from impls.triton_rmsnorm import direct, fp8, fp8_kernels, replays, rmsnorm

SHAPES = [(16384, n) for n in (4096, 4608, 5120, 5376, 6144, 7168, 8192)]
SHAPES += [(2048, 4608), (2048, 5120), (1, 4608), (1, 2048), (1, 8192)]  # M = 1: two reductions
SCALINGS = ("per_token", "per_tensor", "block")
CONFIGS = [(bm, nw) for bm in (1, 2) for nw in (4, 8, 16, 32)]
#: The configuration sweep runs at these shapes only (a padded tile, and a power of two).
SWEEP_SHAPES = [(16384, 4608), (16384, 8192)]
EPS = 1e-6
E4 = torch.float8_e4m3fn


#: The switches a variant sets (rmsnorm_fp8_forward's keywords), passed explicitly: the
#: product's as this probe first ran (run 79). The clamp left to the cast, w as a row and (per
#: token) the amax with the sum became the defaults after it.
PRODUCT = {
    "clamp_before_cast": True,
    "split_tile": False,
    "amax_with_sum": False,
    "w_as_row": False,
}
#: Variants at the table's configuration: each switch alone, then together.
SWITCHES = [
    {"clamp_before_cast": False},
    {"w_as_row": True},
    {"clamp_before_cast": False, "w_as_row": True},
    {"split_tile": True},
    {"amax_with_sum": True},
    {"clamp_before_cast": False, "split_tile": True},
    {"clamp_before_cast": False, "split_tile": True, "amax_with_sum": True},
    {"clamp_before_cast": False, "split_tile": True, "amax_with_sum": True, "w_as_row": True},
    {"clamp_before_cast": False, "amax_with_sum": True, "w_as_row": True},
]


def _forward(s, scaling, scale, knobs):
    return lambda: fp8.rmsnorm_fp8_forward(s.x, s.weight, EPS, 0.0, scaling, scale, E4, **knobs)


def _registers(call) -> dict:
    """Registers and spills of the kernel one call launches (its recorded launch)."""
    replays._RECORDING.launches = recorded = []
    try:
        call()
    finally:
        replays._RECORDING.launches = None
    kernel, _grid, args, meta, device, _config = recorded[-1]
    compiled = direct.compiled_for(kernel, args, meta, device)
    if compiled is None:
        return {}
    return {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills}


def _variant(shape, scaling, sets, scale, knobs, config, reference):
    knobs = {**PRODUCT, **knobs}
    block_n, tail_n = fp8.fp8_tiles(shape[1], scaling, knobs["split_tile"])
    entry = None if config is None else {"BLOCK_M": config[0], "num_warps": config[1]}
    with fp8.launch_table_entry((scaling, block_n, 2, tail_n), entry):
        return _checked_and_timed(shape, scaling, sets, scale, knobs, config, reference,
                                  (block_n, tail_n))  # fmt: skip


def _checked_and_timed(shape, scaling, sets, scale, knobs, config, reference, tiles):
    row = {"shape": list(shape), "scaling": scaling, **knobs, "tiles": tiles,
           "config": fp8.fp8_launch_config(shape[1], scaling, 2, sets[0].x.device, tiles),
           "table": config is None}  # fmt: skip
    try:
        call = _forward(sets[0], scaling, scale, knobs)
        q, scales, _rstd, _h = call()
        used = scale if scaling == "per_tensor" else scales
        reports = check_fp8(q, used, sets[0].x, sets[0].weight, EPS, scaling=scaling,
                            fp8_dtype=E4, static_scale=scale)  # fmt: skip
        row["passed"] = all(r.passed for r in reports)
        if reference is not None:
            ref_q, ref_s = reference
            row["bitwise_as_product"] = bool(
                torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
                and (ref_s is None or torch.equal(scales, ref_s))
            )
        row.update(_registers(call))
        if row["passed"]:  # timed even where its bits differ: the row says so
            row["us"] = _time([_forward(s, scaling, scale, knobs) for s in sets]).ms * 1e3
        return row, (q, scales)
    except Exception as exc:  # a config that does not compile or fit: a row, go on
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        return row, None


def _flashinfer_static():
    try:
        from impls import get_backend

        backend = get_backend("flashinfer-fp8-static")
        if backend.skip_reason((1, 1), torch.bfloat16, "cuda"):
            return None
        return backend.build()
    except Exception:
        return None


def main(out_path: str, quick: bool = False, shapes: list | None = None,
         sweep_everywhere: bool = False) -> None:  # fmt: skip
    rows, references = [], {}
    flashinfer = _flashinfer_static()
    for shape in shapes or SHAPES:
        sets, _ = _sets(shape, torch.bfloat16, EPS, False, E4)
        label = f"{shape[0]}x{shape[1]}"
        scale = _static_scale(sets[0].x, sets[0].weight, EPS, E4)
        references[label] = {"plain_us": _time([lambda s=s: rmsnorm(s.x, s.weight, EPS)
                                                for s in sets]).ms * 1e3}  # fmt: skip
        if flashinfer is not None:
            calls = [lambda s=s, c=scale: flashinfer(s.x, s.weight, EPS, scaling="per_tensor",
                                                     scale=c, residual=None, fp8_dtype=E4)
                     for s in sets]  # fmt: skip
            references[label]["flashinfer_static_us"] = _time(calls).ms * 1e3
        for scaling in SCALINGS:
            product, outputs = _variant(shape, scaling, sets, scale, {}, None, None)
            rows.append(product)
            variants = [(knobs, None) for knobs in SWITCHES
                        if scaling == "per_token" or "amax_with_sum" not in knobs]  # fmt: skip
            if not quick and (sweep_everywhere or shape in SWEEP_SHAPES):
                variants += [(knobs, c) for c in CONFIGS
                             for knobs in ({}, {"clamp_before_cast": False, "split_tile": True})]  # fmt: skip
            for knobs, config in variants:
                # the clamp and w's layout keep the product's arithmetic: bitwise checked there
                same = set(knobs) <= {"clamp_before_cast", "w_as_row"} or (
                    set(knobs) == {"split_tile"} and not fp8.fp8_tiles(shape[1], scaling, True)[1]
                )
                row, _ = _variant(shape, scaling, sets, scale, knobs, config,
                                  outputs if config is None and same else None)  # fmt: skip
                rows.append(row)
            for r in rows[-len(variants) - 1 :]:
                us = r.get("us")
                timed = f"{us:8.1f} us" if us else r.get("error", "not timed")
                ratio = f"{us / product['us']:.3f}" if us and product.get("us") else "-"
                print(f"{label:>11} {scaling:<10} clamp={r['clamp_before_cast']!s:<5} "
                      f"w_as_row={r['w_as_row']!s:<5} "
                      f"amax_with_sum={r['amax_with_sum']!s:<5} tiles={r['tiles']} {r['config']} table={r['table']!s:<5} "
                      f"regs={r.get('n_regs')} "
                      f"spills={r.get('n_spills')} "
                      f"{timed:>10} "
                      f"x product {ratio}", flush=True)  # fmt: skip
        print(label, references[label], flush=True)
        del sets
        torch.cuda.empty_cache()
        write_probe_json(out_path, references=references, rows=rows,
                         kernel=fp8_kernels.rmsnorm_fp8_fwd_kernel.fn.__name__)  # fmt: skip


if __name__ == "__main__":
    argv = sys.argv[2:]
    main(sys.argv[1], quick="--quick" in argv, shapes=shapes_argument(argv),
         sweep_everywhere="--sweep" in argv)  # fmt: skip
