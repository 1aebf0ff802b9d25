"""What every launcher module shares: integer helpers, the interpreter switch, the device's
facts (SM count, shared memory, inline PTX, Hopper class, a saturating fp8 cast), rows' 16-byte
alignment, the chunk widths of the wide kernels and the hidden-size limit."""

from __future__ import annotations

import contextlib
import functools
import math
import os

import torch

#: Chunk width of the looped (wide-row) kernels.
WIDE_BLOCK_N = 4096
#: Chunk width of the split kernels (wide rows, fewer of them than SMs): one program per
#: (row, chunk).
SPLIT_BLOCK_N = 16384
#: Column indices are int32 inside the kernels, and the last chunk's indices (up to N - 1 plus
#: one chunk) must stay below 2**31.
MAX_N = 2**31 - SPLIT_BLOCK_N

#: Backward programs under the interpreter (no SM count there); > 1 so the partial-dw reduction
#: is exercised by CPU tests.
_INTERPRETER_PROGRAMS = 4


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints. Plain Python: triton.cdiv is a constexpr function object whose call
    costs several microseconds of host time per launch (triton 3.9)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1); plain Python, like cdiv."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _previous_power_of_2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


#: Read once, when triton is imported with this module, as Triton itself reads it.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return _INTERPRETING


# ---- the device's facts, and pretending others ----------------------------------------------

#: The facts a pretend_device block gives, process-wide (every device, every thread: autograd
#: runs a CUDA backward on a thread of its own); empty outside one.
_PRETENDED: dict = {}
#: Caches of answers computed from the facts (functools.cache functions, or any callable that
#: forgets): cleared when a pretend_device block opens and closes. Modules add theirs at import.
FACT_CACHES: list = []
#: The facts pretend_device takes, each read by one helper below.
FACTS = ("sm_count", "capability", "shared_bytes_per_block", "shared_bytes_per_sm", "l2_bytes",
         "inline_ptx", "name")  # fmt: skip


@contextlib.contextmanager
def pretend_device(**facts):
    """Inside the block every device has these facts, on every thread: sm_count (SMs: grids,
    the programs cap, the split and held rules; the interpreter's cap too), capability (the
    compute capability, a (major, minor) pair: the Hopper-class rules, PDL and the fp8 cast's
    saturation), shared_bytes_per_block and shared_bytes_per_sm (shared memory a program may
    ask for and an SM holds), l2_bytes (the L2 cache: the two-role backward's rule; 0 for no L2,
    as the interpreter's CPU), inline_ptx (whether the kernels' inline PTX runs), name (the
    GPU's name: the class whose committed launch tables serve it). A fact not given reads as
    the device's own. For tests and experiments of one GPU's choices on another machine (the
    interpreter included): the kernels still run on the device at hand, so a pretended fact that
    the device does not have makes its paths fail there. Blocks nest, the inner one winning per
    fact; cached answers (FACT_CACHES: offers, table lookups, replays, PDL switches) are
    forgotten on entering and leaving. Public as dispatch.pretend_device."""
    unknown = sorted(set(facts) - set(FACTS))
    if unknown:
        raise TypeError(f"pretend_device: unknown facts {unknown}; the facts: {', '.join(FACTS)}")
    for name, least in (("sm_count", 1), ("shared_bytes_per_block", 0),
                        ("shared_bytes_per_sm", 0), ("l2_bytes", 0)):  # fmt: skip
        value = facts.get(name)
        if value is not None and (type(value) is not int or value < least):
            raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    capability = facts.get("capability")
    if capability is not None and not (
        isinstance(capability, tuple) and len(capability) == 2
        and all(type(c) is int for c in capability)
    ):  # fmt: skip
        raise ValueError(f"capability: expected a (major, minor) pair of ints, got {capability!r}")
    if facts.get("inline_ptx") is not None and not isinstance(facts["inline_ptx"], bool):
        raise ValueError(f"inline_ptx: expected a bool, got {facts['inline_ptx']!r}")
    name = facts.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name: expected a GPU's name (a non-empty str), got {name!r}")
    saved = dict(_PRETENDED)
    _PRETENDED.update({k: v for k, v in facts.items() if v is not None})
    _forget_fact_caches()
    try:
        yield
    finally:
        _PRETENDED.clear()
        _PRETENDED.update(saved)
        _forget_fact_caches()


def _forget_fact_caches() -> None:
    for cache in FACT_CACHES:
        getattr(cache, "cache_clear", cache)()


def gpu_name(device_index: int) -> str:
    """The device's name (torch.cuda.get_device_name), or the one pretend_device gives: the
    GPU class whose committed tables (dispatch, fp8) serve its calls."""
    pretended = _PRETENDED.get("name")
    return pretended if pretended is not None else _device_gpu_name(device_index)


@functools.cache
def _device_gpu_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def _sm_count(device_index: int) -> int:
    pretended = _PRETENDED.get("sm_count")
    return pretended if pretended is not None else _device_sm_count(device_index)


@functools.cache
def _device_sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _programs_cap(device: torch.device) -> int:
    if "sm_count" in _PRETENDED:
        return _PRETENDED["sm_count"]
    return _INTERPRETER_PROGRAMS if device.type != "cuda" else _sm_count(device.index or 0)


def loads_w_early(programs: int, device: torch.device | None = None) -> bool:
    """Whether a one-program-a-tile forward loads w with x (W_EARLY in kernels.py and
    fp8_kernels.py): a grid of at most one program an SM of device (default: the current CUDA
    device, as launches run under _on_device; the interpreter's cap without one)."""
    if device is None:
        cuda = not interpreting() and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return programs <= _programs_cap(device)


def block_size(n: int) -> int:
    """The tile width of the single-tile kernels (the whole row, padded to a power of two)."""
    return next_power_of_2(n)


def rows_are_split(m: int, device: torch.device) -> bool:
    """Wide rows, fewer than programs_cap (the SM count) of them: one program per row would
    leave SMs idle, so each row is split across several programs."""
    return m < _programs_cap(device)


def rows_and_width(x: torch.Tensor) -> tuple[int, int]:
    """(M, N) of a launcher's x: [M, N], or [outer, heads, N], whose outer * heads rows are read
    in two levels (two_level_switches)."""
    if x.dim() == 2:
        return x.shape
    outer, heads, n = x.shape
    return outer * heads, n


def two_level_switches(x: torch.Tensor) -> dict:
    """The plain single-tile kernels' HEADS and STRIDE_X_OUTER (kernels.rmsnorm_fwd_kernel) for
    x [outer, heads, N]: row r = (r // heads, r % heads), at x.stride(1) within its group of
    heads and x.stride(0) between groups, rows no one stride describes (a [tokens, heads,
    head_dim] view of a packed QKV projection). None for x [M, N]."""
    if x.dim() == 2:
        return {}
    return {"HEADS": x.shape[1], "STRIDE_X_OUTER": x.stride(0)}


def check_hidden_size(n: int) -> None:
    if n > MAX_N:
        raise ValueError(f"x: hidden size (last dimension) N={n} exceeds {MAX_N} (int32 columns)")


def _on_device(x: torch.Tensor):
    """Make x's GPU the current device for the launches (a no-op when it already is)."""
    index = x.get_device()  # -1 on the CPU
    if index >= 0 and index != torch.cuda.current_device():
        return torch.cuda.device(index)
    return contextlib.nullcontext()


def _check_runnable(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"x: the Triton RMSNorm needs a CUDA tensor, got one on {x.device}; to run on the CPU "
            "set TRITON_INTERPRET=1 before triton is first imported"
        )


def _hopper_class(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or later, where the held kernels (Gluon) run;
    they were measured on the H200 only (a pretended capability: any device)."""
    if "capability" in _PRETENDED:
        return _PRETENDED["capability"] >= (9, 0)
    return device.type == "cuda" and torch.cuda.get_device_capability(device.index or 0) >= (9, 0)


def cast_saturates(device: torch.device) -> bool:
    """Whether Triton's fp32 -> fp8 conversion on this device clamps to +-max and keeps NaN by
    itself (cvt.rn.satfinite: CUDA compute capability 8.9 and later), so that an explicit clamp
    before it changes no code (a pretended capability: any CUDA device; never on ROCm)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if "capability" in _PRETENDED:
        return _PRETENDED["capability"] >= (8, 9)
    return _saturating_cvt(device.index or 0)


@functools.cache
def _saturating_cvt(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


FACT_CACHES.append(_saturating_cvt)


#: RMSNORM_TRITON_PDL=0 (read at import) launches every kernel without programmatic dependent
#: launch; by default the single-tile forwards (plain and fp8) use it where the GPU has it
#: (pdl_switches).
_PDL_ENABLED = os.environ.get("RMSNORM_TRITON_PDL", "1") != "0"


def pdl_switches(device: torch.device) -> dict:
    """The launch keywords of a kernel that may start before the kernel ahead of it finishes
    (programmatic dependent launch, compute capability 9.0 and later, CUDA only): it waits on
    that kernel first thing (WAIT_FOR_PRIOR_GRID), and its launch and prologue overlap the
    previous kernel's tail. Empty under the interpreter, on ROCm and older GPUs, and with
    RMSNORM_TRITON_PDL=0. On the H200 it took 0.4-0.5 us off a decode-sized forward
    (docs/perf-log.md, twenty-sixth session). Callers unpack it; never mutate it."""
    if device.type != "cuda":
        return {}
    return _pdl_switches(device.index or 0)


@functools.cache
def _pdl_switches(device_index: int) -> dict:
    """pdl_switches of a CUDA device, decided once per device (it is on every forward's path)."""
    if not _PDL_ENABLED or interpreting() or torch.version.hip is not None:
        return {}
    if not _hopper_class(torch.device("cuda", device_index)):
        return {}
    return {"WAIT_FOR_PRIOR_GRID": True, "launch_pdl": True}


FACT_CACHES.append(_pdl_switches)


def _shared_bytes_per_block(device_index: int) -> int:
    """The most shared memory a program may ask for on this device (0 if torch does not say)."""
    pretended = _PRETENDED.get("shared_bytes_per_block")
    return pretended if pretended is not None else _device_shared_bytes_per_block(device_index)


@functools.cache
def _device_shared_bytes_per_block(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 0)


def _shared_bytes_per_sm(device_index: int) -> int:
    """An SM's shared memory on this device, shared by its resident programs (if torch does not
    say, what one program may ask for: room for one)."""
    pretended = _PRETENDED.get("shared_bytes_per_sm")
    if pretended is not None:
        return pretended
    props = torch.cuda.get_device_properties(device_index)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
    return per_sm or _shared_bytes_per_block(device_index)


def _row_period(m: int, n: int, tensors: tuple) -> int:
    """1 where rows of n elements in these [m, n] tensors start on 16 bytes, or cannot be
    shifted into alignment together; else the PERIOD of the shifted single-tile kernels
    (rmsnorm_fwd_shifted_kernel, rmsnorm_bwd_shifted_kernel), which take them: rows whose
    element offsets r * stride are not multiples of 16 bytes (N odd, say) in every tensor alike,
    outputs made contiguous (stride N) included: every base on 16 bytes, one element size and
    every row stride equal to N modulo the elements in 16 bytes; rows of two 16-byte groups or
    more (narrower rows move few bytes; the kernels' tile must be whole groups)."""
    size = tensors[0].element_size()
    vec = 16 // size
    residue = n % vec
    if (
        residue == 0
        or n < 2 * vec
        or any(t.element_size() != size or t.data_ptr() % 16 for t in tensors)
        or any(t.stride(0) % vec != residue for t in tensors if m > 1)
    ):
        return 1
    return vec // math.gcd(residue, vec)


def _shift_constants(n: int, element_size: int, period: int) -> dict:
    """The shifted kernels' VEC, PERIOD and MAY_WRAP: whether N plus the largest shift (the
    shifts are the multiples of VEC / PERIOD) passes the tile."""
    vec = 16 // element_size
    largest_shift = vec - vec // period
    return {"VEC": vec, "PERIOD": period, "MAY_WRAP": n + largest_shift > block_size(n)}


def _l2_bytes(device: torch.device) -> int:
    """The device's L2 cache in bytes (0 off CUDA: the interpreter's CPU has none to hit)."""
    if "l2_bytes" in _PRETENDED:
        return _PRETENDED["l2_bytes"]
    return device_l2_bytes(device.index or 0) if device.type == "cuda" else 0


def device_l2_bytes(device_index: int) -> int:
    """A CUDA device's own L2 cache in bytes (50 MB if torch does not say), never pretended:
    the tuner's rotating copies must pass the real one."""
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "L2_cache_size", 0) or 50 << 20)


def _inline_ptx_runs() -> bool:
    """NVIDIA GPUs run the kernels' inline PTX (kernels._upcast_opaque); neither the
    interpreter nor ROCm does (unless pretended: pretend_device(inline_ptx=True))."""
    if "inline_ptx" in _PRETENDED:
        return _PRETENDED["inline_ptx"]
    return not interpreting() and torch.version.hip is None
