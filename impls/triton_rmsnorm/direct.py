"""Cached direct launch: once a kernel is compiled for a specialization, call its launcher.

Triton's `kernel[grid](...)` spends most of its host time before the launch: the argument
binder specializes every argument, a cache key is built and looked up, launch metadata is made.
On the H200's host that path took 38.8 µs per call, and calling the compiled kernel's launcher
directly 12.2 µs (`results/nvidia-h200/probes/`). At shapes whose kernels take a few
microseconds, that host time is the whole host-inclusive time.

So the first launch of each specialization goes through Triton (which compiles and launches, and
returns the compiled kernel); later launches with the same specialization call the compiled
kernel's launcher. The key holds everything Triton specializes a kernel on, mirroring its
binder (triton 3.6 and 3.9): per tensor, its dtype and whether its address is 16-byte aligned;
per int, its width (i32 / i64 / u64), whether it is 1 and whether it divides by 16 (both only
when the parameter is specialized; alignment and divisibility only when it is specialized on
alignment); floats by type only; every constexpr by value; num_warps and
num_stages; the device. A key that missed a specialization would run a wrong binary silently,
so with RMSNORM_TRITON_CHECK_DIRECT=1 every cached launch first asks Triton which compiled
kernel it would run and raises if it is not the cached one (the GPU tests run that way).

Launches keep Triton's own path when Triton launch hooks are installed (profilers such as
proton read them) and under the interpreter (there is no compiled kernel).
"""

from __future__ import annotations

import os

import torch
from triton import knobs
from triton.runtime.driver import driver

#: (kernel, device, constexprs and options, argument specialization) -> CompiledKernel. The
#: compiled kernel is kept alive here (it unloads its module when collected).
_COMPILED: dict[tuple, object] = {}

#: Per kernel, per parameter: (is a constexpr, specialized, specialized on alignment).
_PARAM_RULES: dict[int, tuple[tuple[bool, bool, bool], ...]] = {}

_I32 = (-(2**31), 2**31)
_I64 = (-(2**63), 2**63)


def check_enabled() -> bool:
    """RMSNORM_TRITON_CHECK_DIRECT=1: verify every cached launch against Triton's own choice."""
    return os.environ.get("RMSNORM_TRITON_CHECK_DIRECT", "0") == "1"


def _int_width(value: int) -> str:
    if _I32[0] <= value < _I32[1]:
        return "i32"
    return "i64" if _I64[0] <= value < _I64[1] else "u64"


def _arg_key(value, constexpr: bool, specialize: bool, align: bool):
    """What Triton's binder specializes one argument on (see the module docstring)."""
    if constexpr:
        return value
    if isinstance(value, torch.Tensor):
        return (value.dtype, specialize and align and value.data_ptr() & 15 == 0)
    kind = type(value)
    if kind is int:
        if not specialize:
            return _int_width(value)
        if value == 1:
            return 1  # Triton makes an int argument equal to 1 a constant
        return (_int_width(value), align and value & 15 == 0)
    if kind is float or kind is bool or value is None:
        return kind
    raise TypeError(f"direct launch: unsupported argument type {kind.__name__}")


def _rules(kernel) -> tuple[tuple[bool, bool, bool], ...]:
    rules = _PARAM_RULES.get(id(kernel))
    if rules is None:
        rules = tuple(
            (
                p.is_constexpr,
                not p.do_not_specialize,
                not getattr(p, "do_not_specialize_on_alignment", False),
            )
            for p in kernel.params
        )
        _PARAM_RULES[id(kernel)] = rules
    return rules


def _hooks_installed() -> bool:
    """A launch hook is set: a non-empty HookChain (triton 3.6 and 3.9 keep an empty chain in
    each slot) or any other callable (older versions keep None when there is none)."""
    runtime = knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def launch(kernel, grid, args: tuple, meta: dict) -> None:
    """kernel[grid](*args, **meta), through the cached compiled kernel when there is one.

    kernel: a @triton.jit function; args: its leading parameters, positionally; meta: every
    later parameter by name (defaults are not filled in), plus num_warps and num_stages;
    grid: a tuple, or a function of meta (as Triton's). Launches on the current CUDA device.
    """
    if _hooks_installed():
        kernel[grid](*args, **meta)
        return
    rules = _rules(kernel)
    device_index = driver.active.get_current_device()
    key = (
        id(kernel),
        device_index,
        *meta.items(),
        *(_arg_key(a, *rule) for a, rule in zip(args, rules, strict=False)),
    )
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **meta)
        if compiled is not None:
            _COMPILED[key] = compiled
        return
    if check_enabled():
        expected = kernel.warmup(*args, grid=grid, **meta)
        if expected is not compiled:
            raise RuntimeError(
                f"direct launch of {kernel.fn.__name__}: the cached compiled kernel is not the one "
                "Triton chose for these arguments (the specialization key misses something)"
            )
    size = grid(meta) if callable(grid) else grid
    stream = driver.active.get_current_stream(device_index)
    later = [meta[name] for name in kernel.arg_names[len(args) :]]
    compiled.run(
        size[0],
        size[1] if len(size) > 1 else 1,
        size[2] if len(size) > 2 else 1,
        stream,
        compiled.function,
        compiled.packed_metadata,
        None,  # launch metadata: only read by launch hooks, which are not installed
        None,
        None,
        *args,
        *later,
    )
