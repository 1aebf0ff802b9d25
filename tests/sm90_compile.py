"""Compile the kernels with inline upcasts for sm_90 without a GPU and report what their PTX holds.

Run in a process of its own, without TRITON_INTERPRET (the interpreter cannot run inline PTX,
and pytest's conftest sets it on machines without CUDA):

    python -m tests.sm90_compile '[{"kernel": "bwd", "x": "bf16", "dy": "bf16", "hold": true, ...}]'

Each case names the kernel ("bwd": rmsnorm_bwd_kernel, "fwd": rmsnorm_fwd_kernel,
"bwd_shifted" and "fwd_shifted": rmsnorm_bwd_shifted_kernel and rmsnorm_fwd_shifted_kernel with
16-bit rows of odd N, MAY_WRAP as the case's "wrap" says, "held_row":
gluon_kernels.rmsnorm_fwd_held_row_kernel, whose case gives only x, block_n and warps,
"held_row_bwd": gluon_kernels.rmsnorm_bwd_held_row_kernel, x, block_n, warps and extra;
"held_group_bwd": gluon_kernels.rmsnorm_bwd_held_group_kernel, x, block_n, extra and
optionally config, an index into launch.HELD_GROUP_BACKWARDS (default 0);
"held_group_fwd": gluon_kernels.rmsnorm_fwd_held_group_kernel, x, block_n and config, an
index into launch.HELD_GROUP_FORWARDS), x's dtype
(and dy's, for the backward), HOLD_STORAGE_FORM, HAS_DH_OUT or HAS_RESIDUAL ("extra"), the tile
width, num_warps, LOOP_STAGES and, for the forward, whether programs walk the tiles
(PERSISTENT; the backward always does), with BLOCK_M = 1. Prints
one JSON list: per case, whether the PTX holds the bf16 and the fp16 inline upcasts of
kernels._upcast_opaque or the Gluon kernels' _upcast_opaque and _upcast_pairs (markers only their
asm produces), for held_row its cp.async copies, and
for the shifted kernels how many 16-byte global loads, cp.async copies and stores they have;
with "count_fp32_stores" in a case, its scalar fp32 stores (the forwards' rstd).
"""

from __future__ import annotations

import inspect
import json
import re
import sys

#: Text only the inline upcasts put in the PTX (kernels._upcast_opaque, and in Gluon
#: _upcast_opaque and, bf16 only, _upcast_pairs): LLVM writes the mask of its own bf16
#: conversions in decimal, and names no register lo or hi.
#: Shared memory a program may ask for on the H100 and H200.
HOPPER_SHARED_BYTES = 232448

MARKERS = {"bf16": "0xFFFF0000", "fp16": "mov.b32 {lo, hi}"}


def compile_ptx(case: dict) -> str:
    from impls.triton_rmsnorm import kernels

    if case["kernel"] == "held_row":
        return _compile_held_row_ptx(case)
    if case["kernel"] == "held_row_bwd":
        return _compile_held_row_backward_ptx(case)
    if case["kernel"] == "held_group_bwd":
        return _compile_held_group_backward_ptx(case)
    if case["kernel"] == "held_group_fwd":
        return _compile_held_group_forward_ptx(case)
    x, stages = case["x"], case["stages"]
    if case["kernel"] in ("bwd", "bwd_shifted"):
        kernel = kernels.rmsnorm_bwd_kernel
        pointer_types = {"X": x, "W": x, "DY": case["dy"], "RSTD": "fp32", "DX": x,
                         "DW_PARTIAL": "fp32", "DH_OUT": x}  # fmt: skip
        constexprs = {"HAS_DH_OUT": case["extra"]}
        if case["kernel"] == "bwd_shifted":  # odd N: 8 residue classes, the last columns wrap
            kernel = kernels.rmsnorm_bwd_shifted_kernel
            constexprs.update(VEC=8, PERIOD=8, MAY_WRAP=case["wrap"])
    elif case["kernel"] == "fwd_shifted":
        kernel = kernels.rmsnorm_fwd_shifted_kernel
        pointer_types = {"X": x, "W": x, "Y": x, "RSTD": "fp32", "R": x, "H": x}
        constexprs = {"N": case["block_n"] - 1, "HAS_RESIDUAL": case["extra"], "VEC": 8,
                      "PERIOD": 8, "MAY_WRAP": case["wrap"]}  # fmt: skip
    else:
        kernel = kernels.rmsnorm_fwd_kernel
        pointer_types = {"X": x, "W": x, "Y": x, "RSTD": "fp32", "R": x, "H": x}
        constexprs = {"N": case["block_n"], "HAS_RESIDUAL": case["extra"],
                      "PERSISTENT": case["persistent"], "ROWS_CONTIGUOUS": True,
                      "W_EARLY": case.get("w_early", False)}  # fmt: skip
    constexprs.update(BLOCK_M=1, BLOCK_N=case["block_n"], LOOP_STAGES=stages,
                      HOLD_STORAGE_FORM=case["hold"], **case.get("constexprs", {}))  # fmt: skip
    options = {"num_warps": case["warps"], "num_stages": stages}
    return _ptx(kernel, pointer_types, constexprs, options)


def _compile_held_row_ptx(case: dict) -> str:
    """gluon_kernels.rmsnorm_fwd_held_row_kernel at N = block_n, as launch configures it, its
    row strides divisible by 16 (as launch requires)."""
    from impls.triton_rmsnorm import gluon_kernels, launch

    n, x = case["block_n"], case["x"]
    pointer_types = {"X": x, "W": x, "Y": x, "RSTD": "fp32"}
    constexprs = {"N": n, "REG": launch.HELD_ROW_REG, "CHUNK": launch.HELD_ROW_CHUNK,
                  "SHARED_CHUNKS": launch._held_row_shared_chunks(n), "WARPS": case["warps"]}  # fmt: skip
    return _ptx(gluon_kernels.rmsnorm_fwd_held_row_kernel, pointer_types, constexprs,
                {"num_warps": case["warps"]}, divisible=("stride_x_row", "stride_y_row"))  # fmt: skip


#: The held backwards' row strides, divisible by 16 as launch requires.
_BACKWARD_ROW_STRIDES = ("stride_x_row", "stride_dy_row", "stride_dx_row", "stride_dh_row")


def _held_backward_pointers(x: str) -> dict:
    """The held backwards' pointer types: x, dy, dx, w and dh_out of x's dtype."""
    return {"X": x, "W": x, "DY": x, "RSTD": "fp32", "DX": x, "DW_PARTIAL": "fp32", "DH_OUT": x}


def _compile_held_row_backward_ptx(case: dict) -> str:
    """gluon_kernels.rmsnorm_bwd_held_row_kernel at N = block_n, x, dy, dx and w of the case's
    x dtype (dh_out too, with "extra"), as launch configures it on a device with 227 KB of
    shared memory a program (the H100's and H200's), row strides divisible by 16."""
    from impls.triton_rmsnorm import gluon_kernels, launch

    n, x = case["block_n"], case["x"]
    chunks = launch.cdiv(n, launch.HELD_BACKWARD_CHUNK)
    ring = launch.held_backward_ring_slots(n, HOPPER_SHARED_BYTES)
    constexprs = {"N": n, "CHUNK": launch.HELD_BACKWARD_CHUNK, "CHUNKS": chunks, "RING": ring,
                  "HAS_DH_OUT": case["extra"], "WARPS": case["warps"]}  # fmt: skip
    return _ptx(gluon_kernels.rmsnorm_bwd_held_row_kernel, _held_backward_pointers(x),
                constexprs, {"num_warps": case["warps"]}, divisible=_BACKWARD_ROW_STRIDES)  # fmt: skip


def _compile_held_group_backward_ptx(case: dict) -> str:
    """gluon_kernels.rmsnorm_bwd_held_group_kernel at N = block_n, as launch configures it in
    launch.HELD_GROUP_BACKWARDS[case.get("config", 0)], its register cap included (x, dy, dx, w
    and dh_out of the case's x dtype, row strides divisible by 16)."""
    from impls.triton_rmsnorm import gluon_kernels, launch

    n, x = case["block_n"], case["x"]
    config = launch.HELD_GROUP_BACKWARDS[case.get("config", 0)]
    pointer_types = {**_held_backward_pointers(x), "SUMS": "i64", "CTRL": "i32"}
    group = launch.cdiv(n, config.slice_n)
    constexprs = {"N": n, "GROUP": group, "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "CHUNK": config.chunk, "CHUNKS": config.chunks, "RING": config.ring,
                  "HAS_DH_OUT": case["extra"], "WARPS": config.warps,
                  "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT}  # fmt: skip
    options = {"num_warps": config.warps, **launch._register_cap(config.per_sm, config.warps)}
    return _ptx(gluon_kernels.rmsnorm_bwd_held_group_kernel, pointer_types, constexprs, options,
                divisible=_BACKWARD_ROW_STRIDES)  # fmt: skip


def _compile_held_group_forward_ptx(case: dict) -> str:
    """gluon_kernels.rmsnorm_fwd_held_group_kernel at N = block_n, as launch configures it in
    launch.HELD_GROUP_FORWARDS[case["config"]], its register cap included (x, w and y of the
    case's x dtype, row strides divisible by 16)."""
    from impls.triton_rmsnorm import gluon_kernels, launch

    n, x = case["block_n"], case["x"]
    config = launch.HELD_GROUP_FORWARDS[case["config"]]
    pointer_types = {"X": x, "W": x, "Y": x, "RSTD": "fp32", "SUMS": "i64", "CTRL": "i32"}
    group = launch.cdiv(n, config.slice_n)
    constexprs = {"N": n, "GROUP": group,
                  "GROUP_PADDED": launch.held_group_words(group, config.warps),
                  "SLICE": config.slice_n, "RING": config.ring, "WARPS": config.warps,
                  "SPIN_LIMIT": launch.HELD_GROUP_SPIN_LIMIT}  # fmt: skip
    options = {"num_warps": config.warps, **launch._register_cap(config.per_sm, config.warps)}
    return _ptx(gluon_kernels.rmsnorm_fwd_held_group_kernel, pointer_types, constexprs, options,
                divisible=("stride_x_row", "stride_y_row"))  # fmt: skip


def _barriers_in_polls_and_fallback(ptx: str) -> int:
    """The grouped kernels' barriers (bar.* and barrier.*) and shared-memory accesses from the
    first line of the sums' poll loop (the last loop holding volatile loads before the
    fallback's loops; the others poll tickets and claims) to the back edge of the fallback's
    loops (those holding 16-byte global loads), none of them holding atomics. Up to 32 words a
    row a program's warps may take different branches there (gluon_group_exchange._read_sums), so
    there must be none; past 32 the reductions of the words cross warps (barriers and shared
    memory), which is what makes the warps decide alike. -1 if either loop is not found."""
    lines = ptx.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        label = re.match(r"\s*(\$L__BB\d+_\d+):", line)
        if label:
            labels[label.group(1)] = i
    loops = []  # (first line, back edge): a branch to a label above it
    for i, line in enumerate(lines):
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if branch and labels.get(branch.group(1), i) < i:
            loops.append((labels[branch.group(1)], i))

    def holding(pattern: str) -> list:
        bodies = [(lo, "\n".join(lines[lo[0] : lo[1] + 1])) for lo in loops]
        return [lo for lo, body in bodies if re.search(pattern, body) and "atom." not in body]

    fallbacks = holding(r"ld\.global\.v4")
    if not fallbacks:
        return -1
    first_fallback = min(lo[0] for lo in fallbacks)
    polls = [lo for lo in holding(r"ld\.volatile\.global") if lo[1] < first_fallback]
    if not polls:
        return -1
    start, end = max(lo[0] for lo in polls), max(lo[1] for lo in fallbacks)
    synced = re.compile(r"\b(?:bar|barrier)\.|\.shared\b")
    return sum(bool(synced.search(line)) for line in lines[start : end + 1])


_EMPTY = inspect.Parameter.empty


def _ptx(kernel, pointer_types: dict, constexprs: dict, options: dict, divisible=()) -> str:
    """The kernel's PTX for sm_90 (compile_sm90)."""
    return compile_sm90(kernel, pointer_types, constexprs, options, divisible).asm["ptx"]


def compile_sm90(kernel, pointer_types: dict, constexprs: dict, options: dict, divisible=()):
    """The kernel compiled for sm_90 (Triton's CompiledKernel): pointers 16-byte aligned, eps
    and offset fp32, constexprs not given at their defaults (as a launch that leaves them out),
    other scalars i32 (those named in divisible marked divisible by 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    constexprs = dict(constexprs)
    for param in kernel.params:  # a defaulted constexpr left out takes its default, as at launch
        if param.is_constexpr and param.name not in constexprs and param.default is not _EMPTY:
            constexprs[param.name] = param.default
    for index, name in enumerate(kernel.arg_names):
        if name in pointer_types:
            signature[name] = "*" + pointer_types[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in constexprs:
            signature[name] = "constexpr"
        elif name in ("offset", "eps"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name in divisible:
                attrs[(index,)] = [["tt.divisibility", 16]]
    source_type = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    source = source_type(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def run(cases: list[dict]) -> list[dict]:
    """main(cases), in a process of its own without TRITON_INTERPRET (for the tests)."""
    import os
    import subprocess
    from pathlib import Path

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.sm90_compile", json.dumps(cases)],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_report(ptx: str) -> dict:
    """How many griddepcontrol.wait the PTX holds, and whether one comes before every global
    load, store and cp.async (a kernel launched with PDL: WAIT_FOR_PRIOR_GRID)."""
    wait = ptx.find("griddepcontrol.wait")
    first_access = re.search(r"\b(?:ld|st)\.global|cp\.async", ptx)
    return {
        "waits": ptx.count("griddepcontrol.wait"),
        "waits before any global access": wait >= 0
        and (first_access is None or wait < first_access.start()),
    }


def main(cases: list[dict]) -> list[dict]:
    report = []
    for case in cases:
        ptx = compile_ptx(case)
        found = {dtype: marker in ptx for dtype, marker in MARKERS.items()}
        if case["kernel"] == "held_row":  # its rows go through shared memory by cp.async
            found["cp.async"] = "cp.async.cg.shared.global" in ptx
        if case["kernel"] in ("held_group_bwd", "held_group_fwd"):  # the exchange's ordering
            found["relaxed exchanges"] = len(
                re.findall(r"atom\.global\.gpu\.relaxed\.exch\.b(?:32|64)", ptx)
            )
            found["relaxed adds"] = len(re.findall(r"atom\.global\.gpu\.relaxed\.add\.u32", ptx))
            found["acquires or releases"] = len(re.findall(r"\.(?:acquire|release)\b", ptx))
            found["volatile loads"] = len(
                re.findall(r"ld\.volatile\.global\.(?:v2\.)?b(?:32|64)", ptx)
            )
            found["barriers from the polls through the fallback"] = _barriers_in_polls_and_fallback(
                ptx
            )
        if case["kernel"] in ("held_group_bwd", "held_group_fwd"):  # several an SM: capped
            cap = re.search(r"\.maxnreg (\d+)", ptx)
            found["register cap"] = int(cap.group(1)) if cap else None
        if case["kernel"] in ("held_row_bwd", "held_group_bwd", "held_group_fwd"):  # 16 bytes
            found["staged vectors"] = ptx.count("cp.async.cg.shared.global")
            found["vector stores"] = ptx.count("st.global.v4.b32")
        if case["kernel"] in ("bwd_shifted", "fwd_shifted"):  # (cp.async.cg: 16 bytes only)
            found["vector loads"] = ptx.count("ld.global.v4.b32")
            found["staged vectors"] = ptx.count("cp.async.cg.shared.global")
            found["vector stores"] = ptx.count("st.global.v4.b32")
        if case.get("report_wait"):  # WAIT_FOR_PRIOR_GRID: the wait comes before any access
            found.update(wait_report(ptx))
        if case.get("count_fp32_stores"):  # the forwards' rstd: one fp32 a row (STORE_RSTD)
            found["fp32 stores"] = len(re.findall(r"st\.global\.b32", ptx))
        if (
            case["kernel"] == "fwd" and "w_early" in case
        ):  # W_EARLY issues w's loads before the reduction's shuffles
            first_shuffle = ptx.find("shfl.sync")
            found["loads before the reduction"] = len(
                re.findall(r"ld\.global", ptx[: first_shuffle if first_shuffle >= 0 else None])
            )
        report.append(found)
    return report


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
