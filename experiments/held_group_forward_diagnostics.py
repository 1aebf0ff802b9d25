"""Probe (diagnostic): what the grouped forward's exchange costs it, against the same kernel with
the exchange cut out.

The grouped forward (gluon_kernels.rmsnorm_fwd_held_group_kernel, v21-v24) runs at 81-84% of
the copy at 131072-1048576 columns in every configuration swept (`...-2c36f439a200-forward-
group-config-sweep.txt`), QuACK at 89-91%. Either the pipeline itself (stage a slice, sum it,
write y, restage) tops out there, or the exchange (publish a slice's sum, wait for the partners'
words) holds each row back. Here the product's kernel beside two variants made from its own
source by text substitution (so they track the product's kernel as it is when the probe runs):
- "no wait": the partners' words are loaded and the own sum published as in the product, but a
  row does not wait for its partners' tags: it sums whatever words it loaded first.
- "no exchange": nothing published, nothing loaded; each program scales by its own slice's sum
  (times the slices): only the pipeline is left.
Both variants' y is wrong (they are diagnostics); the product's is checked against launch's
single-call result. Also timed: the exchange buffer's zeroing alone (the product's torch.zeros a
call), and harness.ceiling's copy kernel over the same bytes. Device-only, the tuner's timer,
best of two interleaved passes, at the product's configurations (launch.HELD_GROUP_FORWARDS).

Prediction: "no exchange" 86-89% of the copy at 131072 and 262144 (the exchange costs 4-7%:
each row waits for the slowest of 32-64 programs on different SMs, with one row of slack);
"no wait" in between; the zeroing 1-2 µs of a 70-80 µs call.

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_forward_diagnostics.py out.json
"""

import importlib.util
import inspect
import json
import os
import sys
import tempfile

import torch
from ab_timing import time_runs

from harness.ceiling import triton_copy
from impls.triton_rmsnorm import gluon_kernels, held_paths, launch, tuning

SHAPES = [
    (512, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (64, 1048576, torch.bfloat16),
    (512, 131072, torch.float16),
]

READ_SUMS = """        complete, total, polls = _read_sums(SUMS, words, row, tag_offset, part_ids, polls, GROUP,
                                            SPIN_LIMIT)  # fmt: skip
"""
LOAD_WORDS = (
    "        words = _load_sums(SUMS, row, part_ids, GROUP)  # in flight over the next row's sum\n"
)
PUBLISH_NEXT = "            _publish_sum(SUMS, row + 1, member, sumsq, GROUP)\n"
FALLBACK = """        if complete == 0:  # partners absent: the whole row from global memory
            total = _row_sumsq_from_global(X, row, stride_x_row, warp_cols, N)
"""
NO_WAIT = """        total = gl.sum(gl.where(part_ids < GROUP, (words & 0xFFFFFFFF).to(gl.int32).to(
            gl.float32, bitcast=True), 0.0), axis=0)
"""
NO_EXCHANGE = "        total = sumsq * GROUP\n"

VARIANTS = {
    "no wait": [(READ_SUMS, NO_WAIT), (FALLBACK, "")],
    "no exchange": [
        (READ_SUMS, NO_EXCHANGE),
        (FALLBACK, ""),
        (LOAD_WORDS, ""),
        (PUBLISH_NEXT, "            sumsq = sumsq + 0.0\n"),
    ],  # fmt: skip
}


def _variant_module(name: str, substitutions, folder: str):
    """gluon_kernels with `substitutions` made in the grouped forward's source (each must match
    exactly once), loaded as a module of the same package (its relative imports resolve)."""
    source = inspect.getsource(gluon_kernels)
    head, kernel = source.split("def rmsnorm_fwd_held_group_kernel(", 1)
    for old, new in substitutions:
        if kernel.count(old) != 1:
            raise RuntimeError(f"variant {name!r}: {old!r} found {kernel.count(old)} times")
        kernel = kernel.replace(old, new)
    path = os.path.join(folder, f"gluon_kernels_{name.replace(' ', '_')}.py")
    with open(path, "w") as f:
        f.write(head + "def rmsnorm_fwd_held_group_kernel(" + kernel)
    spec = importlib.util.spec_from_file_location(
        f"impls.triton_rmsnorm.gluon_kernels_{name.replace(' ', '_')}", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward(module, config):
    def run(a):
        x, w, y, rstd = a[:4]
        kept = held_paths.gluon_kernels
        held_paths.gluon_kernels = module
        try:
            strides = (x.stride(0), y.stride(0), x.stride(0), x.stride(0))
            launch._forward_held_group(x, w, y, rstd, x, x, strides, 1e-6, 0.0, False,
                                       config=config)  # fmt: skip
        finally:
            held_paths.gluon_kernels = kept

    return run


def main(out_path: str) -> None:
    folder = tempfile.mkdtemp(prefix="held_group_diag_")
    modules = {"product": gluon_kernels}
    modules.update({name: _variant_module(name, subs, folder) for name, subs in VARIANTS.items()})
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (2MN), % of 4250, x the product's time", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y_ref, rstd_ref, _ = launch.rmsnorm_forward(x, w, 1e-6)
        launch.take_launch_configs()
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        src, dst = torch.empty_like(x), torch.empty_like(x)
        for config in launch.HELD_GROUP_FORWARDS:
            group = launch.cdiv(n, config.slice_n)
            sums = torch.zeros(m * group, dtype=torch.int64, device="cuda")
            runs = {name: _forward(module, config) for name, module in modules.items()}
            runs["zeroing alone"] = lambda a, s=sums: s.zero_()
            runs["copy"] = lambda a: triton_copy(a[4], a[5])
            checks = {}
            for name in modules:
                y.fill_(float("nan"))
                runs[name]((x, w, y, rstd))
                torch.cuda.synchronize()
                checks[name] = {
                    "y_max_abs_diff": float((y.float() - y_ref.float()).abs().max()),
                    "rstd_max_rel_diff": float(((rstd - rstd_ref) / rstd_ref).abs().max()),
                }
            arg_sets = tuning.rotating_arguments((x, w, y, rstd, src, dst), l2)
            stream.wait_stream(torch.cuda.current_stream())
            times = time_runs(runs, arg_sets, stream)
            label = f"{m}x{n} {str(dtype)[6:]} slice {config.slice_n} x {group}"
            print(label, flush=True)
            for k, us in times.items():
                gbps = 2 * m * n * x.element_size() / (us * 1e3)
                print(f"    {k:14s} {us:7.1f} µs  {gbps:5.0f} {gbps / 42.5:5.1f}%  "
                      f"{times['product'] / us:.3f}x  {checks.get(k, '')}", flush=True)  # fmt: skip
            result["rows"].append({"case": label, "us": times, "checks": checks})
            with open(out_path, "w") as f:
                json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
