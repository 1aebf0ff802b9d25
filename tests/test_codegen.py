"""What the GPU would run, checked without a GPU: the cooperative kernels compiled for Hopper
(sm_90) by Triton's own compiler and ptxas, in a subprocess without the interpreter.

Its runtime (partners waiting on each other) can only be tested on a GPU; this pins down the
code that decides it: one acq_rel atomic to publish a row's partial, an acquire poll of the
count inside a loop, 128-bit loads and stores for the row's chunks, and no fused multiply-adds
(which could round a partner's partial sum and the fallback's recomputation differently)."""

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
    from impls.triton_rmsnorm import kernels, launch

    def ptx_of(kernel, tensors, ints, constexprs, aligned):
        # as launch.py launches them: its options, its untuned config
        config = launch._heuristic_config(kernel.fn.__name__, launch.COOP_BLOCK_N)
        warps, rows = config["num_warps"], config["BLOCK_M"]
        constexprs = {**constexprs, "BLOCK_M": rows}
        options = {"num_warps": warps, **launch.COOP_LAUNCH_OPTIONS}
        signature = {**tensors, **{name: "i32" for name in ints}, "eps": "fp32",
                     "offset": "fp32", **{name: "constexpr" for name in constexprs}}
        signature = {name: signature[name] for name in kernel.arg_names if name in signature}
        # what the launcher's arguments specialize to: 16-byte aligned pointers, strides and N
        # divisible by 16
        attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
        return ptx, rows * launch.COOP_BLOCK_N // (32 * warps)

    def counts(compiled):
        ptx, elements_per_thread = compiled
        count = lambda pattern: len(re.findall(pattern, ptx))
        return {
            "v4_per_chunk": elements_per_thread * 2 // 16,  # bf16 tile, 16 B per access
            "acq_rel_atomics": count(r"atom\\.global\\.gpu\\.acq_rel\\.add"),
            "acquire_polls": count(r"(?:ld|atom)\\.global\\.gpu\\.acquire"),
            "v4_loads": count(r"ld\\.global\\.v4"),
            "v4_stores": count(r"st\\.global\\.v4"),
            "b16_loads": count(r"ld\\.global\\.b16"),
            "volatile_loads": count(r"ld\\.volatile\\.global"),
            "fma": count(r"\\bfma\\."),
        }

    constexprs = {"BLOCK_N": launch.COOP_BLOCK_N, "BLOCK_S": 128,
                  "SPIN_LIMIT": launch.COOP_SPIN_LIMIT, "PROGRAMS_PER_SM": 1}
    forward = ptx_of(
        kernels.rmsnorm_fwd_coop_kernel,
        {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "PARTIAL": "*fp32",
         "COUNT": "*i32"},
        ["stride_x_row", "stride_y_row", "M", "N", "splits", "ROWS_BUCKET"], constexprs,
        ["X", "W", "Y", "RSTD", "PARTIAL", "COUNT", "stride_x_row", "stride_y_row", "N"])
    backward = ptx_of(
        kernels.rmsnorm_bwd_coop_kernel,
        {"X": "*bf16", "W": "*bf16", "DY": "*bf16", "RSTD": "*fp32", "DX": "*bf16",
         "DW_PARTIAL": "*fp32", "DH_OUT": "*bf16", "PARTIAL": "*fp32", "COUNT": "*i32"},
        ["stride_x_row", "stride_dy_row", "stride_dx_row", "stride_dh_row", "M", "N", "splits",
         "ROWS_BUCKET"], {**constexprs, "HAS_DH_OUT": False},
        ["X", "W", "DY", "RSTD", "DX", "DW_PARTIAL", "DH_OUT", "PARTIAL", "COUNT",
         "stride_x_row", "stride_dy_row", "stride_dx_row", "stride_dh_row", "N"])
    print(json.dumps({"forward": counts(forward), "backward": counts(backward)}))
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


@pytest.fixture(scope="module")
def compiled_counts() -> dict:
    return _compile_for_hopper()


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_cooperative_kernels_compile_to_a_release_and_an_acquire_poll(compiled_counts, direction):
    counts = compiled_counts[direction]
    assert counts["acq_rel_atomics"] == 1, counts  # publish: one per row, one thread
    # the poll: an atomic add of 0 with acquire (lowered to an acquire load for one row)
    assert counts["acquire_polls"] == 1, counts
    assert counts["volatile_loads"] >= 1, counts  # the partners' partials, past L1
    # this exchange's tile, the next one's, the fallback's (and w): 128-bit accesses only
    per_chunk = counts["v4_per_chunk"]
    assert counts["v4_loads"] >= 3 * per_chunk and counts["b16_loads"] == 0, counts
    assert counts["v4_stores"] >= per_chunk, counts
    # no contraction: a partner's partial and the fallback's recomputation of it round alike
    assert counts["fma"] == 0, counts
