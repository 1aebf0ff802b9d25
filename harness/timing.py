"""Two timers for every measurement, and nothing else.

- host-inclusive ("host"): triton.testing.do_bench, the seed's method: warm-up, many reps, L2
  flushed before each rep, median with p20 and p80. Includes per-call host overhead (Python,
  argument checks, launch), which decides small shapes.
- device-only ("device"): the calls, one per rotating input set, captured in one CUDA graph and
  replayed; per-call time = replay time / calls. The input sets together exceed 3x the L2, so
  neither launch overhead nor L2 residency enters the number.

Compilation and autotuning happen in the warm-up, never inside a timed region.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

QUANTILES = (0.5, 0.2, 0.8)


@dataclass(frozen=True)
class Timing:
    ms: float  # median per call
    p20: float
    p80: float


def time_host(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> Timing:
    """Host-inclusive time of fn() on CUDA: do_bench median, p20, p80 in milliseconds."""
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES)
    )
    return Timing(med, p20, p80)


def time_cpu(fn: Callable[[], object], *, reps: int = 5) -> Timing:
    """Wall-clock time on a machine without CUDA. Not a performance number: the interpreter."""
    fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return _quantiles(samples)


def _quantiles(samples: Sequence[float]) -> Timing:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return Timing(statistics.median(ordered), at(0.2), at(0.8))


def l2_bytes(device: torch.device | None = None) -> int:
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0) or 50 << 20)


def rotating_sets(bytes_per_call: int, *, l2_multiple: float = 3.0, cap: int = 64) -> int:
    """How many distinct input sets a device-only timing cycles through to exceed 3x the L2."""
    needed = int(l2_multiple * l2_bytes() // max(1, bytes_per_call)) + 1
    return max(1, min(cap, needed))


def time_device(
    calls: Sequence[Callable[[], object]],
    stream: torch.cuda.Stream,
    *,
    samples: int = 15,
    target_sample_ms: float = 2.0,
) -> Timing:
    """Device-only per-call time of ``calls`` captured once, in order, in one CUDA graph.

    The caller warms the calls up on ``stream`` (forward passes whose backward is captured must
    also run on it, so that autograd replays the backward on the capturing stream).
    """
    graph = torch.cuda.CUDAGraph()
    # Every call's outputs stay alive until the timing ends, so each call writes its own buffers,
    # as the copy floor does; a dropped output would hand the next call the same, L2-warm buffer.
    outputs = []
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            outputs.append(call())
    graph.replay()
    torch.cuda.synchronize()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    one_replay_ms = max(start.elapsed_time(end), 1e-3)
    replays = max(1, min(1000, int(target_sample_ms / one_replay_ms)))

    per_call = []
    for _ in range(samples):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / (replays * len(calls)))
    del graph, outputs
    return _quantiles(per_call)


def warm_up(calls: Sequence[Callable[[], object]], stream: torch.cuda.Stream, rounds: int = 3):
    """Run calls on ``stream`` (compiles, autotunes, settles allocator pools) before capture."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(rounds):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
