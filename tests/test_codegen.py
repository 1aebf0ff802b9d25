"""What the GPU would run, checked without a GPU: the cooperative forward compiled for Hopper
(sm_90) by Triton's own compiler and ptxas, in a subprocess without the interpreter.

Its runtime (partners waiting on each other) can only be tested on a GPU; this pins down the
code that decides it: one acq_rel atomic to publish a row's partial, an acquire load polling the
count inside a loop, 128-bit loads and stores for the row's chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json, re, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from impls.triton_rmsnorm import kernels

    kernel = kernels.rmsnorm_fwd_coop_kernel
    signature = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "PARTIAL": "*fp32",
                 "COUNT": "*i32", "stride_x_row": "i32", "stride_y_row": "i32", "M": "i32",
                 "N": "i32", "splits": "i32", "eps": "fp32", "offset": "fp32",
                 "ROWS_BUCKET": "i32", "BLOCK_N": "constexpr", "BLOCK_S": "constexpr",
                 "SPIN_LIMIT": "constexpr", "PROGRAMS_PER_SM": "constexpr"}
    constexprs = {"BLOCK_N": 8192, "BLOCK_S": 128, "SPIN_LIMIT": 4096, "PROGRAMS_PER_SM": 2}
    # what the launcher's arguments specialize to: 16-byte aligned pointers, strides and N
    # divisible by 16
    aligned = ["X", "W", "Y", "RSTD", "PARTIAL", "COUNT", "stride_x_row", "stride_y_row", "N"]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = compiled.asm["ptx"]
    count = lambda pattern: len(re.findall(pattern, ptx))
    print(json.dumps({
        "acq_rel_atomics": count(r"atom\\.global\\.gpu\\.acq_rel\\.add"),
        "acquire_loads": count(r"ld\\.global\\.gpu\\.acquire"),
        "v4_loads": count(r"ld\\.global\\.v4"),
        "v4_stores": count(r"st\\.global\\.v4"),
        "b16_loads": count(r"ld\\.global\\.b16"),
        "volatile_loads": count(r"ld\\.volatile\\.global"),
    }))
    """
)


def _compile_for_hopper() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if proc.returncode != 0:
        if "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
            pytest.skip("this triton has no ptxas to compile for sm_90")
        raise AssertionError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cooperative_forward_compiles_to_a_release_and_an_acquire_poll():
    counts = _compile_for_hopper()
    assert counts["acq_rel_atomics"] == 1, counts  # publish: one per row, one thread
    assert counts["acquire_loads"] == 1, counts  # the poll (an atomic add of 0, as a load)
    assert counts["volatile_loads"] == 1, counts  # the partners' partials, past L1
    # w, this row, the next row and the fallback's chunk: 128-bit accesses only
    assert counts["v4_loads"] >= 12 and counts["b16_loads"] == 0, counts
    assert counts["v4_stores"] >= 4, counts
