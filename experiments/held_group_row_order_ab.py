"""Probe: the grouped forward with its groups' rows interleaved (group g takes rows g, g + G,
g + 2G, ...) instead of contiguous chunks, after `...-58c1c681e183-grouped-fill-drain.txt` and
`...-58c1c681e183-held-group-forward-diagnostics.txt`.

The fill-and-drain probe put the grouped forward's cost a row at 89.6% of the copy at 131072
columns (24 groups), 92.0% at 262144 (12) and 93.2% at 1048576 (3): the fewer the groups, the
closer to the copy. The diagnostics probe found the kernel *slower* without its exchange (0.94-
0.98x), when nothing holds a group's programs together. Both point at where the reads land:
with contiguous chunks the groups read G rows spread over the whole input at once (24 places
5 MB apart at 512x131072), and programs that drift apart spread them further; the copy kernel
(95.9-97.1%) sweeps the input in order. Interleaved, the G rows in flight are neighbours.

Variant made from the product kernel's source by text substitution, as in
held_group_forward_diagnostics.py: rows row_start = group, stepping by the number of groups,
to M. Each row's sum is formed the same way, so y and rstd should match the product's bit for
bit. Device-only, the tuner's timer, best of two interleaved passes.

Also "first row alone": a program stages its first row's slice and publishes its sum before it
stages the rest of its ring (the first row's sum then waits for one slice, not the ring's), a
probe of the fill's share of the fixed cost (4.8-7.4 µs a call against the copy's 2.3-2.6).

Prediction: interleaved 1.02-1.05x at 512x131072 and 256x262144 (toward the 1M's cost a row),
within 1% at 64x1048576 (3 groups).

Run from the repository root on an sm_90 GPU:
    PYTHONPATH=.:experiments python experiments/held_group_row_order_ab.py out.json
"""

import json
import sys
import tempfile

import torch
from ab_timing import time_runs
from held_group_forward_diagnostics import _forward, _variant_module

from impls.triton_rmsnorm import gluon_kernels, launch, tuning

SHAPES = [
    (512, 131072, torch.bfloat16),
    (512, 131072, torch.float16),
    (1024, 131072, torch.bfloat16),
    (256, 262144, torch.bfloat16),
    (256, 262144, torch.float16),
    (64, 1048576, torch.bfloat16),
]

INTERLEAVED = [
    (
        "    row_start = group.to(gl.int64) * rows_per_group\n"
        "    row_end = gl.minimum(row_start + rows_per_group, M)\n",
        "    groups = gl.num_programs(0) // GROUP\n"
        "    row_start = group.to(gl.int64)\n"
        "    row_end = M\n",
    ),
    (
        "_stage_slice(x_ring, s, X, stride_x_row, row_start + s, row_end, cols, N)",
        "_stage_slice(x_ring, s, X, stride_x_row, row_start + s * groups, row_end, cols, N)",
    ),
    (
        "    for row in range(row_start, row_end):\n        j = row - row_start\n",
        "    for row in range(row_start, row_end, groups):\n        j = (row - row_start) // groups\n",
    ),
    (
        "        if row + 1 < row_end:\n            _publish_sum(SUMS, row + 1, member, sumsq, GROUP)\n",
        "        if row + groups < row_end:\n"
        "            _publish_sum(SUMS, row + groups, member, sumsq, GROUP)\n",
    ),
    (
        "_stage_slice(x_ring, slot, X, stride_x_row, row + RING, row_end, cols, N)",
        "_stage_slice(x_ring, slot, X, stride_x_row, row + RING * groups, row_end, cols, N)",
    ),
]
FIRST_ROW_ALONE = [
    (
        "    for s in gl.static_range(RING):\n"
        "        _stage_slice(x_ring, s, X, stride_x_row, row_start + s, row_end, cols, N)\n"
        "    sumsq = _staged_sumsq(x_ring, 0, cols, layout, N, RING - 1)\n"
        "    _publish_sum(SUMS, row_start, member, sumsq, GROUP)  # every group has a row\n",
        "    _stage_slice(x_ring, 0, X, stride_x_row, row_start, row_end, cols, N)\n"
        "    sumsq = _staged_sumsq(x_ring, 0, cols, layout, N, 0)\n"
        "    _publish_sum(SUMS, row_start, member, sumsq, GROUP)  # every group has a row\n"
        "    for s in gl.static_range(1, RING):\n"
        "        _stage_slice(x_ring, s, X, stride_x_row, row_start + s, row_end, cols, N)\n",
    ),
]


def main(out_path: str) -> None:
    folder = tempfile.mkdtemp(prefix="held_group_order_")
    modules = {"product": gluon_kernels,
               "interleaved": _variant_module("interleaved", INTERLEAVED, folder),
               "first row alone": _variant_module("first row alone", FIRST_ROW_ALONE, folder)}  # fmt: skip
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    result = {"gpu": torch.cuda.get_device_name(), "rows": []}
    print("GB/s (2MN), % of 4250, x the product's time", flush=True)
    for m, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        y, rstd = torch.empty_like(x), torch.empty(m, device="cuda")
        for config in launch.HELD_GROUP_FORWARDS:
            runs = {name: _forward(module, config) for name, module in modules.items()}
            got = {}
            for name, run in runs.items():
                y.fill_(float("nan"))
                rstd.fill_(float("nan"))
                run((x, w, y, rstd))
                torch.cuda.synchronize()
                got[name] = (y.clone(), rstd.clone())
            same = {
                name: all(torch.equal(a, b) for a, b in zip(got["product"], got[name], strict=True))
                for name in modules
                if name != "product"
            }
            arg_sets = tuning.rotating_arguments((x, w, y, rstd), l2)
            stream.wait_stream(torch.cuda.current_stream())
            times = time_runs(runs, arg_sets, stream)
            gbps = {k: 2 * m * n * x.element_size() / (us * 1e3) for k, us in times.items()}
            label = f"{m}x{n} {str(dtype)[6:]} slice {config.slice_n}"
            line = "  ".join(f"{k} {v:5.0f} ({v / 42.5:4.1f}%)" for k, v in gbps.items())
            speed = "  ".join(f"{k} {times['product'] / times[k]:.3f}x" for k in same)
            print(f"{label}: {line}  {speed}  bit for bit {same}", flush=True)
            result["rows"].append({"case": label, "us": times, "gbps": gbps, "bit_for_bit": same})
            with open(out_path, "w") as f:
                json.dump(result, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
