"""The C++ host path: calls that Python's replays would repeat, served from C++ (where built).

Why: a replayed call still pays a Python autograd.Function, Triton's launcher and Python-level
allocations, more host time than torch's own op; the same launches from C++ cost less than it
(docs/design.md, Host path, has the numbers).

What it serves: rmsnorm(x, w, eps, offset=...) without a residual or out_dtype, on a CUDA x
whose rows are 2-D with a unit last stride or contiguous, once Python's path has recorded that
call's replay (replays.py), which registers its launches here: the compiled kernels' handles,
grids, options and parameter templates (launch_template). The backward is a C++ autograd node;
a backward it has no entry for (a new dy layout, create_graph=True) calls Python's
(function._host_backward), which records and registers it in turn. Anything else, or a call whose
key has no entry, returns None from the C++ forward and takes Python's path, unchanged; so do
calls under torch.compile, jit tracing, forward-mode AD, functorch transforms, a dispatch
override or a Triton launch hook, and tensor subclasses (function._host_may_serve). The entries
are forgotten with the replays (when the dispatch tables change, and when the path is turned
on). Two things Python's replays do that these launches do not: RMSNORM_TRITON_CHECK_DIRECT's
check of each launch against Triton's own choice (the C++ key holds the replay key's fields),
and launch.take_launch_configs reports, for calls served here, the configurations their entries'
recording calls launched (the latest forward and backward entry served since the last take).

Built once per torch version and source (the build takes ~40 s: a C++ compiler, torch's
headers and the CUDA headers Triton bundles; nvcc is not needed):
    python -m impls.triton_rmsnorm.build_host
The build goes to $RMSNORM_TRITON_HOST_DIR or ~/.cache/rmsnorm-triton/host/. Where it is built
for this torch, source and a Triton in TRITON_VERSIONS, importing the package turns the path on
(it checks files only: no CUDA call at import); nothing is built at a call. RMSNORM_TRITON_HOST,
read at import, overrides that: "python" keeps the path off, "cpp" asks for it and warns once
where it cannot be on. Launch parameters are packed as Triton's launcher packs them, which this
module knows for TRITON_VERSIONS only; with another Triton the path stays off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import os
import sys
import warnings
from pathlib import Path

import torch
import triton

from . import common, kernel_launch, kernels, replays
from .backward_launch import _single_tile_backward_args, _two_role_backward_args
from .forward_launch import _single_tile_forward_args

ENV = "RMSNORM_TRITON_HOST"
SOURCE = Path(__file__).with_name("host_node.cpp")
#: Triton versions whose launcher's parameter packing launch_template follows: every
#: non-constexpr parameter in signature order, then two null scratch pointers (global and
#: profile scratch).
TRITON_VERSIONS = ("3.6",)
SCRATCH_POINTERS = 2

#: The loaded C++ module when the path is on, else None (function.rmsnorm reads it every call).
MODULE = None
#: Python's backward for a backward the module has no entry for (a new dy layout,
#: create_graph=True): function._host_backward, set by function.py.
BACKWARD = None
_REGISTER_WARNED = False
#: The loaded module, set aside or not (its latest entries served are reported to
#: take_launch_configs either way).
_LOADED = None
#: An entry's tag -> the configurations its recording call launched (take_launch_configs).
_CONFIGS: dict[int, dict] = {}
_TAGS = itertools.count()
#: How many set_aside blocks are open (MODULE stays None until the last one closes).
_ASIDE = 0


class Unsupported(Exception):
    """A recorded replay the C++ path does not describe (it stays on Python's replays)."""


# ---- build and load ---------------------------------------------------------------------------


def module_name() -> str:
    """The extension's name: one per source, torch version and Python (its ABI)."""
    tag = f"{SOURCE.read_bytes().hex()}-{torch.__version__}-{sys.implementation.cache_tag}"
    return "rmsnorm_host_" + hashlib.sha256(tag.encode()).hexdigest()[:12]


def build_directory() -> Path:
    root = os.environ.get("RMSNORM_TRITON_HOST_DIR") or "~/.cache/rmsnorm-triton/host"
    return Path(root).expanduser() / module_name()


def built_path() -> Path:
    return build_directory() / f"{module_name()}.so"


def triton_cuda_headers() -> Path:
    """The CUDA headers Triton bundles (cuda.h: the driver's types; the driver itself is opened
    at run time)."""
    return Path(triton.__file__).parent / "backends" / "nvidia" / "include"


def build(verbose: bool = False) -> Path:
    """Compile the C++ module (host_node.cpp) into build_directory(); returns the built file."""
    from torch.utils.cpp_extension import load

    headers = triton_cuda_headers()
    if not (headers / "cuda.h").exists():
        raise RuntimeError(f"rmsnorm host path: Triton's CUDA headers are missing ({headers})")
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    load(name=module_name(), sources=[str(SOURCE)], extra_include_paths=[str(headers)],
         extra_cflags=["-O2"], build_directory=str(directory), with_cuda=False,
         verbose=verbose)  # fmt: skip
    return built_path()


def load_built():
    """The built C++ module, imported from its file (milliseconds; no build), or None."""
    path = built_path()
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(module_name(), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unavailable_reason(check_device: bool = True) -> str | None:
    """Why the path cannot be turned on here, or None (check_device=False: files and versions
    only, no CUDA call)."""
    if common.interpreting():
        return "TRITON_INTERPRET=1: the kernels run through Triton's interpreter"
    if check_device and not torch.cuda.is_available():
        return "no CUDA device"
    version = ".".join(triton.__version__.split(".")[:2])
    if version not in TRITON_VERSIONS:
        return (f"Triton {triton.__version__}: its launcher's parameter packing is known for "
                f"{', '.join(TRITON_VERSIONS)} only")  # fmt: skip
    try:
        built = built_path().exists()
    except (OSError, RuntimeError) as error:  # no home directory, an unreadable build folder
        return f"its build folder cannot be read ({error})"
    if not built:
        return "not built for this torch and source: run python -m impls.triton_rmsnorm.build_host"
    return None


def turn_on(quiet: bool = False, check_device: bool = True) -> bool:
    """Load the built module and serve calls with it; False (and a warning, unless quiet) where
    it cannot."""
    global MODULE
    if BACKWARD is None:
        raise RuntimeError("host_path.turn_on: import impls.triton_rmsnorm first (function.py "
                           "gives the path its Python backward)")  # fmt: skip
    reason = unavailable_reason(check_device)
    if reason is None:
        try:
            module = load_built()
        except (ImportError, OSError) as error:
            reason = f"the built module does not load: {error}"
    if reason is not None:
        if not quiet:
            warnings.warn(f"{ENV}=cpp: the C++ host path is off ({reason})", stacklevel=2)
        return False
    global _LOADED
    module.set_backward_fallback(BACKWARD)
    _LOADED = module
    MODULE = module if _ASIDE == 0 else None
    replays.forget()  # recorded before: recorded again, and registered, at their next call
    return True


def current() -> str:
    """'cpp' where the C++ host path serves calls in this process, else 'python'."""
    return "python" if MODULE is None else "cpp"


@contextlib.contextmanager
def set_aside():
    """Inside the block Python's path serves every call (the C++ module kept, but not asked);
    what Python records there is still registered, and served after the block. Blocks nest; a
    turn_on or turn_off inside one holds after it. (A backward of a graph built before the
    block is still the C++ node's.)"""
    global MODULE, _ASIDE
    _ASIDE += 1
    MODULE = None
    try:
        yield
    finally:
        _ASIDE -= 1
        if _ASIDE == 0:
            MODULE = _LOADED


def turn_off() -> None:
    global MODULE, _LOADED
    if _LOADED is not None:
        _LOADED.clear()
    MODULE = _LOADED = None
    _CONFIGS.clear()


# ---- what a call registers --------------------------------------------------------------------


class _Tensor:
    """A tensor's place in a launch's parameters: its slot among the call's tensors (forward:
    x 0, w 1, y 2, rstd 3; backward: dy 0, x 1, w 2, rstd 3, dx 4, partials 5, dw 6), with the
    shape and strides the argument builders read."""

    def __init__(self, slot: int, shape: tuple = (), strides: tuple = ()):
        self.slot, self.shape, self._strides = slot, shape, strides

    def stride(self, dim: int) -> int:
        return self._strides[dim]


class _CallValue:
    """A scalar that changes between calls of one key: 'e' (eps) or 'o' (offset)."""

    def __init__(self, kind: str):
        self.kind = kind


EPS, OFFSET = _CallValue("e"), _CallValue("o")


def _fp32_bits(value: float) -> int:
    return torch.tensor([float(value)], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF


def parameter_template(signature: list[str], args: tuple) -> tuple[str, list[int], list[int]]:
    """(kinds, slots, values) of a kernel's parameters for these arguments, in the order Triton's
    launcher passes them (the non-constexpr entries of the compiled signature). args: the
    launch's arguments then its trailing ones, _Tensor and _CallValue where they change between
    calls."""
    if len(args) != len(signature):
        raise Unsupported(f"{len(args)} arguments for a signature of {len(signature)}")
    kinds, slots, values = [], [], []
    for arg, ty in zip(args, signature, strict=True):
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            if not isinstance(arg, _Tensor):
                raise Unsupported(f"a pointer parameter ({ty}) without a tensor slot: {arg!r}")
            kinds.append("p"), slots.append(arg.slot), values.append(0)
        elif isinstance(arg, _CallValue):
            if ty not in ("fp32", "f32"):
                raise Unsupported(f"eps or offset passed as {ty}, not fp32")
            kinds.append(arg.kind), slots.append(0), values.append(0)
        elif isinstance(arg, _Tensor):
            raise Unsupported(f"a tensor where the signature has {ty}")
        elif ty in ("fp32", "f32"):
            kinds.append("f"), slots.append(0), values.append(_fp32_bits(arg))
        elif ty == "i32":
            kinds.append("i"), slots.append(0), values.append(int(arg))
        elif ty in ("i64", "u64"):  # a u64 of 2**63 or more passes as its signed bits
            value = int(arg) & 0xFFFFFFFFFFFFFFFF
            kinds.append("l"), slots.append(0), values.append(value - (value >> 63 << 64))
        elif ty in ("i1", "i8"):
            kinds.append("b"), slots.append(0), values.append(int(arg))
        elif ty in ("u1", "u8"):
            kinds.append("u"), slots.append(0), values.append(int(arg))
        else:
            raise Unsupported(f"parameter type {ty}")
    return "".join(kinds), slots, values


def launch_template(replay, args: tuple) -> tuple:
    """The C++ module's description of one recorded launch (direct.Replay): (function, grid,
    threads, shared memory, PDL, scratch pointers, kinds, slots, values)."""
    compiled = replay.compiled
    if compiled is None:
        raise Unsupported("no compiled kernel (the interpreter)")
    meta = compiled.metadata
    needs = {
        "global scratch": getattr(meta, "global_scratch_size", 0) or 0,
        "profile scratch": getattr(meta, "profile_scratch_size", 0) or 0,
        "a cooperative launch": bool(getattr(meta, "launch_cooperative_grid", False)),
        "a cluster": getattr(meta, "num_ctas", 1) != 1,
        "a 2-D or 3-D grid": tuple(replay.grid[1:]) != (1, 1),
    }
    lacking = [what for what, needed in needs.items() if needed]
    if lacking:
        raise Unsupported(f"{replay.kernel.fn.__name__} needs {', '.join(lacking)}")
    signature = list(compiled.src.signature.values())
    kinds, slots, values = parameter_template(signature, (*args, *replay.tail))
    return (int(compiled.function), int(replay.grid[0]), 32 * int(meta.num_warps),
            int(meta.shared), bool(getattr(meta, "launch_pdl", False)), SCRATCH_POINTERS,
            kinds, slots, values)  # fmt: skip


def _code(module, dtype: torch.dtype) -> int:
    return module.dtype_code(torch.empty(0, dtype=dtype))


def forward_entry(module, key: tuple, launches: list, extra) -> tuple:
    """(key fields, launches, partial rows) for a recorded forward (replays._forward_replay_key)."""
    (_, shape, strides, x_dtype, w_dtype, out_dtype, keep_rstd, x_align, w_align, is_cuda,
     device) = key  # fmt: skip
    if len(shape) != 2 or strides[1] != 1 or extra is not None or not is_cuda:
        raise Unsupported("not a 2-D CUDA x of unit-stride rows")
    if out_dtype != x_dtype:
        raise Unsupported("y in another dtype than x's")
    (m, n), stride = shape, strides[0]
    y = _Tensor(2, (m, n), (n, 1))
    rstd = _Tensor(3) if keep_rstd else y  # the kernel's RSTD is y where it writes none
    x = _Tensor(0, (m, n), (stride, 1))
    args = _single_tile_forward_args(x, _Tensor(1), y, rstd, x, x, (stride, n, stride, stride),
                                     EPS, OFFSET)  # fmt: skip
    (replay,) = launches
    fields = [1, m, n, stride, _code(module, x_dtype), _code(module, w_dtype),
              _code(module, out_dtype), int(keep_rstd),
              x_align, w_align, device]  # fmt: skip
    return fields, [launch_template(replay, args)], 0


def backward_entry(module, key: tuple, launches: list, extra) -> tuple:
    """(key fields, launches, partial rows) for a recorded backward (replays._backward_replay_key)."""
    (_, shape, strides, dy_stride, x_dtype, w_dtype, dy_dtype, rstd_dtype, dh, x_align, w_align,
     dy_align, rstd_align, is_cuda, device) = key  # fmt: skip
    programs, rows_per_program, two_level = extra
    if len(shape) != 2 or strides[1] != 1 or two_level or dh is not None or not is_cuda:
        raise Unsupported("not a 2-D CUDA x of unit-stride rows without a residual's gradient")
    if rstd_dtype != torch.float32:
        raise Unsupported(f"rstd in {rstd_dtype}")
    m, n = shape
    dy, x = _Tensor(0, (m, n), (dy_stride, 1)), _Tensor(1, (m, n), (strides[0], 1))
    w, rstd, dx = _Tensor(2), _Tensor(3), _Tensor(4, (m, n), (n, 1))
    partials, dw = _Tensor(5, (programs, n), (n, 1)), _Tensor(6)
    fields = [2, m, n, strides[0], dy_stride, _code(module, x_dtype), _code(module, w_dtype),
              _code(module, dy_dtype),
              x_align, w_align, dy_align, rstd_align, device]  # fmt: skip
    if launches[0].kernel is kernels.rmsnorm_bwd_two_role_kernel:
        (two_role,) = launches
        args = _two_role_backward_args(dy, x, w, rstd, OFFSET, dx, dy, dw, programs,
                                       rows_per_program)  # fmt: skip
        return fields, [launch_template(two_role, args)], 0
    main, reduce = launches
    args = _single_tile_backward_args(dy, x, w, rstd, OFFSET, dx, dy, partials, rows_per_program)
    return fields, [launch_template(main, args),
                    launch_template(reduce, (partials, dw, programs, n))], programs  # fmt: skip


def register(key: tuple, launches: list, configs: dict, extra) -> None:
    """Hand a replay just recorded (replays._record) to the C++ module, where it describes one;
    configs: the configurations its recording call launched (kernel name -> config)."""
    module = _LOADED  # set aside too: a call recorded there is served once the block ends
    if module is None or not key or key[0] not in ("fwd", "bwd"):
        return  # off, or a kernel test's tagged replay
    entry_of = forward_entry if key[0] == "fwd" else backward_entry
    try:
        fields, templates, partial_rows = entry_of(module, key, launches, extra)
        tag = next(_TAGS)
        module.add(fields, templates, partial_rows, tag)
        _CONFIGS[tag] = configs
    except Unsupported:
        return
    except Exception as error:  # never the call's failure: its kernels ran; Python replays it
        global _REGISTER_WARNED
        if not _REGISTER_WARNED:
            _REGISTER_WARNED = True
            warnings.warn(f"rmsnorm host path: a recorded call was not registered ({error!r}); "
                          "such calls stay on Python's path", stacklevel=2)  # fmt: skip


def forget() -> None:
    """Forget every entry (the replays were forgotten: the tables changed)."""
    if _LOADED is not None:
        _LOADED.clear()
    _CONFIGS.clear()


def launched_configs() -> dict:
    """The configurations of the latest forward and backward entries served since the last
    take (kernel name -> config; take_launch_configs adds them to Python's launches)."""
    if _LOADED is None:
        return {}
    taken = {}
    for tag in _LOADED.take_latest():
        for kernel, config in _CONFIGS.get(tag, {}).items():
            taken[kernel] = dict(config)
    return taken


replays.ON_RECORD.append(register)
replays.ON_FORGET.append(forget)
kernel_launch.LAUNCHED_ELSEWHERE.append(launched_configs)


def setting() -> str:
    """RMSNORM_TRITON_HOST: "cpp", "python", or "" (unset: on where built)."""
    value = os.environ.get(ENV, "")
    if value not in ("", "python", "cpp"):
        raise ValueError(f"{ENV}: expected 'cpp', 'python' or unset, got {value!r}")
    return value


def turn_on_as_set() -> bool:
    """At import (function.py): on where built unless RMSNORM_TRITON_HOST=python; with
    RMSNORM_TRITON_HOST=cpp a warning says why where it cannot be. Unset, only files and
    versions are checked (no CUDA call: a process that never touches CUDA stays so)."""
    value = setting()
    if value == "python":
        return False
    if value == "cpp":
        return turn_on()
    return turn_on(quiet=True, check_device=False)
