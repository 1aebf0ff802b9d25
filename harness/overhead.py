"""python -m harness.overhead: each backend's per-call host overhead, in microseconds.

At small shapes the host, not the GPU, sets the pace (Python, argument checks, autograd, the
launch path), which is what decides host-inclusive rankings there. Measured directly: `calls`
back-to-back calls on a shape whose kernels take a few microseconds, timed on the host's clock
with one synchronize at the end; per call = wall time / calls. While the host is slower than the
GPU the launch queue never drains, so that is host time; the device-only time of the same call
is printed beside it, and a row whose host time is not clearly above it is marked gpu-bound
(then the host figure is only an upper bound).

For our kernel it also splits the cost: the launcher alone (no autograd, no checks) and the op
under torch.no_grad (checks, no autograd), beside the full training-mode call.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

#: Below this ratio of host to device time per call, the GPU may be what sets the pace.
GPU_BOUND_RATIO = 1.2


def host_us_per_call(call, calls: int) -> float:
    """Wall-clock microseconds per call over `calls` back-to-back calls (after a warm-up)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _device_us(backend, fn, mode: str, inputs) -> float:
    """The harness's device-only time of the public call (run._time_mode: the backward's
    forward runs on the capturing stream, so autograd replays it there)."""
    from harness.run import _time_mode

    return _time_mode(backend, fn, mode, "device", [inputs]).ms * 1e3


def _variants(backend, fn, inputs):
    """(label, mode, call) triples: the public call in both modes, plus our kernel's split."""
    from harness.calls import backward_call, forward_calls

    forwards, leaves = forward_calls(backend, fn, [inputs])
    forward = forwards[0]
    yield backend.name, "fwd", forward
    if backend.has_backward:
        yield backend.name, "bwd", backward_call(backend, forward(), leaves[0], inputs)
    if backend.role == "ours" and backend.op == "rmsnorm":
        from impls.triton_rmsnorm import launch, rmsnorm

        x, w, eps = inputs.x, inputs.weight, inputs.eps

        def no_grad_call():
            with torch.no_grad():
                return rmsnorm(x, w, eps)

        yield "triton (torch.no_grad)", "fwd", no_grad_call
        yield "triton (launcher only)", "fwd", lambda: launch.rmsnorm_forward(x, w, eps)
        # A/B in the same process: the same calls with replays off (launch.py, "replays")
        yield "triton (replays off)", "fwd", _without_replays(launch, forward)
        if backend.has_backward:
            backward = backward_call(backend, forward(), leaves[0], inputs)
            yield "triton (replays off)", "bwd", _without_replays(launch, backward)


def _without_replays(launch, call):
    """call with our launcher's replays turned off for its duration (two assignments)."""
    enabled = launch._REPLAYABLE

    def run():
        launch._REPLAYABLE = False
        try:
            return call()
        finally:
            launch._REPLAYABLE = enabled

    return run


def measure(backends, shape, dtype, calls: int) -> list[dict]:
    from harness.inputs import make_inputs

    rows = []
    for backend in backends:
        reason = backend.skip_reason(shape, dtype, "cuda")
        if reason:
            rows.append({"backend": backend.name, "status": "skipped", "reason": reason})
            continue
        try:
            fn = backend.build()
            inputs = make_inputs(shape, dtype, torch.device("cuda"))
            variants = list(_variants(backend, fn, inputs))
        except Exception as exc:  # one failing backend never ends the run
            rows.append({"backend": backend.name, "status": "error", "reason": repr(exc)[:200]})
            continue
        device_by_mode: dict[str, float | None] = {}  # one device timing per mode
        for label, mode, call in variants:
            try:
                host = host_us_per_call(call, calls)
                if mode not in device_by_mode:
                    # the launcher-only and no_grad variants run the public call's kernels
                    capturable = mode == "fwd" or backend.graph_capturable_backward
                    device_by_mode[mode] = (
                        _device_us(backend, fn, mode, inputs) if capturable else None
                    )
                device = device_by_mode[mode]
            except Exception as exc:
                torch.cuda.synchronize()
                rows.append({"backend": label, "mode": mode, "status": "error",
                             "reason": repr(exc)[:200]})  # fmt: skip
                continue
            rows.append({
                "backend": label, "mode": mode, "status": "ok", "host_us": host,
                "device_us": device, "gpu_bound": device is not None and host < GPU_BOUND_RATIO * device,
            })  # fmt: skip
    return rows


def _table(rows: list[dict]) -> str:
    from tabulate import tabulate

    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append(
                [r["backend"], r.get("mode", ""), f"{r['status']}: {r['reason'][:60]}", "", ""]
            )
            continue
        device = "n/a (not capturable)" if r["device_us"] is None else f"{r['device_us']:.1f}"
        body.append([r["backend"], r["mode"], f"{r['host_us']:.1f}", device,
                     "gpu-bound" if r["gpu_bound"] else ""])  # fmt: skip
    return tabulate(body, headers=["backend", "mode", "host us/call", "device us/call", ""])


def _parser() -> argparse.ArgumentParser:
    from impls import all_backends

    names = [b.name for b in all_backends("rmsnorm")]
    p = argparse.ArgumentParser(prog="python -m harness.overhead", description=__doc__,
                                epilog="Needs a CUDA GPU: it times host calls against the GPU's "
                                "queue; without one it exits with status 2.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--backends", nargs="+", metavar="NAME", choices=names,
                   help=f"default: every rmsnorm backend ({', '.join(names)})")  # fmt: skip
    p.add_argument(
        "--shape", default="512x2048", type=_shape, help="a small MxN (default 512x2048)"
    )
    p.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--calls", type=_positive, default=2000, help="back-to-back calls per timing")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    return p


def _shape(text: str) -> tuple[int, int]:
    from harness.shapes import parse_shape

    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("shape: ")) from exc


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    import sys

    from harness import provenance
    from impls import select_backends

    if not torch.cuda.is_available():
        # Before the registry imports triton (--help lists the backends); nothing runs here.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    args = _parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("harness.overhead: error: needs a CUDA GPU (it measures per-call host overhead "
              "against the GPU's queue); none is visible here", file=sys.stderr)  # fmt: skip
        return 2
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    shape = args.shape
    rows = measure(select_backends(args.backends, "rmsnorm"), shape, dtype, args.calls)
    info = provenance.collect()
    print(f"per-call host overhead, {shape[0]}x{shape[1]} {args.dtype}, {args.calls} calls, "
          f"{info.get('gpu') or 'GPU'}\n{_table(rows)}")  # fmt: skip
    if args.out:
        record = {"provenance": info, "shape": list(shape), "dtype": args.dtype, "rows": rows}
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
