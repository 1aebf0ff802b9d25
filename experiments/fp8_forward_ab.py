"""Why does rmsnorm_fp8's forward take 1.15-3.3x the plain forward's time (H200, 2026-12-02)?

Two suspects, each timed beside the plain bf16 forward at the same shape, device-only (CUDA
graph, rotating inputs, as harness.fp8_bench), one process:
1. the per-element correctly rounded division (div.rn.f32, a long SASS sequence) against
   RECIPROCAL (one division a scale, a multiply a code: fp8_kernels' docstring);
2. the launch configuration: the plain single tile's heuristic (FP8_LAUNCH_TABLE is empty)
   against a sweep of BLOCK_M x num_warps through that table (RECIPROCAL only; --quick: none).
Each variant's codes are checked by the fp8 oracle first (a failing variant is reported, not
timed). Prints a table and writes every row, and per (scaling, BLOCK_N) the fastest passing
configuration as FP8_LAUNCH_TABLE entries, to OUT.json:

    PYTHONPATH=. python experiments/fp8_forward_ab.py OUT.json [--quick]
"""

from __future__ import annotations

import json
import sys

import torch

from harness.fp8_bench import _sets, _static_scale, _time
from harness.oracle_fp8 import check_fp8
from impls.triton_rmsnorm import fp8, rmsnorm

#: Shapes where the fp8 forward trailed most (probes/2026-12-02-gpu-runs.md), and two large ones.
SHAPES = [(1, 2048), (2048, 2560), (16384, 2560), (16384, 2880), (4096, 8192), (16384, 7168)]
SCALINGS = ("per_token", "per_tensor", "block")
CONFIGS = [(bm, nw) for bm in (1, 2, 4, 8) for nw in (2, 4, 8, 16)]
EPS = 1e-6


def _forward(s, scaling, scale, reciprocal):
    """One fp8 forward on the input set s, as a call for the timer."""
    return lambda: fp8.rmsnorm_fp8_forward(s.x, s.weight, EPS, 0.0, scaling, scale,
                                           torch.float8_e4m3fn, reciprocal=reciprocal,
                                           split_tile=False)  # fmt: skip


def _variant_rows(shape, scaling, sets, scale, configs):
    block_n = fp8.fp8_block_n(shape[1], scaling)
    rows = []
    for reciprocal in (False, True):
        for config in [None, *configs] if reciprocal else [None]:  # the sweep: RECIPROCAL only
            key = (scaling, block_n, sets[0].x.element_size(), 0)
            entry = None if config is None else {"BLOCK_M": config[0], "num_warps": config[1]}
            with fp8.launch_table_entry(key, entry):
                try:
                    q, scales, _rstd, _h = _forward(sets[0], scaling, scale, reciprocal)()
                    used = scale if scaling == "per_tensor" else scales
                    reports = check_fp8(q, used, sets[0].x, sets[0].weight, EPS, scaling=scaling,
                                        fp8_dtype=torch.float8_e4m3fn, static_scale=scale)  # fmt: skip
                    passed = all(r.passed for r in reports)
                    ms = None
                    if passed:
                        ms = _time([_forward(s, scaling, scale, reciprocal) for s in sets]).ms
                    rows.append({"shape": list(shape), "scaling": scaling, "reciprocal": reciprocal,
                                 "config": fp8.fp8_launch_config(shape[1], scaling, 2),
                                 "heuristic": config is None, "passed": passed, "ms": ms})  # fmt: skip
                except Exception as exc:  # a config that does not compile or fit: a row, go on
                    rows.append({"shape": list(shape), "scaling": scaling, "reciprocal": reciprocal,
                                 "config": config, "error": f"{type(exc).__name__}: {exc}"[:200]})  # fmt: skip
    return rows


def main(out_path: str, quick: bool = False) -> None:
    rows, plain = [], {}
    configs = [] if quick else CONFIGS
    for shape in SHAPES:
        sets, _ = _sets(shape, torch.bfloat16, EPS, False, torch.float8_e4m3fn)
        plain_calls = [lambda s=s: rmsnorm(s.x, s.weight, EPS) for s in sets]
        plain[f"{shape[0]}x{shape[1]}"] = _time(plain_calls).ms
        scale = _static_scale(sets[0].x, sets[0].weight, EPS, torch.float8_e4m3fn)
        for scaling in SCALINGS:
            found = _variant_rows(shape, scaling, sets, scale, configs)
            rows += found
            for r in found:
                if r.get("ms") is not None and (r["heuristic"] or not quick):
                    ratio = r["ms"] / plain[f"{shape[0]}x{shape[1]}"]
                    print(f"{shape[0]:>6}x{shape[1]:<6} {scaling:<10} recip={r['reciprocal']!s:<5} "
                          f"{r['config']} heuristic={r['heuristic']!s:<5} {r['ms'] * 1e3:8.1f} us "
                          f"x plain {ratio:.2f}", flush=True)  # fmt: skip
        del sets
    best = {}
    for r in rows:
        if r.get("ms") is None:
            continue
        key = f"{r['scaling']}/{fp8.fp8_block_n(r['shape'][1], r['scaling'])}/{r['reciprocal']}"
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    with open(out_path, "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(0), "plain_ms": plain, "rows": rows,
                   "fastest": best}, out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], quick="--quick" in sys.argv[2:])
