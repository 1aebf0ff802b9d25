"""python -m harness.ncu_bytes: DRAM bytes each backend moves, by Nsight Compute, beside the model.

The byte model (harness.traffic) counts what RMSNorm must move. This checks it against the
hardware: one ncu process per backend and dtype runs

    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum
        --csv --page details --print-units base python -m harness.ncu_bytes --child ...

and the child warms every call up first (compilation and autotuning are not profiled), then,
between cudaProfilerStart and cudaProfilerStop, launches for each measurement i a marker kernel
(``_ncu_marker``, grid i + 1, which touches no memory) followed by the call. Every kernel after
marker i and before the next marker belongs to call i, so a call of several kernels (eager, a
two-kernel backward) is summed whatever its kernels are named. ncu flushes the caches before each
kernel it profiles (its default --cache-control all), so reads come from DRAM. Per call: DRAM
bytes read and written, the kernel count, the model's bytes and their ratio; a backend that
moves more than the model (a second pass over x, spilled rows, an fp32 copy) shows a ratio
above 1.

Reads are the check: every byte a call reads comes from DRAM, so DRAM reads / the model's reads
is near 1 for a backend that reads its inputs once (the O(N) weight and partials on top). Writes
are a floor: ncu counts DRAM writes while the call's kernels run, and lines a kernel wrote that
are still in L2 when it ends (the H200's holds 60 MB) reach DRAM later, uncounted. On the H200
a 32 MiB forward output showed 9 MB of DRAM writes and a 256 KiB one none
(results/nvidia-h200/ncu-bytes-*.json), so a write ratio below 1 is not a saving, and the
total ratio sits under 1 for a backend that moves exactly the model's bytes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from harness import traffic

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
MARKER = "_ncu_marker"
_GRID_X = re.compile(r"\(?\s*(\d+)")
_UNITS = {"byte": 1, "bytes": 1, "b": 1, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6,
          "gbyte": 1e9, "gb": 1e9, "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}  # fmt: skip
#: Each ncu process gets this long (profiling replays every kernel): a call never hangs.
NCU_TIMEOUT_S = 480.0


def ncu_command(ncu: str, child: list[str]) -> list[str]:
    return [ncu, "--target-processes", "all", "--profile-from-start", "off",
            "--metrics", ",".join(METRICS), "--csv", "--page", "details",
            "--print-units", "base", *child]  # fmt: skip


def parse_csv(text: str) -> dict[int, dict]:
    """ncu's --csv details output -> {measurement index: {"read": B, "write": B, "kernels": k}}.

    Lines before the CSV header (ncu's ==PROF== notes, the program's own output) are skipped,
    as is any line that does not parse as a row of the header's width. Rows are taken in ncu's
    order; a marker kernel of grid (i + 1) starts measurement i, and every later kernel counts
    toward it until the next marker. Values may carry thousands separators; units are
    converted to bytes.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"ID"') and '"Metric Name"' in line), None)  # fmt: skip
    if start is None:
        raise ValueError('ncu output: no CSV header ("ID",...,"Metric Name") found')
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    col = {name: header.index(name) for name in ("ID", "Kernel Name", "Grid Size", "Metric Name",
                                                  "Metric Unit", "Metric Value")}  # fmt: skip
    out: dict[int, dict] = defaultdict(lambda: {"read": 0.0, "write": 0.0, "kernel_ids": set()})
    current = None
    for row in reader:
        if len(row) != len(header):
            continue
        if MARKER in row[col["Kernel Name"]]:
            grid = _GRID_X.match(row[col["Grid Size"]])
            if grid is None:
                raise ValueError(f"ncu output: marker grid {row[col['Grid Size']]!r} unreadable")
            current = int(grid.group(1)) - 1
            out[current]  # a call with no kernel of its own still appears, with zero bytes
            continue
        metric = row[col["Metric Name"]]
        if current is None or metric not in METRICS:
            continue
        unit = row[col["Metric Unit"]].strip().lower()
        if unit not in _UNITS:
            raise ValueError(f"ncu output: unknown unit {row[col['Metric Unit']]!r} for {metric}")
        value = float(row[col["Metric Value"]].replace(",", "")) * _UNITS[unit]
        entry = out[current]
        entry["read" if metric.startswith("dram__bytes_read") else "write"] += value
        entry["kernel_ids"].add(row[col["ID"]])
    return {
        index: {"read": e["read"], "write": e["write"], "kernels": len(e["kernel_ids"])}
        for index, e in out.items()
    }


def plan(backend_name: str, shapes: list[str], modes: list[str]) -> list[dict]:
    """The child's measurements, in order; their index names their NVTX range."""
    return [{"index": i, "backend": backend_name, "shape": s, "mode": m}
            for i, (s, m) in enumerate((s, m) for s in shapes for m in modes)]  # fmt: skip


def records(plan_: list[dict], measured: dict[int, dict], dtype: str, op: str,
            errors: dict[int, str]) -> list[dict]:  # fmt: skip
    """One record per measurement: DRAM bytes beside the model's (traffic.model_bytes)."""
    out = []
    for p in plan_:
        model, model_read = traffic.model_bytes(p["shape"], p["mode"], dtype, op)
        rec = {**p, "dtype": dtype, "op": op, "model_bytes": model,
               "model_read_bytes": model_read, "model_write_bytes": model - model_read}  # fmt: skip
        got = measured.get(p["index"])
        if p["index"] in errors:
            rec["error"] = errors[p["index"]]
        elif got is None:
            rec["error"] = "no kernel profiled for this call"
        else:
            rec.update(dram_read_bytes=got["read"], dram_write_bytes=got["write"],
                       dram_bytes=got["read"] + got["write"], kernels=got["kernels"],
                       ratio=(got["read"] + got["write"]) / model,
                       read_ratio=got["read"] / model_read)  # fmt: skip
        out.append(rec)
    return out


def _marker_kernel():
    import triton

    @triton.jit
    def _ncu_marker(X):  # touches no memory: its grid size names the call that follows
        pass

    return _ncu_marker


def child(backend_name: str, dtype_name: str, plan_: list[dict], errors_path: Path) -> None:
    """Under ncu: warm every call up, then profile marker i + call i for each measurement."""
    import torch

    from harness.calls import DTYPES, backward_call, forward_calls
    from harness.layouts import make_case_inputs
    from harness.shapes import parse_shape
    from impls import get_backend

    backend = get_backend(backend_name)
    fn = backend.build()
    marker = _marker_kernel()
    dummy = torch.empty(1, device="cuda")
    marker[(1,)](dummy)
    errors: dict[int, str] = {}
    calls = []
    for p in plan_:
        try:
            shape = parse_shape(p["shape"])
            inputs = make_case_inputs(shape, DTYPES[dtype_name], "cuda", seed=77,
                                      with_residual=backend.op == "add_rmsnorm")  # fmt: skip
            forwards, leaves = forward_calls(backend, fn, [inputs])
            call = forwards[0]
            if p["mode"] == "bwd":
                call = backward_call(backend, forwards[0](), leaves[0], inputs)
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            calls.append((p["index"], call, inputs))
        except Exception as exc:
            torch.cuda.synchronize()
            errors[p["index"]] = f"{type(exc).__name__}: {exc}"[:300]
    torch.cuda.profiler.start()
    for index, call, _ in calls:
        try:
            marker[(index + 1,)](dummy)
            call()
            torch.cuda.synchronize()
        except Exception as exc:
            torch.cuda.synchronize()
            errors[index] = f"{type(exc).__name__}: {exc}"[:300]
    torch.cuda.profiler.stop()
    errors_path.write_text(json.dumps(errors))


def measure_backend(backend, shapes: list[str], modes: list[str], dtype: str, ncu: str,
                    workdir: Path) -> list[dict]:  # fmt: skip
    """Profile one backend's calls in one ncu process; records for each measurement."""
    from harness.calls import DTYPES
    from harness.layouts import case_skip_reason
    from harness.shapes import parse_shape

    modes = [m for m in modes if m == "fwd" or backend.has_backward]
    runnable = [s for s in shapes
                if case_skip_reason(backend, parse_shape(s), DTYPES[dtype], "cuda")
                is None]  # fmt: skip
    plan_ = plan(backend.name, runnable, modes)
    if not plan_:
        return []
    plan_path = workdir / f"{backend.name}-{dtype}-plan.json"
    errors_path = workdir / f"{backend.name}-{dtype}-errors.json"
    plan_path.write_text(json.dumps(plan_))
    argv = ncu_command(ncu, [sys.executable, "-m", "harness.ncu_bytes", "--child",
                             "--backends", backend.name, "--dtype", dtype,
                             "--plan", str(plan_path), "--errors", str(errors_path)])  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=NCU_TIMEOUT_S,
                              cwd=str(Path(__file__).resolve().parent.parent))  # fmt: skip
        measured = parse_csv(done.stdout)
        errors = json.loads(errors_path.read_text()) if errors_path.exists() else {}
        errors = {int(k): v for k, v in errors.items()}
    except Exception as exc:  # timeout, no CSV: every measurement says why
        text = f"{type(exc).__name__}: {exc}"[:300]
        return records(plan_, {}, dtype, backend.op, {p["index"]: text for p in plan_})
    return records(plan_, measured, dtype, backend.op, errors)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.ncu_bytes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--backends", nargs="+", metavar="NAME", help="default: every backend")
    p.add_argument("--shapes", nargs="+", default=["4096x4096", "16x8192"], metavar="SHAPE",
                   help="MxN or TxHxD/qkvW cases (default 4096x4096 16x8192)")  # fmt: skip
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="the ncu executable")
    p.add_argument("--out", type=Path, default=None, help="JSON records (default: print only)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--errors", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.backends[0], args.dtype, json.loads(args.plan.read_text()), args.errors)
        return 0
    import tempfile

    import torch

    from harness import provenance
    from harness.cost_tables import ncu_table
    from impls import select_backends

    if not torch.cuda.is_available():
        print("harness.ncu_bytes profiles CUDA kernels; no CUDA device is visible here.")
        return 1
    found: list[dict] = []
    info = provenance.collect()
    with tempfile.TemporaryDirectory(prefix="rmsnorm-ncu-") as tmp:
        for backend in select_backends(args.backends, None):
            if backend.unavailable() is not None:
                continue
            found += measure_backend(backend, args.shapes, args.modes, args.dtype, args.ncu,
                                     Path(tmp))  # fmt: skip
            print(f"  ncu: {backend.name} done", file=sys.stderr, flush=True)
            if args.out:  # after every backend: a run cut short keeps what it measured
                args.out.write_text(json.dumps({"provenance": info, "records": found},
                                               indent=1, default=str))  # fmt: skip
    print(ncu_table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
