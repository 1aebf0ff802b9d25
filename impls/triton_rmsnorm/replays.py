"""Replays: later calls of a signature skip the Python launch path. The record of a call's
launches, the replay keys and the table of replays (launch.py replays them)."""

from __future__ import annotations

import os
import threading

import torch

from . import common, direct, dispatch

# Where kernels take a few microseconds the host sets the pace, and on the H200's host most of a
# launcher call went to this module's path: checks, path choice, the tuning lookup, the direct
# launch's key (docs/design.md, Host path). So a single-tile call records its launches (its first
# call, after any tuning) and later calls with the same replay key repeat them with
# fresh outputs. The key holds everything that decides the launches and their specialization:
# shapes, row strides, dtypes, each input's 16-byte alignment, the device; outputs and scratch are
# new contiguous allocations, as at recording.


class _Recording(threading.local):
    """Per thread, while a call is recorded: each launch, as (kernel, grid, args, meta, device,
    tuned config or None); None otherwise (a class default: read at every launch, it raises
    nothing)."""

    launches = None


_RECORDING = _Recording()
#: replay key -> (the Replays, their configurations for take_launch_configs, extra values).
_REPLAYS: dict[tuple, tuple] = {}
#: At most this many signatures are recorded (M that changes every call would grow the table
#: without bound); later new signatures take the path above.
REPLAY_CAP = 4096
#: Called as listener(key, replays, configs, extra) when a replay is recorded (host_path.py registers it
#: with the C++ host path).
ON_RECORD: list = []
#: Called when the replays are forgotten (host_path.py forgets its entries with them).
ON_FORGET: list = []
#: RMSNORM_TRITON_REPLAY=0, set before import, turns replays off (every call then takes the
#: path above). Under the interpreter a replay relaunches through Triton's path (there is no
#: compiled kernel): the CPU tests cover replays' keys, arguments and allocations that way.
_REPLAYABLE = os.environ.get("RMSNORM_TRITON_REPLAY", "1") != "0"


def forget() -> None:
    """Forget every recorded replay (and, through ON_FORGET, the C++ host path's entries).
    Replays hold the tables' choices of their time: forgotten when the tables change; tests
    start with none."""
    with dispatch.STATE_LOCK:  # a store in progress ends first (_record)
        _REPLAYS.clear()
        for listener in ON_FORGET:
            listener()


def recorded() -> dict:
    """The recorded replays (a copy): replay key -> (the Replays, their configurations, extra)."""
    return dict(_REPLAYS)


dispatch.ON_CHANGE.append(forget)


def _note_launch(kernel, grid, args: tuple, meta: dict, config: dict | None = None) -> None:
    """While a call is recorded, note one of its launches."""
    recording = getattr(_RECORDING, "launches", None)
    if recording is not None:
        recording.append((kernel, grid, args, meta, args[0].get_device(), config))


def _is_current(device_index: int) -> bool:
    """x's device is the current CUDA device (always true for the interpreter's CPU tensors)."""
    return device_index < 0 or torch.cuda.current_device() == device_index


def _record(key: tuple, call, args: tuple, launches: tuple, extra=None) -> None:
    """call(*args), remembering its launches under key when it made one of the expected numbers
    of them and each can be replayed (went direct, or runs under the interpreter), and no tuning
    that should have measured the call was left undone (dispatch.left_untuned: a capture inside
    a tuning session takes the table or the heuristic unremembered). A key already
    known is not recorded again (x on another device than the current one runs here every
    call), nor is one past REPLAY_CAP."""
    if key in _REPLAYS or len(_REPLAYS) >= REPLAY_CAP:
        call(*args)
        return
    outer = getattr(_RECORDING, "launches", None)
    outer_untuned = dispatch.left_untuned()
    _RECORDING.launches = recorded = []
    dispatch._ACTIVE.left_untuned = False
    generation = dispatch.current_generation()  # never mid-change: before it, or after
    try:
        call(*args)
    finally:
        _RECORDING.launches = outer
        untuned = dispatch.left_untuned()
        dispatch._ACTIVE.left_untuned = outer_untuned or untuned
    if dispatch.GENERATION[0] != generation:
        return  # the call tuned (its launches were the tuning's), or the tables changed
    if untuned:
        return  # a tuning would have measured it but could not (a capture): not remembered
    through_triton = common.interpreting()
    replays = [direct.replay_of(*launch[:5], through_triton=through_triton) for launch in recorded]
    if len(replays) not in launches or None in replays:
        return
    configs = {launch[0].fn.__name__: launch[5] for launch in recorded if launch[5] is not None}
    with dispatch.STATE_LOCK:  # a change on another thread is wholly before or after this
        if dispatch.GENERATION[0] != generation:
            return  # the tables changed on another thread since the call
        _REPLAYS[key] = (replays, configs, extra)
        for listener in ON_RECORD:
            listener(key, replays, configs, extra)


def _forward_replay_key(x, weight, out_dtype, keep_rstd: bool = True) -> tuple:
    """x's every stride: a [outer, heads, N] x's head stride decides its launch too; keep_rstd
    (False: the launch writes no rstd, STORE_RSTD)."""
    return (
        "fwd", x.shape, x.stride(), x.dtype, weight.dtype, out_dtype, keep_rstd,
        x.data_ptr() & 15, weight.data_ptr() & 15, x.is_cuda, x.get_device(),
    )  # fmt: skip


def _backward_replay_key(dy, x, weight, rstd, dh_out) -> tuple:
    dh = None if dh_out is None else (dh_out.dtype, dh_out.stride(0), dh_out.data_ptr() & 15)
    return (
        "bwd", x.shape, x.stride(), dy.stride(0), x.dtype, weight.dtype, dy.dtype, rstd.dtype,
        dh, x.data_ptr() & 15, weight.data_ptr() & 15, dy.data_ptr() & 15, rstd.data_ptr() & 15,
        x.is_cuda, x.get_device(),
    )  # fmt: skip
