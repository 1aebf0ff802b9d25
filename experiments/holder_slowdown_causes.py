"""Probe (issue 30, item 3): why the grouped calls ran 27-134x their time alone beside a kernel
holding 66 of the 132 SMs (probes/2026-12-02-4a1227f11028-held-group-beside-holder.json), when
beside 8 held they ran 1.16-1.82x.

Question: is it the grouped kernels' waiting (a program whose partners' words do not come polls
SPIN_LIMIT times before computing its rows alone), or the holder itself (66 programs of 4 warps
spinning on volatile loads of pinned host memory, over PCIe), which would slow any kernel?

Each case runs beside a fresh holder of HELD SMs (tests/held_group_scenarios.py's, released by a
kernel queued after the call), median of REPEATS, against the same call alone:
- grouped: the grouped call as the probe ran it (config 0, SPIN_LIMIT 2^20);
- grouped-spin-2^14: the same with SPIN_LIMIT 2^14 (a time that falls with it: the polls);
- elementwise: torch.mul of the same x (an ordinary kernel reading and writing as many bytes);
- grouped, device flag: the holder spins on a flag in device memory (set by the same release
  kernel; the host's last resort writes it through the copy engine), not in pinned host memory.

    PYTHONPATH=.:experiments python experiments/holder_slowdown_causes.py OUT.json [HELD ...]

Verdict and numbers: docs/perf-log.md (Item 3: beside 66 held SMs), docs/held-group-progress.md.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import triton

from impls.triton_rmsnorm import held_launch
from tests import held_group_scenarios as scenarios

REPEATS = 5
#: Seconds before the host releases the holder itself.
TIMEOUT_S = 10.0
CASES = [
    {"direction": "fwd", "config": 0, "shape": [512, 262144], "dtype": "bf16"},
    {"direction": "bwd", "config": 0, "shape": [2048, 65536], "dtype": "bf16"},
]


def beside_holder(call, held: int, device_flag: bool) -> dict:
    """call's ms beside a fresh holder of `held` SMs, REPEATS times, and how often the host had
    to release the holder."""
    side, copier = torch.cuda.Stream(), torch.cuda.Stream()
    started = torch.zeros(held, dtype=torch.int32, pin_memory=True)
    one = torch.ones(2, dtype=torch.int32, pin_memory=True)
    if device_flag:
        flag = torch.zeros(2, dtype=torch.int32, device="cuda")
    else:
        flag = torch.zeros(2, dtype=torch.int32, pin_memory=True)
    scenarios._release[(1,)](flag)  # loads its module before any holder spins
    torch.cuda.synchronize()
    times, helped = [], 0
    for _ in range(REPEATS):
        flag.zero_()
        started.zero_()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            # the same holder kernel either way: it spins on whatever memory FLAG points to
            scenarios._hold_sms[(held,)](flag, started, KIB=scenarios.HOLD_SHARED_BYTES // 1024,
                                         num_warps=4)  # fmt: skip
        deadline = time.monotonic() + 10.0
        while int(started.sum()) < held and time.monotonic() < deadline:
            time.sleep(0.001)
        start, end, released = (torch.cuda.Event(enable_timing=True),
                                torch.cuda.Event(enable_timing=True), torch.cuda.Event())  # fmt: skip
        start.record()
        call()
        end.record()
        scenarios._release[(1,)](flag)
        released.record()
        deadline = time.monotonic() + TIMEOUT_S
        while not released.query() and time.monotonic() < deadline:
            time.sleep(0.001)
        if not released.query():
            helped += 1
            if device_flag:
                with torch.cuda.stream(copier):
                    flag.copy_(one, non_blocking=True)  # the copy engine: no SM needed
            else:
                flag[0] = 1
        released.synchronize()
        copier.synchronize()  # a host release's copy lands before the next repeat clears the flag
        side.synchronize()
        times.append(start.elapsed_time(end))
    return {"beside_ms": times, "median_ms": statistics.median(times), "host_released": helped}


def run(held_counts) -> list:
    records = []
    for case in CASES:
        x, _, _, _ = scenarios.case_inputs(case)
        variants = [
            ("grouped", scenarios.call_of(case), False, 1 << 20),
            ("grouped-spin-2^14", scenarios.call_of(case), False, 1 << 14),
            ("elementwise", lambda x=x: torch.mul(x, 2), False, 1 << 20),
            ("grouped, device flag", scenarios.call_of(case), True, 1 << 20),
        ]
        for name, call, device_flag, spin in variants:
            held_launch.HELD_GROUP_SPIN_LIMIT = spin
            call()
            torch.cuda.synchronize()
            alone = scenarios._time_alone(call)
            for held in held_counts:
                record = {**case, "variant": name, "held": held, "spin_limit": spin,
                          "alone_ms": alone, **beside_holder(call, held, device_flag)}  # fmt: skip
                record["ratio"] = record["median_ms"] / alone
                print(json.dumps(record), flush=True)
                records.append(record)
        held_launch.HELD_GROUP_SPIN_LIMIT = 1 << 20
    return records


if __name__ == "__main__":
    out = sys.argv[1]
    held_counts = [int(h) for h in sys.argv[2:]] or [8, 66]
    records = run(held_counts)
    with open(out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "triton": triton.__version__, "records": records}, f, indent=1)  # fmt: skip
