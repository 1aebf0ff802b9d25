"""Probe: the wide backward's two steps run chunk by chunk of rows, so that step 2 re-reads x and
dy from L2.

At N >= 32768 the backward is two kernels over the whole matrix (`launch._backward_wide`):
rmsnorm_bwd_row_dot_kernel (mean(g * x_hat) per row: reads x and dy) and then
rmsnorm_bwd_columns_kernel (dx and the dw partials: reads x and dy again, writes dx). Between the
two reads of a row the whole of x and dy passes, so both come from HBM: 5·M·N elements for the
model's 3·M·N, at most 60% of the copy; measured 50-56% (run 4, dde60f4a7d8f).

Variant "chunks of B MiB": the same two kernels, launched on consecutive slices of R rows whose x
and dy together take B MiB, step 1 then step 2 on each slice before the next. If a slice fits in
L2 (60 MiB on the H200) beside the dx it writes, step 2 reads it from L2 and HBM sees about 3·M·N.
Each slice's step 2 writes its own dw partial rows (row groups as the product sizes them for the
slice); one reduction sums all of them at the end (a product version would accumulate into one
set instead, to keep target 6's memory bound). Costs: two launches per slice, and each launch's
ramp and tail.

Prediction: 2048x32768 bf16 (2 x 128 MiB of x and dy): at 16-32 MiB slices, ~60-70% of the copy
(3·M·N counted) against 55.7%, if L2 serves most of step 2's reads; at 8 MiB the launches' ramp
and tail eat it. Likewise at 1024x65536 and 512x131072. Unknown: how much of a 16-32 MiB slice
survives in L2 while dx streams out.

Each variant at the product's tuned configurations (the tuner runs at each kernel's first call
for a slice shape), bf16, device-only (the tuner's timer: CUDA graphs over rotating inputs, best
of three interleaved passes). dx is checked bit for bit against the product's (the same kernels on
the same rows); dw's largest difference from the product's is printed relative to each
element (the partials' sum runs over more rows; where dw is near zero that measure is large
without meaning: it is a sanity check, not a bound).

Run from the repository root on a GPU:
    PYTHONPATH=. python experiments/backward_wide_chunked_ab.py out.json
"""

import json
import sys

import torch
import triton
from ab_timing import time_runs

from harness.ceiling import card_ceiling_gbps
from impls.triton_rmsnorm import kernels, launch, tuning

SHAPES = [(2048, 32768), (1024, 65536), (512, 131072), (256, 262144)]
SLICE_MIB = [8, 16, 32]


def _chunked_run(m, n, rows_per_slice):
    """Both steps of the wide backward slice by slice (no residual gradient)."""
    slices = launch.cdiv(m, rows_per_slice)
    col_blocks = launch.cdiv(n, launch.WIDE_BLOCK_N)

    def groups(rows, device):
        row_groups = max(1, min(rows, launch._programs_cap(device) // col_blocks))
        per_group = launch.cdiv(rows, row_groups)
        return launch.cdiv(rows, per_group), per_group

    device = torch.device("cuda", torch.cuda.current_device())
    partial_rows = sum(groups(min(rows_per_slice, m - s * rows_per_slice), device)[0]
                       for s in range(slices))  # fmt: skip

    def run(a):
        dy, x, w, rstd, dx, dw, mean_gx, partial = a
        first = 0
        for s in range(slices):
            r0, r1 = s * rows_per_slice, min(m, (s + 1) * rows_per_slice)
            rows = r1 - r0
            xs, dys, dxs = x[r0:r1], dy[r0:r1], dx[r0:r1]
            launch._launch(
                "rmsnorm_bwd_row_dot_kernel", (rows,),
                xs, w, dys, rstd[r0:r1], mean_gx[r0:r1], xs.stride(0), dys.stride(0), n, 0.0,
                dtypes=(x.dtype, w.dtype, dy.dtype), BLOCK_N=launch.WIDE_BLOCK_N,
            )  # fmt: skip
            row_groups, per_group = groups(rows, x.device)
            launch._launch(
                "rmsnorm_bwd_columns_kernel", (col_blocks, row_groups),
                xs, w, dys, rstd[r0:r1], mean_gx[r0:r1], dxs, partial[first:], dxs,
                xs.stride(0), dys.stride(0), dxs.stride(0), dxs.stride(0), rows, n, per_group, 0.0,
                dtypes=(x.dtype, w.dtype, dy.dtype, dx.dtype), BLOCK_N=launch.WIDE_BLOCK_N,
                HAS_DH_OUT=False,
            )  # fmt: skip
            first += row_groups
        launch._launch_fixed(
            kernels.rmsnorm_dw_reduce_kernel, (launch.cdiv(n, launch.DW_REDUCE_BLOCK_N),),
            partial, dw, first, n,
            BLOCK_ROWS=min(triton.next_power_of_2(first), launch.DW_REDUCE_MAX_ROWS),
            BLOCK_N=launch.DW_REDUCE_BLOCK_N, num_warps=launch.DW_REDUCE_WARPS,
        )  # fmt: skip

    return run, partial_rows


def main(out_path: str) -> None:
    stream = torch.cuda.Stream()
    l2 = tuning.l2_bytes(0)
    rows_out = []
    print("GB/s of 3MN (% of the copy ceiling); dx / dw against the product's", flush=True)
    ceiling = None
    for m, n in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        rstd = torch.rand(m, device="cuda") + 0.5
        if ceiling is None:  # the harness's copy ceiling, for the percentages
            ceiling = card_ceiling_gbps()["ceiling_gbps"]
        dx_ref, dw_ref = launch.rmsnorm_backward(dy, x, w, rstd)
        configs = launch.take_launch_configs()
        runs = {
            "product": (
                lambda a: launch._backward_launches(
                    a[0], a[1], a[2], a[3], 0.0, a[4], a[0], False, a[5]
                ),
                0,
            )
        }
        row_bytes = n * 2 * 2
        for mib in SLICE_MIB:
            rows_per_slice = max(1, (mib << 20) // row_bytes)
            if rows_per_slice >= m:
                continue
            runs[f"chunks of {mib} MiB"] = _chunked_run(m, n, rows_per_slice)
        partial_rows = max(p for _, p in runs.values()) or 1
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        mean_gx = torch.empty(m, device="cuda")
        partial = torch.empty(partial_rows, n, device="cuda")
        checks = {}
        for name, (run, _) in runs.items():
            if name == "product":
                continue
            try:
                dx.fill_(float("nan"))
                run((dy, x, w, rstd, dx, dw, mean_gx, partial))
                torch.cuda.synchronize()
                ulps = (
                    (dw.float() - dw_ref.float()).abs() / (dw_ref.float().abs() * 2.0**-7)
                ).max()
                checks[name] = {"dx_differing": int((dx != dx_ref).sum()),
                                "dw_differing": int((dw != dw_ref).sum()),
                                "dw_max_ulps": float(ulps)}  # fmt: skip
            except Exception as error:
                checks[name] = {"error": f"{type(error).__name__}: {str(error)[:160]}"}
        arg_sets = tuning.rotating_arguments((dy, x, w, rstd, dx, dw, mean_gx, partial), l2)
        stream.wait_stream(torch.cuda.current_stream())
        timed = {name: run for name, (run, _) in runs.items()}
        times = time_runs(timed, arg_sets, stream, passes=3)
        gbps = {name: 3 * m * n * 2 / (us * 1e3) for name, us in times.items()}
        cells = "  ".join(
            f"{name}: {gbps[name]:5.0f} ({100 * gbps[name] / ceiling:4.1f}%)" for name in times
        )
        print(f"{m:5d}x{n:7d}  {cells}  {checks}", flush=True)
        rows_out.append({"m": m, "n": n, "us": times, "gbps": gbps, "checks": checks,
                         "product_configs": configs, "ceiling_gbps": ceiling})  # fmt: skip
        with open(out_path, "w") as f:  # rewritten after each shape
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows_out}, f, indent=0)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
