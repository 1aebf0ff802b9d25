"""Probe: the grouped backward with its groups' rows interleaved (group g of G takes rows g,
g + G, ...), as the grouped forward's since `...-d1891c3c1f47-held-group-row-order-ab.txt`
(1.01-1.07x there), instead of contiguous chunks.

The fill-and-drain probe (`...-58c1c681e183-grouped-fill-drain.txt`) put the grouped backward's
cost a row at 86.9% of the copy at 131072 columns (16 groups of 8 programs), 88.5% at 262144 (8
of 16) and 75.4% at 1048576 (2 of 64). Variant made from the product's source by text
substitution: in rmsnorm_bwd_held_group_kernel the rows step by the number of groups, and its
second pass calls a copy of _second_pass_chunk that restages the row RING chunks on in the
group's order. Each row's sum is formed the same way, so dx should match the product's bit for
bit; dw's partials sum other rows a group, so dw may differ in its last bits. The whole
backward (zeroing, kernel, dw reduction) through launch._backward_held_group, device-only, the
tuner's timer, best of two interleaved passes.

Prediction: 1.01-1.03x at 131072 and 262144 (16 and 8 groups), within 1% at 1048576 (2).

It ran at 6e0569859fab. Its text substitution expects that commit's source: since v26
(76541bfb6a7d) the calls it rewrites are laid out differently and it stops with an error; run it
from a tree at 6e0569859fab.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_backward_row_order_ab.py out.json
"""

import importlib.util
import inspect
import json
import os
import sys
import tempfile

import torch
from ab_timing import time_runs

from impls.triton_rmsnorm import gluon_kernels, held_paths, launch, tuning

SHAPES = [
    (512, 131072, torch.bfloat16),
    (1024, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (256, 262144, torch.float16),
    (1024, 65536, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
]

KERNEL_SUBSTITUTIONS = [
    (
        "    row_start = group.to(gl.int64) * rows_per_group\n"
        "    row_end = gl.minimum(row_start + rows_per_group, M)\n",
        "    groups = gl.num_programs(0) // GROUP\n    row_start = group.to(gl.int64)\n",
    ),
    ("row_start + s // CHUNKS, row_end,", "row_start + s // CHUNKS * groups, M,"),
    (
        "    for row in range(row_start, row_end):\n        j = row - row_start\n",
        "    for row in range(row_start, M, groups):\n        j = (row - row_start) // groups\n",
    ),
    (
        "        if row + 1 < row_end:\n            _publish_sum(SUMS, row + 1, member, dot, GROUP)\n",
        "        if row + groups < M:\n            _publish_sum(SUMS, row + groups, member, dot, GROUP)\n",
    ),
    ("DX, DH_OUT, row, row_end,\n", "DX, DH_OUT, row, M, groups,\n"),
    ("_second_pass_chunk(*args,", "_second_pass_chunk_step(*args,"),
]
HELPER_SUBSTITUTIONS = [
    ("def _second_pass_chunk(", "def _second_pass_chunk_step("),
    ("DH_OUT, row, row_end, stride_x_row,", "DH_OUT, row, row_end, row_step, stride_x_row,"),
    ("row + (k + RING) // CHUNKS, row_end,", "row + (k + RING) // CHUNKS * row_step, row_end,"),
]


def _substitute(text: str, substitutions, count: int = 1) -> str:
    for old, new in substitutions:
        found = text.count(old)
        if found < count or (count == 1 and found != 1):
            raise RuntimeError(f"{old!r} found {found} times")
        text = text.replace(old, new)
    return text


def _interleaved_module(folder: str):
    source = inspect.getsource(gluon_kernels)
    start = source.index("def rmsnorm_bwd_held_group_kernel(")
    end = source.index("@gluon.jit\ndef _publish_sum(")
    kernel = _substitute(source[start:end], KERNEL_SUBSTITUTIONS[:5])
    kernel = _substitute(kernel, KERNEL_SUBSTITUTIONS[5:], count=2)
    h_start = source.index("@gluon.jit\ndef _second_pass_chunk(")
    h_end = source.index("@gluon.jit", h_start + 1)
    helper = _substitute(source[h_start:h_end], HELPER_SUBSTITUTIONS)
    text = source[:start] + kernel + source[end:] + "\n\n" + helper
    path = os.path.join(folder, "gluon_kernels_backward_interleaved.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(
        "impls.triton_rmsnorm.gluon_kernels_backward_interleaved", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _backward(module):
    def run(a):
        x, w, dy, rstd, dx, dw = a
        kept = held_paths.gluon_kernels
        held_paths.gluon_kernels = module
        try:
            config = launch.HELD_GROUP_BACKWARDS[1]  # the one it measured (before v28)
            launch._backward_held_group(dy, x, w, rstd, 0.0, dx, dx, False, dw, config=config)
        finally:
            held_paths.gluon_kernels = kept

    return run


def main(out_path: str) -> None:
    modules = {"product": gluon_kernels,
               "interleaved": _interleaved_module(tempfile.mkdtemp(prefix="bwd_order_"))}  # fmt: skip
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (3MN), % of 4250, x the product's time", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        _, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        runs = {name: _backward(module) for name, module in modules.items()}
        got = {}
        for name, run in runs.items():
            dx.fill_(float("nan"))
            dw.fill_(float("nan"))
            run((x, w, dy, rstd, dx, dw))
            torch.cuda.synchronize()
            got[name] = (dx.clone(), dw.clone())
        dx_same = torch.equal(got["product"][0], got["interleaved"][0])
        dw_diff = float(
            ((got["product"][1].float() - got["interleaved"][1].float()).abs()
             / got["product"][1].float().abs().clamp_min(1e-3)).max()
        )  # fmt: skip
        arg_sets = tuning.rotating_arguments((x, w, dy, rstd, dx, dw), l2)
        stream.wait_stream(torch.cuda.current_stream())
        times = time_runs(runs, arg_sets, stream)
        gbps = {k: 3 * m * n * x.element_size() / (us * 1e3) for k, us in times.items()}
        line = "  ".join(f"{k} {v:5.0f} ({v / 42.5:4.1f}%)" for k, v in gbps.items())
        print(f"{m}x{n} {str(dtype)[6:]}: {line}  interleaved "
              f"{times['product'] / times['interleaved']:.3f}x  dx bit for bit {dx_same}, "
              f"dw max rel diff {dw_diff:.2e}", flush=True)  # fmt: skip
        result["rows"].append({"m": m, "n": n, "dtype": str(dtype), "us": times, "gbps": gbps,
                               "dx_bit_for_bit": dx_same, "dw_max_rel_diff": dw_diff})  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
