"""Autotuning by the harness's device-only method: each candidate configuration is timed as
CUDA-graph replays of its launch over rotating copies of the launch's tensors, and the fastest
median wins. So the tuner ranks configurations the way results/ ranks backends (the same method
as harness.timing.time_device, written again here because the product does not import the
harness).

Why not triton.autotune: it times each config with do_bench, one isolated call after a 256 MB
memset that leaves the L2 full of dirty lines: its pick disagreed with the device-only fastest
config and changed between processes (docs/design.md, Dispatch).

The copies keep each tensor's size, strides and 16-byte alignment (Triton specializes on it), so
every copy runs the binary the real launch will run. Nothing is drawn from the RNG (copies are
made with copy_). The first argument set is the caller's own: its inputs are only read (no
kernel tuned here writes what it reads), its outputs are written on a side stream that the
caller's stream then waits for (the side stream is the tuning's private stream,
dispatch.private_stream: never one of PyTorch's pooled streams), and the real launch writes them again. The copies take at most
MAX_COPY_BYTES, freed when the tuning ends.

Only for CUDA tensors, outside CUDA-graph capture (the caller checks both).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
from triton.compiler.errors import CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError

from . import common, dispatch

#: As the harness's device-only timer: the rotating sets together touch more than 3x the L2
#: (at most 64 sets) ...
L2_MULTIPLE = 3
MAX_SETS = 64
#: ... unless their copies would take more than this many times the L2 (rows far apart in a
#: wider buffer make a copy much larger than the bytes a launch touches).
MAX_COPY_L2_MULTIPLE = 8
#: Per config: replays per sample to last ~SAMPLE_MS, median of SAMPLES samples.
SAMPLES = 5
SAMPLE_MS = 0.5

#: A configuration that cannot compile or launch on this GPU is skipped, as triton.autotune does.
UNRUNNABLE = (OutOfResources, CompileTimeAssertionFailure, PTXASError)


def _extent(t: torch.Tensor) -> int:
    """Elements from t's first element to its last, as its strides lay them out."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A tensor with t's values, size and strides at t's 16-byte alignment, in new memory. The
    memory span is copied whole (gaps included), so strides that repeat elements (an expanded
    tensor, stride 0) are copied as they are."""
    shift = (t.data_ptr() % 16) // t.element_size()
    extent = _extent(t)
    base = torch.empty(extent + shift, dtype=t.dtype, device=t.device)
    base[shift:].copy_(t.as_strided((extent,), (1,)))
    return base.as_strided(t.shape, t.stride(), shift)


@torch.no_grad()
def rotating_arguments(args: tuple, l2_bytes: int) -> list[tuple]:
    """args, then copies of args (each tensor copied once, aliases kept as aliases) until the
    sets together touch more than L2_MULTIPLE x the L2: at most MAX_SETS sets, and copies of at
    most MAX_COPY_L2_MULTIPLE x the L2 in all."""
    tensors = {id(a): a for a in args if isinstance(a, torch.Tensor)}
    touched = sum(t.numel() * t.element_size() for t in tensors.values())
    spanned = sum(_extent(t) * t.element_size() for t in tensors.values())
    sets = L2_MULTIPLE * l2_bytes // max(1, touched) + 1
    sets = min(sets, MAX_SETS, 1 + MAX_COPY_L2_MULTIPLE * l2_bytes // max(1, spanned))
    arg_sets = [args]
    for _ in range(max(1, sets) - 1):
        copies = {key: _copy(t) for key, t in tensors.items()}
        arg_sets.append(tuple(copies.get(id(a), a) for a in args))
    return arg_sets


def _median_ms(launch: Callable[[tuple], object], arg_sets: Sequence[tuple], stream) -> float:
    """Device-only ms per launch: one launch per argument set, captured in one CUDA graph.

    The capture is begun directly (torch.cuda.graph would synchronize the device and empty the
    caching allocator for every candidate), in thread-local mode: another thread's CUDA calls
    during the capture are not the capture's business."""
    with torch.cuda.stream(stream):  # compile and warm up outside the capture
        for args in arg_sets:
            launch(args)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for args in arg_sets:
                launch(args)
        finally:
            graph.capture_end()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays = max(1, min(1000, int(SAMPLE_MS / max(start.elapsed_time(end), 1e-3))))
        samples = []
        for _ in range(SAMPLES):
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / (replays * len(arg_sets)))
    del graph
    return statistics.median(samples)


def l2_bytes(device_index: int) -> int:
    return common.device_l2_bytes(device_index)


def fastest(
    candidates: Sequence, launch: Callable[[object, tuple], object], args: tuple, passes: int = 1
):
    """The candidate whose launch(candidate, args) takes the least device time (times); with
    one candidate, that one, untimed. Candidates that cannot compile on this GPU are skipped; if
    none can, the first one's error is raised."""
    if len(candidates) == 1:
        if passes < 1:
            raise ValueError(f"passes must be at least 1, got {passes}")
        return candidates[0]
    ms = times(candidates, launch, args, passes)
    return candidates[ms.index(min(ms))]


def times(
    candidates: Sequence, launch: Callable[[object, tuple], object], args: tuple, passes: int = 1
) -> list[float]:
    """Device-only ms of launch(candidate, args) for each candidate (inf for one that cannot
    compile or launch on this GPU; if none can, the first one's error is raised); args' tensors
    are CUDA tensors on the current device. With passes > 1 every candidate is timed that many
    times, every other pass in reverse order, and its best time counts."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    device_index = next(a for a in args if isinstance(a, torch.Tensor)).get_device()
    arg_sets = rotating_arguments(args, l2_bytes(device_index))
    stream = dispatch.tuning_stream()
    if stream is None:
        stream = dispatch.private_stream(device_index)
    stream.wait_stream(torch.cuda.current_stream())  # the caller's inputs and the copies
    ms, first_error = [float("inf")] * len(candidates), None
    try:
        for rep in range(passes):
            order = range(len(candidates)) if rep % 2 == 0 else reversed(range(len(candidates)))
            for i in order:
                if rep > 0 and ms[i] == float("inf"):
                    continue  # unrunnable
                try:
                    t = _median_ms(lambda a, c=candidates[i]: launch(c, a), arg_sets, stream)
                except UNRUNNABLE as error:
                    first_error = first_error or error
                    continue
                ms[i] = min(ms[i], t)
    finally:
        torch.cuda.current_stream().wait_stream(stream)
    if min(ms) == float("inf"):
        raise first_error
    return ms
