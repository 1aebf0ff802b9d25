"""The grouped kernels (gluon_kernels.rmsnorm_fwd_held_group_kernel, rmsnorm_bwd_held_group_kernel)
called directly through their launchers (launch._forward_held_group, launch._backward_held_group:
no dispatch involved), and the scenarios the GPU tests and the probe run, each also runnable in
a process of its own (NVIDIA GPU only):

    python -m tests.held_group_scenarios digest '{"direction": "fwd", "config": 0, ...}'
    python -m tests.held_group_scenarios hold '{"direction": "bwd", "config": 0, "held": 8, ...}'
    python -m tests.held_group_scenarios probe OUT.json

digest prints the SHA-256 of y and rstd (forward) or dx and dw (backward) for seeded inputs;
hold runs the SM-holding scenario (hold_scenario) and prints its record; probe times each case
alone and beside a holder of HELD SMs and writes the records to OUT.json.

The SM holder: a kernel on another stream whose programs each take most of an SM's shared
memory (so that none of ours fits beside it) and spin on a flag in device memory, as a kernel
waiting on communication (NCCL's) polls device memory. Our call is queued on the main stream
after it, and the flag is set by a kernel queued on the main stream after our call: the holder
is released only once our call has finished. If the release has not happened within
HOLD_TIMEOUT_S, the host sets the flag itself through the copy engine (a host-to-device copy on
a stream of its own: no SM needed) and the record says so; a call that still does not end is
left to the parent's process timeout. (A holder spinning on pinned host memory slows every
kernel beside it, ours or not: 66 such programs made an elementwise kernel 15x slower,
probes/2026-12-02-bdfa048a7920-holder-slowdown-causes.json.)
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from harness.inputs import make_inputs
from impls.triton_rmsnorm import launch

#: Seconds the host waits for our call to release the holder before it releases it itself.
HOLD_TIMEOUT_S = 20.0
#: Shared memory each holder program takes: beside it no grouped program (36 KB or more) fits.
HOLD_SHARED_BYTES = 200 * 1024
EPS = 1e-5


def config_of(direction: str, index: int):
    return (launch.HELD_GROUP_FORWARDS if direction == "fwd" else launch.HELD_GROUP_BACKWARDS)[
        index
    ]


def grouped_forward(x, w, config, eps: float = EPS, offset: float = 0.0):
    """(y, rstd) of the grouped forward in `config`, launched directly."""
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    strides = (x.stride(0), y.stride(0), x.stride(0), x.stride(0))
    with torch.cuda.device(x.device):
        launch._forward_held_group(x, w, y, rstd, x, x, strides, float(eps), float(offset), False,
                                   config=config)  # fmt: skip
    return y, rstd


def grouped_backward(dy, x, w, rstd, config, offset: float = 0.0):
    """(dx, dw) of the grouped backward in `config`, launched directly."""
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    with torch.cuda.device(x.device):
        launch._backward_held_group(dy, x, w, rstd, float(offset), dx, dy, False, dw,
                                    config=config)  # fmt: skip
    return dx, dw


def case_inputs(case: dict):
    """x, w, dy (2-D) and the forward's rstd (fp32, rounded from fp64) of a case: shape, dtype,
    seed (0)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case["dtype"]]
    inputs = make_inputs(tuple(case["shape"]), dtype, "cuda", seed=case.get("seed", 0))
    x = inputs.x.reshape(-1, inputs.x.shape[-1])
    dy = inputs.dy.reshape(-1, x.shape[-1]).contiguous()
    rstd = torch.rsqrt(x.double().pow(2).mean(1) + EPS).float()
    return x, inputs.weight, dy, rstd


def call_of(case: dict):
    """A zero-argument callable running the case's grouped call, and what it returns."""
    x, w, dy, rstd = case_inputs(case)
    config = config_of(case["direction"], case["config"])
    if case["direction"] == "fwd":
        return lambda: grouped_forward(x, w, config)
    return lambda: grouped_backward(dy, x, w, rstd, config)


def digest(case: dict) -> dict:
    outputs = call_of(case)()
    torch.cuda.synchronize()
    names = ("y", "rstd") if case["direction"] == "fwd" else ("dx", "dw")
    return {
        name: hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        for name, t in zip(names, outputs, strict=True)
    }


@gluon.jit
def _hold_sms(FLAG, STARTED, KIB: gl.constexpr):
    """Takes KIB KiB of shared memory (written and read back, so it stays), marks itself
    started (STARTED[program] = 1: plain stores, as host memory takes no atomics everywhere),
    then spins until FLAG[0] is set."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    held = gl.allocate_shared_memory(gl.int32, [KIB, 256], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ids = gl.arange(0, 128, layout)
    held.index(KIB - 1).slice(0, 128).store(ids)
    gl.store(STARTED + gl.program_id(0) + ids * 0, ids * 0 + 1, mask=ids == 0)
    released = gl.load(FLAG, volatile=True)
    while released == 0:
        released = gl.load(FLAG, volatile=True)
    back = held.index(KIB - 1).slice(0, 128).load(layout)
    gl.store(STARTED + ids, back, mask=back < 0)  # never: the buffer is used


@triton.jit
def _release(FLAG):
    tl.store(FLAG, 1)


def _holder(held: int, flag: torch.Tensor, started: torch.Tensor, stream) -> None:
    """held programs of _hold_sms on `stream`, one an SM (HOLD_SHARED_BYTES each)."""
    with torch.cuda.stream(stream):
        _hold_sms[(held,)](flag, started, KIB=HOLD_SHARED_BYTES // 1024, num_warps=4)


def _time_alone(call, repeats: int = 10) -> float:
    """Median ms of one call, each between two events on the current stream."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def hold_scenario(case: dict) -> dict:
    """The SM-holding scenario for a case (direction, config, shape, dtype, held: SMs held):
    our call alone (median of 10), then `repeats` times beside a fresh holder; the record says
    whether every call released the holder itself (no host help), each call's time beside it,
    and the bits against the call alone."""
    began = time.monotonic()

    def progress(what: str) -> None:  # to stderr, so a killed run still says where it stood
        print(
            f"hold_scenario {time.monotonic() - began:7.2f} s: {what}", file=sys.stderr, flush=True
        )

    call = call_of(case)
    reference = [t.clone() for t in call()]
    torch.cuda.synchronize()
    progress("first call alone done (compiled)")
    alone = _time_alone(call)
    progress(f"alone {alone:.3f} ms")
    side, copier = torch.cuda.Stream(), torch.cuda.Stream()
    held = case["held"]
    flag = torch.zeros(2, dtype=torch.int32, device="cuda")
    one = torch.ones(2, dtype=torch.int32, pin_memory=True)
    started = torch.zeros(held, dtype=torch.int32, pin_memory=True)
    # Launch the release kernel once before any holder spins: under CUDA's lazy module loading
    # (the default), a kernel's first launch loads its module, which can wait for the device
    # to go idle, and the device never does while the holder spins (on the H200 each SM-holder
    # run hung right after "holder started" until this warm-up was added).
    _release[(1,)](flag)
    torch.cuda.synchronize()
    beside, helped, same_bits, holder_started = [], 0, True, True
    for _ in range(case.get("repeats", 3)):
        flag.zero_()
        started.zero_()
        torch.cuda.synchronize()  # the flag cleared before the holder, on its stream, reads it
        _holder(held, flag, started, side)
        deadline = time.monotonic() + 10.0
        while int(started.sum()) < held and time.monotonic() < deadline:
            time.sleep(0.001)
        holder_started &= int(started.sum()) == held
        progress(f"holder: {int(started.sum())} of {held} programs started")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        released = torch.cuda.Event()
        start.record()
        outputs = call()
        end.record()
        progress("our call queued")
        _release[(1,)](flag)
        released.record()
        progress("release queued")
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not released.query() and time.monotonic() < deadline:
            time.sleep(0.001)
        if not released.query():
            helped += 1
            with torch.cuda.stream(copier):  # the host releases the holder: our call waited
                flag.copy_(one, non_blocking=True)
            progress("our call did not release the holder: the host did")
        released.synchronize()
        copier.synchronize()  # a host release's copy lands before the next repeat clears the flag
        progress("released")
        side.synchronize()
        beside.append(start.elapsed_time(end))
        same_bits &= all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
    return {**case, "sms": launch._sm_count(0), "holder_started": holder_started,
            "host_released": helped, "alone_ms": alone, "beside_ms": beside,
            "ratio": statistics.median(beside) / alone, "same_bits": same_bits}  # fmt: skip


#: The probe's cases: the grouped paths' default configurations at wide shapes, fwd and bwd.
PROBE_CASES = [
    {"direction": "fwd", "config": 0, "shape": [512, 262144], "dtype": "bf16"},
    {"direction": "fwd", "config": 0, "shape": [2048, 65552], "dtype": "bf16"},
    {"direction": "bwd", "config": 0, "shape": [2048, 65536], "dtype": "bf16"},
    {"direction": "bwd", "config": 1, "shape": [64, 1048576], "dtype": "bf16"},
]


def probe(out_path: str) -> list:
    records = []
    for case in PROBE_CASES:
        for held in (8, 66):
            record = hold_scenario({**case, "held": held, "repeats": 5})
            print(json.dumps(record), flush=True)
            records.append(record)
    with open(out_path, "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "triton": triton.__version__, "records": records}, out, indent=1)  # fmt: skip
    return records


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "probe":
        probe(sys.argv[2])
    else:
        case = json.loads(sys.argv[2])
        print(json.dumps(digest(case) if mode == "digest" else hold_scenario(case)))
