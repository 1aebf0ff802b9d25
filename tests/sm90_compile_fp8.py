"""Compile the fp8 kernel for sm_90 without a GPU and report what its PTX holds.

Run in a process of its own, without TRITON_INTERPRET (the interpreter never compiles):

    python -m tests.sm90_compile_fp8 '[{"scaling": 2, "n": 4096, "warps": 16, "fp8": "fp8e4nv",
                                        "x": "bf16", "residual": false}]'

Prints one JSON list: per case, the fp32 -> fp8 conversions (cvt.rn.satfinite), correctly
rounded divisions and global stores in the PTX, and the shared memory the kernel asks for.
"""

from __future__ import annotations

import json
import re
import sys


def compile_case(case: dict):
    import triton

    from impls.triton_rmsnorm import fp8_kernels
    from impls.triton_rmsnorm.fp8 import BLOCK_GROUP
    from tests import sm90_compile

    x, fp8 = case["x"], case["fp8"]
    pointers = {"X": x, "W": x, "Q": fp8, "SCALES": "fp32", "RSTD": "fp32", "R": x, "H": x,
                "STATIC_SCALE": "fp32"}  # fmt: skip
    options = {"num_warps": case["warps"], "num_stages": 3}
    if case.get("looped"):  # the kernel for rows past the single tile (N a runtime int)
        from impls.triton_rmsnorm.fp8 import FP8_LOOPED_CHUNK

        constexprs = {"FP8_MAX": 448.0 if fp8 == "fp8e4nv" else 57344.0,
                      "SCALING": case["scaling"], "GROUP": BLOCK_GROUP,
                      "CHUNK": FP8_LOOPED_CHUNK, "HAS_RESIDUAL": case["residual"],
                      "CAST_IN_KERNEL": True,
                      "RECIPROCAL": case.get("reciprocal", False)}  # fmt: skip
        return sm90_compile.compile_sm90(fp8_kernels.rmsnorm_fp8_fwd_looped_kernel, pointers,
                                         constexprs, options)  # fmt: skip
    kernel = fp8_kernels.rmsnorm_fp8_fwd_kernel
    block_n = triton.next_power_of_2(case["n"])
    if case["scaling"] == 2:
        block_n = max(block_n, BLOCK_GROUP)
    if case.get("tail"):  # the split tile: the largest power of two <= n, then the tail
        block_n = 1 << (case["n"].bit_length() - 1)
    constexprs = {"N": case["n"], "FP8_MAX": 448.0 if fp8 == "fp8e4nv" else 57344.0,
                  "SCALING": case["scaling"], "GROUP": BLOCK_GROUP,
                  "GROUPS": block_n // BLOCK_GROUP, "BLOCK_M": case.get("block_m", 1),
                  "BLOCK_N": block_n, "HAS_RESIDUAL": case["residual"], "CAST_IN_KERNEL": True,
                  "ROWS_CONTIGUOUS": True,
                  "RECIPROCAL": case.get("reciprocal", False),
                  "W_EARLY": case.get("w_early", False),
                  "WAIT_FOR_PRIOR_GRID": case.get("wait", False),
                  "SATURATE": case.get("saturate", True),
                  "TAIL_N": case.get("tail", 0),
                  "AMAX_WITH_SUM": case.get("amax_with_sum", False),
                  "W_AS_ROW": case.get("w_as_row", False),
                  "ROW_SCALARS": case.get("block_m", 1) == 1 and bool(case.get("tail")),
                  "NARROW_CODES": case.get("narrow_codes", False)}  # fmt: skip
    return sm90_compile.compile_sm90(kernel, pointers, constexprs, options)


def main(cases: list[dict]) -> list[dict]:
    from tests import sm90_compile

    report = []
    for case in cases:
        compiled = compile_case(case)
        ptx = compiled.asm["ptx"]
        report.append({
            "cvt e4m3x2": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
            "cvt e5m2x2": len(re.findall(r"cvt\.rn\.satfinite\.e5m2x2\.f32", ptx)),
            "div.rn": len(re.findall(r"div\.rn\.f32", ptx)),
            "global stores": len(re.findall(r"st\.global", ptx)),
            "shared bytes": compiled.metadata.shared,
            "instructions": len(re.findall(r"^\s+[a-z][\w.]*\s", ptx, flags=re.M)),
            "setp": len(re.findall(r"\bsetp\.", ptx)),
            "selp": len(re.findall(r"\bselp\.", ptx)),
            "barriers": len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx)),
            **sm90_compile.wait_report(ptx),
        })  # fmt: skip
    return report


def run(cases: list[dict]) -> list[dict]:
    """main(cases), in a process of its own without TRITON_INTERPRET (for the tests)."""
    import os
    import subprocess
    from pathlib import Path

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.sm90_compile_fp8", json.dumps(cases)],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
