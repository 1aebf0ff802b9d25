"""Cached direct launch: once a kernel is compiled for a specialization, call its launcher.

Triton's `kernel[grid](...)` spends most of its host time before the launch: the argument
binder specializes every argument, a cache key is built and looked up, launch metadata is made:
several times the compiled launcher's own host time (docs/design.md, Host path). At shapes
whose kernels take a few microseconds, that host time is the whole host-inclusive time.

So the first launch of each specialization goes through Triton (which compiles and launches, and
returns the compiled kernel); later launches with the same specialization call the compiled
kernel's launcher. The key holds everything Triton specializes a kernel on, mirroring its
binder (triton 3.6 and 3.9): per tensor, its dtype and whether its address is 16-byte aligned;
per int, its width (i32 / i64 / u64), whether it is 1 and whether it divides by 16 (both only
when the parameter is specialized; alignment and divisibility only when it is specialized on
alignment); floats by type only; every constexpr by value; num_warps and
num_stages; the device. A key that missed a specialization would run a wrong binary silently,
so with RMSNORM_TRITON_CHECK_DIRECT=1 (read at import) every cached launch first asks Triton
which compiled kernel it would run and raises if it is not the cached one (the GPU tests run
that way).

The key itself must be cheap: on the H200's host each Python call costs about a microsecond, so
the key of a kernel's arguments is one generated function of inline expressions (as Triton's own
binder is), made at the kernel's first launch for the Python types of its arguments; arguments
of other types go through Triton's path.

Launches keep Triton's own path when Triton launch hooks are installed (profilers such as
proton read them) and under the interpreter (there is no compiled kernel).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch
from triton import knobs
from triton.runtime.driver import driver

#: (kernel, device, constexprs and options, argument key) -> CompiledKernel. The compiled kernel
#: is kept alive here (it unloads its module when collected).
_COMPILED: dict[tuple, object] = {}

#: Per kernel and argument count: the generated key function (_make_keyer). Keys hold the
#: kernel object itself (not its id, which a collected kernel could hand to a new one).
_KEYERS: dict[tuple, object] = {}

#: Launches that went through a cached compiled kernel (tests check the cache is used).
cached_launches = 0
#: Launches made by a Replay (tests check that replays happen).
replayed_launches = 0

_CHECK = os.environ.get("RMSNORM_TRITON_CHECK_DIRECT", "0") == "1"


def check_enabled() -> bool:
    """RMSNORM_TRITON_CHECK_DIRECT=1: verify every cached launch against Triton's own choice."""
    return _CHECK


def _arg_terms(name: str, value, constexpr: bool, specialize: bool, align: bool):
    """(guard, key terms) for one argument, as Python source: what Triton's binder specializes
    it on (see the module docstring), for arguments of value's type."""
    if constexpr:
        return None, [name]
    if isinstance(value, torch.Tensor):
        terms = [f"{name}.dtype"]
        if specialize and align:
            terms.append(f"{name}.data_ptr() & 15 == 0")
        return None, terms  # a non-tensor fails on .dtype: Triton's path
    kind = type(value)
    if kind is int:
        width = [f"-2147483648 <= {name} < 2147483648", f"{name} < 9223372036854775808"]
        if not specialize:
            return f"type({name}) is int", width
        divisible = [f"{name} & 15 == 0"] if align else []
        return f"type({name}) is int", [f"{name} == 1", *divisible, *width]
    if kind is float or kind is bool:
        return f"type({name}) is {kind.__name__}", []
    if value is None:
        return f"{name} is None", []
    raise TypeError(f"direct launch: unsupported argument type {kind.__name__}")


def _make_keyer(rules, sample_args: tuple):
    """A function of the arguments returning their key, or None when an argument's type differs
    from sample_args' (those launches take Triton's path). rules: per parameter (is a
    constexpr, specialized, specialized on alignment)."""
    names = [f"a{i}" for i in range(len(sample_args))]
    guards, terms = [], []
    for name, value, rule in zip(names, sample_args, rules, strict=False):
        guard, arg_terms = _arg_terms(name, value, *rule)
        if guard:
            guards.append(guard)
        terms.extend(arg_terms)
    check = f"    if not ({' and '.join(guards)}):\n        return None\n" if guards else ""
    returned = "".join(f"{term}, " for term in terms)
    source = f"def keyer({', '.join(names)}):\n{check}    return ({returned})\n"
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102  (generated from parameter rules, no outside input)
    return namespace["keyer"]


def _rules(kernel) -> tuple[tuple[bool, bool, bool], ...]:
    return tuple(
        (
            p.is_constexpr,
            not p.do_not_specialize,
            not getattr(p, "do_not_specialize_on_alignment", False),
        )
        for p in kernel.params
    )


def _hooks_installed() -> bool:
    """A launch hook is set: a non-empty HookChain (triton 3.6 and 3.9 keep an empty chain in
    each slot) or any other callable (older versions keep None when there is none)."""
    runtime = knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def tritons_path_required() -> bool:
    """Settings Triton reads at each launch that a cached binary would ignore, for every kernel:
    launch hooks (profilers), debug mode, instrumentation, a stages-inspection hook."""
    runtime, compilation = knobs.runtime, knobs.compilation
    return (
        _hooks_installed()
        or bool(getattr(runtime, "debug", False))
        or getattr(runtime, "add_stages_inspection_hook", None) is not None
        or getattr(compilation, "instrumentation_mode", "") not in ("", None)
    )


def _tritons_path_required(kernel) -> bool:
    """tritons_path_required(), or the kernel has pre-run hooks."""
    return tritons_path_required() or bool(getattr(kernel, "pre_run_hooks", None))


def _always_tritons_path(*args):
    return None


@functools.cache
def _parameters(kernel) -> tuple[tuple[str, object], ...]:
    """(name, default) of each of the kernel's parameters (inspect.Parameter.empty: none), from
    its Python function (compiled and interpreted kernels alike)."""
    return tuple((p.name, p.default) for p in inspect.signature(kernel.fn).parameters.values())


def _trailing(kernel, num_args: int, meta: dict) -> list:
    """The kernel's parameters after its num_args leading ones: from meta, else their defaults,
    as Triton's binder fills them (a caller may leave out a defaulted constexpr)."""
    values = []
    for name, default in _parameters(kernel)[num_args:]:
        if name in meta:
            values.append(meta[name])
        elif default is not inspect.Parameter.empty:
            values.append(default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: no value for parameter {name}")
    return values


def launch(kernel, grid, args: tuple, meta: dict, device_index: int) -> None:
    """kernel[grid](*args, **meta), through the cached compiled kernel when there is one.

    kernel: a @triton.jit function; args: its leading parameters, positionally; meta: the
    later parameters by name (those left out take their defaults), plus num_warps and num_stages;
    grid: a tuple, or a function of meta (as Triton's); device_index: the current CUDA device,
    where x lives (the caller made it current).
    """
    keyer = _KEYERS.get((kernel, len(args)))
    if keyer is None:
        try:
            keyer = _make_keyer(_rules(kernel), args)
        except TypeError:  # an argument type the key does not model: Triton's path, always
            keyer = _always_tritons_path
        _KEYERS[(kernel, len(args))] = keyer
    try:
        arg_key = keyer(*args)
    except AttributeError:  # a non-tensor where the first launch had a tensor
        arg_key = None
    if arg_key is None or _tritons_path_required(kernel):
        kernel[grid](*args, **meta)
        return
    # meta values are keyed by value: callers pass each constexpr with one Python type
    key = (kernel, device_index, *meta.items(), arg_key)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **meta)
        if compiled is not None:
            _COMPILED[key] = compiled
        return
    global cached_launches
    cached_launches += 1
    if _CHECK:
        expected = kernel.warmup(*args, grid=grid, **meta)
        if expected is not compiled:
            raise RuntimeError(
                f"direct launch of {kernel.fn.__name__}: the cached compiled kernel is not the one "
                "Triton chose for these arguments (the specialization key misses something)"
            )
    size = grid(meta) if callable(grid) else grid
    compiled.run(
        size[0],
        size[1] if len(size) > 1 else 1,
        size[2] if len(size) > 2 else 1,
        driver.active.get_current_stream(device_index),
        compiled.function,
        compiled.packed_metadata,
        None,  # launch metadata: only read by launch hooks, which are not installed
        None,
        None,
        *args,
        *_trailing(kernel, len(args), meta),
    )


def compiled_for(kernel, args: tuple, meta: dict, device_index: int):
    """The compiled kernel that a direct launch of these arguments runs, or None (not compiled
    yet, or the launch takes Triton's path)."""
    keyer = _KEYERS.get((kernel, len(args)))
    if keyer is None or _tritons_path_required(kernel):
        return None
    try:
        arg_key = keyer(*args)
    except AttributeError:
        return None
    if arg_key is None:
        return None
    return _COMPILED.get((kernel, device_index, *meta.items(), arg_key))


class Replay:
    """One launch to repeat with new arguments of the same specialization: the compiled kernel
    (None: relaunch through Triton's path, as under the interpreter), its grid and its trailing
    parameters (constexprs and options), fixed at recording.

    The caller guarantees that the arguments specialize as the recorded ones did (it keys its
    replays on everything that decides that). With RMSNORM_TRITON_CHECK_DIRECT=1 every replay
    asks Triton which compiled kernel it would run and raises if it is not the recorded one."""

    __slots__ = ("kernel", "compiled", "grid", "meta", "tail")

    def __init__(self, kernel, compiled, grid: tuple, meta: dict, num_args: int):
        self.kernel, self.compiled, self.meta = kernel, compiled, meta
        self.grid = (*grid, 1, 1)[:3]
        self.tail = tuple(_trailing(kernel, num_args, meta))

    def __call__(self, device_index: int, *args) -> None:
        global replayed_launches
        replayed_launches += 1
        if self.compiled is None or _tritons_path_required(self.kernel):
            self.kernel[self.grid](*args, **self.meta)
            return
        compiled = self.compiled
        if _CHECK and self.kernel.warmup(*args, grid=self.grid, **self.meta) is not compiled:
            raise RuntimeError(
                f"replay of {self.kernel.fn.__name__}: these arguments specialize differently "
                "from the recorded launch (the replay key misses something)"
            )
        compiled.run(
            *self.grid,
            driver.active.get_current_stream(device_index),
            compiled.function,
            compiled.packed_metadata,
            None,  # launch metadata: only read by launch hooks, which are not installed
            None,
            None,
            *args,
            *self.tail,
        )


def replay_of(
    kernel, grid, args: tuple, meta: dict, device_index: int, through_triton: bool = False
) -> Replay | None:
    """A Replay of a launch (kernel, grid, args and meta as given to launch): of its cached
    compiled kernel, or None when there is none; through_triton (the interpreter, which has no
    compiled kernels): a Replay that relaunches through Triton's path."""
    compiled = None if through_triton else compiled_for(kernel, args, meta, device_index)
    if compiled is None and not through_triton:
        return None
    size = grid(meta) if callable(grid) else grid
    return Replay(kernel, compiled, tuple(size), meta, len(args))
