"""Compile rmsnorm_bwd_kernel for sm_90 without a GPU and report what its PTX contains.

Run in a process of its own, without TRITON_INTERPRET (the interpreter cannot run inline PTX,
and pytest's conftest sets it on machines without CUDA):

    python -m tests.sm90_compile '[{"x": "bf16", "dy": "bf16", "hold": true, ...}, ...]'

Each case names x's and dy's dtypes, HOLD_STORAGE_FORM, HAS_DH_OUT, num_warps and LOOP_STAGES
at BLOCK_N = 16384, BLOCK_M = 1. Prints one JSON list: per case, whether the PTX holds the bf16
and the fp16 inline upcasts of kernels._upcast_opaque (markers only its asm produces).
"""

from __future__ import annotations

import json
import sys

#: Text only _upcast_opaque's inline PTX puts in the PTX: LLVM writes the mask of its own bf16
#: conversions in decimal, and names no register lo or hi.
MARKERS = {"bf16": "0xFFFF0000", "fp16": "mov.b32 {lo, hi}"}
_POINTERS = ("X", "W", "DY", "RSTD", "DX", "DW_PARTIAL", "DH_OUT")


def compile_ptx(case: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from impls.triton_rmsnorm import kernels

    kernel = kernels.rmsnorm_bwd_kernel
    pointer_types = {"X": case["x"], "W": case["x"], "DY": case["dy"], "RSTD": "fp32",
                     "DX": case["x"], "DW_PARTIAL": "fp32", "DH_OUT": case["x"]}  # fmt: skip
    constexprs = {"BLOCK_M": 1, "BLOCK_N": 16384, "HAS_DH_OUT": case["dh_out"],
                  "LOOP_STAGES": case["stages"], "HOLD_STORAGE_FORM": case["hold"]}  # fmt: skip
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in _POINTERS:
            signature[name] = "*" + pointer_types[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in constexprs:
            signature[name] = "constexpr"
        elif name == "offset":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": case["warps"], "num_stages": case["stages"]}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def main(cases: list[dict]) -> list[dict]:
    report = []
    for case in cases:
        ptx = compile_ptx(case)
        report.append({dtype: marker in ptx for dtype, marker in MARKERS.items()})
    return report


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
