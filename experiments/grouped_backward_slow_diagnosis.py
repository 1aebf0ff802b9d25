"""Probe: why the grouped backward at 64x1048576 bf16 runs ~182 µs inside the full wide run
beside every peer (four runs of four) where fresh processes, shorter harness runs and fp16 in
the same run measure it at 124-144. The last run (`...-0eb2df0e87cf-wide-path-choice.txt`)
timed it slow in both passes of the path choice, three more times right after, and once on
fresh copies of its tensors (new memory, same 16-byte offsets): the slowness stays in the
process, with the GPU's clocks at 1980/3201 MHz and no throttle reason
(`...-0eb2df0e87cf-wide-clocks.csv`).

harness.compare runs with the arguments given, tuning.fastest wrapped as in
harness_path_choice.py (each choice printed; RMSNORM_PROBE_RETIMES as there). At every backward
path choice whose rows are 1048576 wide and that offers the grouped path, in both dtypes, this
also prints:
1. the grouped path's kernels one by one (torch.profiler, five calls after a warm-up, no
   graph): the exchange's zeroing, the grouped kernel, the dw reduction;
2. where its tensors sit in the caching allocator (each tensor's segment: base, size, pool)
   and the allocator's totals;
3. the grouped path on fresh copies after torch.cuda.empty_cache() (new segments);
4. the grouped path on the same values in the other 16-bit dtype (bf16 <-> fp16), fresh
   tensors;
5. at the end of the process (atexit), the grouped path again on the original tensors, kept.

Prediction: 3 and 4 fast (~125-140 µs) and 1 slow in the grouped kernel itself: the slowness
comes with where the bf16 run's tensors or the exchange's words were placed, not with the code.

Run from the repository root on an sm_90 GPU, with every peer installed:
    PYTHONPATH=.:experiments python experiments/grouped_backward_slow_diagnosis.py out.jsonl --preset wide --dtypes bf16 fp16
"""

import atexit
import sys
import time

import torch
from measured_path_choice import _recording

from harness import compare
from impls.triton_rmsnorm import launch, tuning

WIDTH = 1048576
KEPT = []  # (label, path, args) retimed at exit


def _time_us(path, args) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    ms = tuning._median_ms(lambda a: path(*a), [args], stream)
    torch.cuda.current_stream().wait_stream(stream)
    return ms * 1e3


def _kernels_us(path, args) -> str:
    path(*args)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            path(*args)
        torch.cuda.synchronize()
    cells = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = getattr(event, "cuda_time_total", 0.0)
        if event.count and total:
            cells.append(f"{event.key[:48]} x{event.count} {total / event.count:.1f} µs each")
    return "; ".join(cells)


def _placement(args) -> str:
    segments = torch.cuda.memory_snapshot()
    cells = []
    for index, t in enumerate(args):
        if not isinstance(t, torch.Tensor) or t.numel() < 1024:
            continue
        ptr = t.data_ptr()
        owner = next((s for s in segments
                      if s["address"] <= ptr < s["address"] + s["total_size"]), None)  # fmt: skip
        if owner is None:
            cells.append(f"arg{index} {ptr:#x} (no segment)")
            continue
        cells.append(f"arg{index} {ptr:#x} in seg {owner['address']:#x}+{owner['total_size'] >> 20}MiB "
                     f"{owner.get('segment_type')} pool {owner.get('segment_pool_id')} "
                     f"offset {(ptr - owner['address']) >> 20}MiB")  # fmt: skip
    stats = torch.cuda.memory_stats()
    cells.append(f"segments {stats.get('segment.all.current')} reserved "
                 f"{stats.get('reserved_bytes.all.current', 0) >> 20}MiB allocated "
                 f"{stats.get('allocated_bytes.all.current', 0) >> 20}MiB retries "
                 f"{stats.get('num_alloc_retries')}")  # fmt: skip
    return "\n      ".join(cells)


def _fresh(args, dtype=None):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            target = (
                dtype
                if dtype is not None and a.dtype in (torch.bfloat16, torch.float16)
                else a.dtype
            )
            out.append(a.to(dtype=target, copy=True))
        else:
            out.append(a)
    return tuple(out)


def _diagnose(path, args) -> None:
    x = args[1]
    label = f"{x.shape[0]}x{x.shape[1]} {x.dtype}"
    print(f"    diagnosis {label} at {time.strftime('%H:%M:%S')}", flush=True)
    print(f"      same tensors: {_time_us(path, args):.1f} µs", flush=True)
    print(f"      kernels: {_kernels_us(path, args)}", flush=True)
    print(f"      placement:\n      {_placement(args)}", flush=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fresh = _fresh(args)
    print(f"      after empty_cache, fresh copies: {_time_us(path, fresh):.1f} µs", flush=True)
    print(f"      their placement:\n      {_placement(fresh)}", flush=True)
    del fresh
    other = torch.float16 if x.dtype == torch.bfloat16 else torch.bfloat16
    print(
        f"      the other dtype ({other}): {_time_us(path, _fresh(args, other)):.1f} µs", flush=True
    )
    KEPT.append((label, path, args))


def _at_exit() -> None:
    for label, path, args in KEPT:
        print(
            f"at exit, {label} on its original tensors: {_time_us(path, args):.1f} µs", flush=True
        )


def _diagnosing(fastest):
    def wrapped(candidates, run, args, **options):
        chosen = fastest(candidates, run, args, **options)
        grouped = [c for c in candidates  # paths (partials since v28), not kernel configurations
                   if getattr(c, "func", None) is launch._backward_held_group]  # fmt: skip
        if args[1].shape[1] == WIDTH:
            for path in grouped:  # each configuration of the grouped backward (two since v28)
                print(f"    configuration {path.settings['config']}", flush=True)
                try:
                    _diagnose(path, args)
                except Exception as error:  # the probe's own failure: report it, go on
                    print(f"    diagnosis failed: {type(error).__name__}: {error}", flush=True)
        return chosen

    return wrapped


if __name__ == "__main__":
    tuning.fastest = _diagnosing(_recording(tuning.fastest))
    atexit.register(_at_exit)
    sys.exit(compare.main(["--out", sys.argv[1], *sys.argv[2:]]))
