"""One kernel's launch with its configuration chosen: the tuner's (inside a runtime tuning), the
dispatch table's or the heuristic (configs.py); the fixed-configuration launch; and the record of
the configurations launched (take_launch_configs)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton

from . import common, direct, dispatch, kernels, tuning
from .common import _INTERPRETING
from .configs import (
    KERNELS,
    TRITON_DEFAULT_STAGES,
    _candidates,
    _heuristic_config,
    _kernel_grid_and_meta,
    _table_config,
)
from .replays import _note_launch


def _tuned_config(kernel_name: str, grid, args: tuple, constexprs: dict) -> dict:
    """The candidate configuration with the least device time on these arguments
    (tuning.py: CUDA-graph replays over rotating copies, as the harness times backends)."""
    kernel = getattr(kernels, kernel_name)
    # each candidate with its launch grid and keywords, made once for compiling and timing
    launches = [
        (config, *_kernel_grid_and_meta(kernel_name, grid, {**constexprs, **config}))
        for config in _candidates(kernel_name, args, constexprs)
    ]
    _compile_in_parallel(kernel, args, [(launch_grid, meta) for _, launch_grid, meta in launches])

    def run(launch: tuple, launch_args: tuple) -> None:
        _config, launch_grid, meta = launch
        kernel[launch_grid](*launch_args, **meta)

    return tuning.fastest(launches, run, args)[0]


#: Threads compiling a tuning's candidates at once (at most one per CPU core).
COMPILE_THREADS = 16


def _compile_in_parallel(kernel, args: tuple, launches: list[tuple]) -> None:
    """Compile the kernel for every (grid, launch keywords) in launches before any is timed, on
    a thread pool (Triton's AsyncCompileMode; its compiler releases the GIL, so candidates
    compile in parallel: docs/design.md, Dispatch). A tuning of a
    shape class compiles up to ~100 candidates, one after another without this. A candidate
    that fails to compile is left to the timing loop, which compiles it again and skips it
    (tuning.UNRUNNABLE)."""
    threads = min(len(launches), _usable_cpus(), COMPILE_THREADS)
    if threads < 2:
        return
    with ThreadPoolExecutor(threads) as pool:
        compile_mode = triton.AsyncCompileMode(pool, ignore_errors=True)
        try:
            compile_mode.__enter__()
        except RuntimeError:  # the caller has one open (one per context): compile one by one
            return
        try:
            for launch_grid, meta in launches:
                kernel.warmup(*args, grid=launch_grid, **meta)
        finally:
            compile_mode.__exit__(None, None, None)  # waits for every compile


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def autotuning() -> bool:
    """Whether this call tunes its kernels and measures its paths: only inside a runtime tuning
    (dispatch.py: the offline tuner, dispatch.tuning(), RMSNORM_TRITON_TUNE=1), on a GPU. A
    default call takes its configurations from the dispatch table or the heuristic."""
    return dispatch.measuring() and not _INTERPRETING


#: (kernel, dtypes, launch switches, N, M's bit length, device) -> the tuner's choice as launch
#: keywords: each key is tuned once per process (tuning.py).
_TUNED: dict[tuple, dict] = {}
dispatch.ON_TUNING_START.append(_TUNED.clear)
#: Launch switches that change a kernel's binary but not which configuration suits it: left out
#: of the tuning key, so contiguous, strided and two-level rows of one shape share one tuning
#: (each layout still compiles its own binary at its first launch), as they share a dispatch
#: table entry.
_LAYOUT_SWITCHES = frozenset({"ROWS_CONTIGUOUS", "HEADS", "STRIDE_X_OUTER"})


def _launch(kernel_name: str, grid, *args, dtypes: tuple, adjust=None, **kwargs) -> dict:
    """The dispatch table's configuration (or the heuristic's) on a GPU, tuned inside a runtime
    tuning (autotuning()); one fixed configuration under the interpreter, which cannot time.

    grid: a tuple, or a function of the launch meta-parameters (BLOCK_M is chosen by the tuner).
    dtypes: the dtypes of the kernel's tensors that vary (with N and kwargs, the tuning key).
    adjust: None, or a function of the table's (or the heuristic's) configuration giving the one
    to launch at this call (configs.one_row_tiles); a tuning launches what it times.
    Triton launches on the current CUDA device: the caller makes it x's device (_on_device).
    After the first launch of a specialization, launches go straight to the compiled kernel
    (direct.py). Returns the configuration launched (the tuner's choice, or the fixed one).
    """
    kernel = getattr(kernels, kernel_name)
    if common.interpreting():
        config = {**_heuristic_config(kernel_name, kwargs["BLOCK_N"]), "num_warps": 4}
        if "PROGRAMS_PER_SM" in config:
            config["PROGRAMS_PER_SM"] = 1  # fewer programs than rows: the row loop is exercised
        _LAUNCHED[kernel_name] = config
        _harvest(kernel_name, config)
        grid, meta = _kernel_grid_and_meta(kernel_name, grid, {**kwargs, **config})
        kernel[grid](*args, **meta)
        _note_launch(kernel, grid, args, meta, config)
        return config
    if autotuning():
        key = (
            kernel_name,
            dtypes,
            *(value for name, value in kwargs.items() if name not in _LAYOUT_SWITCHES),
            *(args[i] for i in _KEY_POSITIONS[kernel_name]),
            args[0].get_device(),  # GPUs of different models tune apart
        )
        config = _TUNED.get(key)
        if config is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"rmsnorm: {kernel_name} has no tuned launch configuration for N="
                    f"{kwargs['BLOCK_N']} (padded) and these dtypes yet, and configurations "
                    "cannot be timed (nor compiled and loaded) inside a CUDA-graph capture; "
                    "call rmsnorm once with the same shapes and dtypes before capturing"
                )
            config = _TUNED[key] = _tuned_config(kernel_name, grid, args, kwargs)
    else:
        config = _table_config(kernel_name) or _heuristic_config(kernel_name, kwargs["BLOCK_N"])
        if adjust is not None:
            config = adjust(config)
    _LAUNCHED[kernel_name] = config
    _harvest(kernel_name, config)
    grid, meta = _kernel_grid_and_meta(kernel_name, grid, {**kwargs, **config})
    direct.launch(kernel, grid, args, meta, args[0].get_device())
    _note_launch(kernel, grid, args, meta, config)
    return config


def _harvest(kernel_name: str, config: dict) -> None:
    """While a tuning harvests its choice (dispatch.tune_call), note the kernel's configuration."""
    launched = getattr(dispatch._ACTIVE, "launched", None)
    if launched is not None:
        launched[kernel_name] = dict(config)


#: kernel name -> the configuration of its latest launch (see take_launch_configs).
_LAUNCHED: dict[str, dict] = {}
#: Functions returning the configurations of launches made outside Python's launchers since
#: they were last asked (kernel name -> config): the C++ host path's (host_path.py).
LAUNCHED_ELSEWHERE: list = []


def take_launch_configs() -> dict[str, dict]:
    """The tuned kernels launched since the last call, each with its latest configuration
    (BLOCK_M or PROGRAMS_PER_SM, num_warps, num_stages), then forgets them. For the harness's
    records: which configuration a timing ran."""
    taken = {kernel: dict(config) for kernel, config in _LAUNCHED.items()}
    _LAUNCHED.clear()
    for source in LAUNCHED_ELSEWHERE:
        taken.update(source())
    return taken


def _launch_fixed(kernel, grid, *args, num_warps: int, **constexprs) -> None:
    """A kernel with one fixed configuration (not tuned)."""
    if common.interpreting():
        meta = {**constexprs, "num_warps": num_warps}
        kernel[grid](*args, **meta)
    else:
        meta = {**constexprs, "num_warps": num_warps, "num_stages": TRITON_DEFAULT_STAGES}
        direct.launch(kernel, grid, args, meta, args[0].get_device())
    _note_launch(kernel, grid, args, meta)


#: Where the tuning key's runtime values (N, ROWS_BUCKET) sit among each kernel's arguments.
_KEY_POSITIONS = {
    name: tuple(
        getattr(kernels, name).arg_names.index(k)
        for k in ("N", "ROWS_BUCKET")
        if k in getattr(kernels, name).arg_names
    )
    for name in KERNELS
}
