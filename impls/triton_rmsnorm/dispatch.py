"""Which path and launch configurations serve a call, decided ahead of time.

A default call on a CUDA device takes its path and its kernels' configurations from a dispatch
table (dispatch_table.py: the format and the lookup rule), and times nothing: no candidate is
compiled that will not run, nothing is copied, the host is never synchronized, no graph is
captured. The tables, first to last (a later one's entries win at the same point):
1. the committed table of this GPU class, impls/triton_rmsnorm/tables/<gpu-slug>.json (written
   by `python -m impls.triton_rmsnorm.tune`);
2. the runtime tuning cache, $RMSNORM_TRITON_TUNE_CACHE or
   ~/.cache/rmsnorm-triton/<gpu-slug>.json (written by opt-in runtime tuning, below).
A call with no entry (a GPU with no table, a width past the table's) takes the heuristic: the
default path (the first offered) in its kernels' heuristic configurations.

Environment (read at import):
- RMSNORM_TRITON_AUTOTUNE=0: the heuristic only; tables and the cache are ignored, nothing is
  tuned (quick checks; kept with the meaning it had: one compile per shape, nothing measured).
- RMSNORM_TRITON_TUNE=1: opt-in runtime tuning. A call whose class (direction, dtypes,
  residual, N, M's class 2**floor(log2 M)) has no entry in the cache yet measures its offered
  paths and tunes its kernels as the offline tuner does, then appends the choice to the cache
  file, which this and later processes read before the committed table. While tuning, the call
  synchronizes the host and allocates rotating copies (tuning.py); it runs on a private CUDA
  stream of its own (never one of PyTorch's pooled streams), one tuning at a time in the
  process (a lock), never inside a CUDA-graph capture (there the table or the heuristic serves
  the call, and nothing is remembered), and raises RuntimeError when
  torch.cuda.get_sync_debug_mode() is nonzero. The grouped (held_group) paths are not
  measured unless RMSNORM_TRITON_TUNE_GROUP=1.
- RMSNORM_TRITON_TUNE_CACHE=<path>: the cache file (default above).

`tuning()` turns runtime tuning on for a block of code (the offline tuner uses it, writing to
its own table); `override()` forces a path (tests, users comparing paths); `pretend_device()`
gives every device other facts (SM count, shared memory, capability, inline PTX) for a block,
so that a CPU test or an experiment sees one GPU's choices (common.pretend_device).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from . import common, dispatch_table
from .common import pretend_device  # noqa: F401  (public here, beside override)
from .dispatch_table import Entry, Key, Table

# dispatch.override and the path names live in overrides.py; re-exported here, where callers
# and tests have always found them.
from .overrides import (  # noqa: F401
    _named_path,
    backward_overrides_in_effect,
    forced,
    forced_beyond_offers,
    forced_configs,
    overridden,
    override,
    overrides_of_forward,
    path_name,
    path_named,
    replay_tag,
)

_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"  # as common.py reads it
_HEURISTIC_ONLY = os.environ.get("RMSNORM_TRITON_AUTOTUNE", "1") == "0"
_TUNE_ENV = os.environ.get("RMSNORM_TRITON_TUNE", "0") == "1"
_TUNE_GROUP_ENV = os.environ.get("RMSNORM_TRITON_TUNE_GROUP", "0") == "1"


class _PerThread(threading.local):
    """Per thread: the running path's table configurations (kernel name -> launch keywords)
    that kernel_launch._launch reads; `measuring` while a tuning measures, on `stream`;
    `launched`, a dict that _launch fills with each tuned kernel's configuration while a
    tuning's choice is harvested; `left_untuned` (replays.py). The class attributes are what a
    thread reads before it sets its own (a getattr default on a bare threading.local costs
    ~0.5 us a read, an AttributeError raised and caught, on every call)."""

    configs = None
    measuring = False
    stream = None
    launched = None
    left_untuned = False


_ACTIVE = _PerThread()
#: One tuning at a time in the process (each times on the GPU; two at once would time each
#: other's kernels).
_TUNING_LOCK = threading.RLock()


class _Session:
    """Where a tuning's choices go: a table, saved to `path` after each new entry (or kept in
    memory when path is None), and whether the grouped paths are measured."""

    def __init__(self, table: Table, path: Path | None, allow_group: bool):
        self.table, self.path, self.allow_group = table, path, allow_group

    def add(self, *entries: Entry) -> None:
        for entry in entries:
            self.table.add(entry)
        if self.path is not None:
            on_disk = _read(self.path)  # another process may have added entries since
            for entry in entries:
                on_disk.add(entry)
            on_disk.meta = {**on_disk.meta, **self.table.meta}
            on_disk.save(self.path)
        _forget_lookups()


_SESSION: _Session | None = None
#: RMSNORM_TRITON_TUNE=1's sessions, by (device, GPU name): a name pretend_device gives has
#: its own cache file.
_ENV_SESSION: dict[tuple, _Session] = {}


def heuristic_only() -> bool:
    return _HEURISTIC_ONLY


@contextlib.contextmanager
def reading_tables(enabled: bool = True):
    """Within the block, calls read the committed table and the tuning cache (enabled), or
    ignore them as under RMSNORM_TRITON_AUTOTUNE=0 (the heuristic serves every call that no
    tuning session's entry does), whatever the environment said at import. Process-wide, as
    that variable is, and for a block no other thread makes calls across (a test's): the
    lookups and replays made under the other setting are forgotten as the block opens and
    closes, not while another thread reads them."""
    global _HEURISTIC_ONLY
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__}")
    before = _HEURISTIC_ONLY
    _HEURISTIC_ONLY = not enabled
    _forget_lookups()
    try:
        yield
    finally:
        _HEURISTIC_ONLY = before
        _forget_lookups()


def cache_path(device_name: str) -> Path:
    env = os.environ.get("RMSNORM_TRITON_TUNE_CACHE")
    if env:
        return Path(env)
    return (
        Path.home() / ".cache" / "rmsnorm-triton" / f"{dispatch_table.gpu_slug(device_name)}.json"
    )


# ---- the tables ---------------------------------------------------------------------------


def _read(path: Path) -> Table:
    """path's table; a broken file is reported and skipped (it never takes a call down)."""
    if not path.exists():
        return Table()
    try:
        return Table.load(path)
    except (OSError, ValueError) as error:
        warnings.warn(
            f"rmsnorm: dispatch table {path} ignored: {error}", RuntimeWarning, stacklevel=3
        )
        return Table()


_TABLES: dict[int, Table] = {}
_TABLES_LOCK = threading.Lock()


def table(device_index: int) -> Table:
    """The merged table that serves calls on this CUDA device (committed, then cache, then the
    running tuning session's entries; only the session's under RMSNORM_TRITON_AUTOTUNE=0)."""
    found = _TABLES.get(device_index)
    if found is None:
        generation = current_generation()
        with _TABLES_LOCK:
            found = Table()
            if not _HEURISTIC_ONLY:
                name = common.gpu_name(device_index)
                found = _read(dispatch_table.committed_table_path(name))
                with contextlib.suppress(RuntimeError):  # no home directory: no cache
                    found = found.merged(_read(cache_path(name)))
            if _SESSION is not None:
                found = found.merged(_SESSION.table)
            with STATE_LOCK:
                if GENERATION[0] == generation:  # else the tables changed while it was read
                    _TABLES[device_index] = found
    return found


#: (device, direction, dtypes, residual, N, M's bit length) -> the entry or None.
_LOOKUPS: dict[tuple, Entry | None] = {}


#: Called when the tables change (replays.py forgets its replays, recorded under the old ones).
ON_CHANGE: list = []
#: Called as a tuning session opens (kernel_launch forgets the kernel configurations tuned
#: before: a session measures every kernel it meets anew).
ON_TUNING_START: list = []


#: Counts the tables' changes: a call during which it moved (a tuning) is not recorded for
#: replays (replays._record).
GENERATION = [0]
#: Held over a change (GENERATION's step, the caches' clearing and the ON_CHANGE hooks), over
#: every read of GENERATION that a later store checks against, and over those stores (_TABLES,
#: _LOOKUPS, and replays._record's replay and its registration): a store made from what was
#: read before a change never lands after it.
STATE_LOCK = threading.RLock()


def current_generation() -> int:
    """GENERATION now, never in the middle of a change."""
    with STATE_LOCK:
        return GENERATION[0]


def _forget_lookups() -> None:
    with STATE_LOCK:
        GENERATION[0] += 1
        _TABLES.clear()
        _LOOKUPS.clear()
        for hook in ON_CHANGE:
            hook()


common.FACT_CACHES.append(_forget_lookups)  # the offers a lookup took depend on the facts


def reload() -> None:
    """Read the tables again at the next call (after a table or the cache changed on disk)."""
    _forget_lookups()


def entry_key(direction: str, dtypes: tuple, residual: bool) -> Key:
    return Key(direction, tuple(dispatch_table.dtype_name(d) for d in dtypes), residual)


def lookup(direction: str, dtypes: tuple, residual: bool, n: int, m: int, device_index: int):
    """The table entry serving this call, or None (the heuristic)."""
    key = (device_index, direction, dtypes, residual, n, m.bit_length())
    try:
        return _LOOKUPS[key]
    except KeyError:
        pass
    generation = current_generation()
    entry = None
    if not _HEURISTIC_ONLY or _SESSION is not None:  # an explicit tuning session is read
        entry = table(device_index).lookup(entry_key(direction, dtypes, residual), n, m)
    with STATE_LOCK:
        if GENERATION[0] == generation:  # else the tables changed during the lookup
            _LOOKUPS[key] = entry
    return entry


# ---- opt-in tuning ------------------------------------------------------------------------


@contextlib.contextmanager
def tuning(table_path: str | os.PathLike | None = None, allow_group: bool = False,
           into: Table | None = None):  # fmt: skip
    """Runtime tuning on, for calls made inside the block (any thread): each call class not in
    the session's table is measured and tuned (every kernel's configuration measured anew, not
    taken from an earlier tuning in the process), and its choice added to the session's table
    (`into`, or a new one) and saved to table_path when given. Entries the session holds are
    read before every other table. One session at a time."""
    global _SESSION
    with _TUNING_LOCK:
        if _SESSION is not None:
            raise RuntimeError("rmsnorm: a tuning session is already open")
        path = None if table_path is None else Path(table_path)
        session_table = into if into is not None else (_read(path) if path else Table())
        _SESSION = _Session(session_table, path, allow_group)
        _forget_lookups()
        for hook in ON_TUNING_START:
            hook()
    try:
        yield _SESSION.table
    finally:
        with _TUNING_LOCK:
            _SESSION = None
            _forget_lookups()


def add_entry(*entries: Entry) -> None:
    """Add (or replace) entries in the open tuning session's table (and its file, saved once)."""
    if _SESSION is None:
        raise RuntimeError("rmsnorm: dispatch.add_entry needs an open dispatch.tuning() session")
    _SESSION.add(*entries)


def _session(device_index: int) -> _Session | None:
    if _SESSION is not None:
        return _SESSION
    if not _TUNE_ENV or _HEURISTIC_ONLY:
        return None
    name = common.gpu_name(device_index)
    session = _ENV_SESSION.get((device_index, name))
    if session is None:
        path = cache_path(name)
        session = _ENV_SESSION[device_index, name] = _Session(_read(path), path, _TUNE_GROUP_ENV)
    return session


def left_untuned() -> bool:
    """Whether a call of this thread met a tuning it could not run (inside a capture) since
    the flag was last cleared (replays._record clears it around the call it records)."""
    return getattr(_ACTIVE, "left_untuned", False)


def measuring() -> bool:
    """Whether this thread is measuring (kernel_launch._launch then tunes its kernels)."""
    return getattr(_ACTIVE, "measuring", False)


def is_group_path(name: str) -> bool:
    return name.startswith("held_group")


@functools.cache
def private_stream(device_index: int) -> torch.cuda.ExternalStream:
    """A CUDA stream of this module's own on the device, created by cudaStreamCreate (never
    drawn from PyTorch's stream pool, whose streams other code shares: work another thread
    queued on a pooled stream would be captured into a tuning's timing graph). Kept for the
    process."""
    with torch.cuda.device(device_index):
        torch.cuda.init()
        holder = ctypes.c_void_p()
        create = getattr(torch.cuda.cudart(), "cudaStreamCreate", None)
        if create is None:
            raise RuntimeError(
                "rmsnorm: runtime tuning needs a private CUDA stream, and this torch's "
                "torch.cuda.cudart() has no cudaStreamCreate"
            )
        error = create(ctypes.addressof(holder))
        code = int(getattr(error, "value", error))
        if code != 0 or not holder.value:
            raise RuntimeError(f"rmsnorm: cudaStreamCreate failed (cudaError {code})")
        return torch.cuda.ExternalStream(holder.value, device=torch.device("cuda", device_index))


def tunes(direction: str, dtypes: tuple, residual: bool, n: int, m: int, device) -> _Session | None:
    """The tuning session that should measure this call now, or None: a session is open (or
    RMSNORM_TRITON_TUNE=1), the call is on a CUDA device, not inside a capture, and its class
    has no entry of the session's own yet. Raises where the host may not be synchronized."""
    if device.type != "cuda":
        return None
    session = _session(device.index or 0)
    if session is None:
        return None
    point = (entry_key(direction, dtypes, residual), n, dispatch_table.m_class(m))
    if point in session.table:
        return None
    if torch.cuda.is_current_stream_capturing():
        # nothing can be timed inside a capture: the table or heuristic serves it, and nothing
        # is remembered, not even a replay (replays._record), which would serve the later calls
        # of this signature outside the capture and so keep them from ever being tuned
        _ACTIVE.left_untuned = True
        return None
    if torch.cuda.get_sync_debug_mode() != 0:
        raise RuntimeError(
            "rmsnorm: runtime tuning (RMSNORM_TRITON_TUNE=1 or dispatch.tuning()) synchronizes "
            "the host to time candidates, and torch.cuda.get_sync_debug_mode() is "
            f"{torch.cuda.get_sync_debug_mode()}; tune outside this mode, or turn tuning off "
            "to use the committed table"
        )
    return session


def tune_call(session: _Session, direction: str, dtypes: tuple, residual: bool, n: int, m: int,
              paths: list, args: tuple, device, fastest, name_of) -> bool:  # fmt: skip
    """Measure the call's paths (fastest(paths, args): each path's first run tunes its
    kernels; then each is timed), run the fastest once more to harvest its kernels'
    configurations, and add the entry to the session. The caller's outputs are written by
    these runs (every path writes the same outputs from the same inputs). False, having run
    nothing, when another thread added the call's entry while this one waited for the lock:
    the caller then takes the entry as any call does (so both threads get the same bits)."""
    if not session.allow_group:
        paths = [p for p in paths if not is_group_path(name_of(p))]
    key = entry_key(direction, dtypes, residual)
    with _TUNING_LOCK:
        if (key, n, dispatch_table.m_class(m)) in session.table:
            return False
        stream = private_stream(device.index or 0)
        outer = (measuring(), getattr(_ACTIVE, "stream", None))
        _ACTIVE.measuring, _ACTIVE.stream = True, stream
        try:
            path = fastest(paths, args) if len(paths) > 1 else paths[0]
            _ACTIVE.launched = launched = {}
            try:
                path(*args)
            finally:
                _ACTIVE.launched = None
        finally:
            _ACTIVE.measuring, _ACTIVE.stream = outer
        session.add(Entry(key, n, dispatch_table.m_class(m), name_of(path), launched))
    return True


def tuning_stream():
    """The private stream of the tuning running in this thread (tuning.fastest times on it)."""
    return getattr(_ACTIVE, "stream", None)


# ---- the call ------------------------------------------------------------------------------


class Choice(NamedTuple):
    """Which offered path serves a call, with its kernels' configurations (None: each kernel's
    heuristic), where the choice came from (one of SOURCES) and the table entry it read, if
    any. Cheap to make (no text): `describe` words it for `explain`."""

    path: object
    configs: dict | None
    source: str
    entry: Entry | None = None
    forced: str | None = None

    def describe(self) -> str:
        e, name = self.entry, self.forced
        at = f"the table's entry n={e.n}, m={e.m}" if e is not None else ""
        return SOURCES[self.source].format(at=at, name=name, entry_path=e.path if e else None)


#: Choice.source -> how explain words it.
SOURCES = {
    "override": "dispatch.override forced {name!r}, heuristic configurations",
    "override_configs": "dispatch.override forced {name!r} with its configurations",
    "override_table": "dispatch.override forced {name!r}, with the configurations of {at}",
    "table": "{at} of the dispatch table",
    "not_offered": "heuristic: {at} names {entry_path!r}, which is not offered for this call",
    "interpreter": "heuristic: no table under the Triton interpreter",
    "autotune_off": "heuristic: RMSNORM_TRITON_AUTOTUNE=0",
    "no_entry": "heuristic: no table entry for this GPU, dtypes, residual and padded width",
}


def choose(direction: str, dtypes: tuple, residual: bool, n: int, m: int, paths: list,
           device: torch.device) -> Choice:  # fmt: skip
    """The path of `paths` (the default first) and configurations that serve the call, without
    running or measuring anything: a forced one (override), else the dispatch table's entry
    when its path is offered, else the default in heuristic configurations. (An opt-in tuning
    measures before this: run.)"""
    name = forced(direction) if overridden() else None
    entry = None
    if device.type == "cuda" and not _INTERPRETING:
        entry = lookup(direction, dtypes, residual, n, m, device.index or 0)
    if name is not None:
        path = _named_path(paths, name, direction)
        configs = forced_configs(direction)
        if configs is not None:
            return Choice(path, configs, "override_configs", entry, name)
        if entry is not None and entry.path == path_name(path):
            return Choice(path, entry.configs, "override_table", entry, name)
        return Choice(path, None, "override", entry, name)
    if entry is not None:
        for offered in paths:
            if path_name(offered) == entry.path:
                return Choice(offered, entry.configs, "table", entry)
        return Choice(paths[0], None, "not_offered", entry)
    if device.type != "cuda" or _INTERPRETING:
        return Choice(paths[0], None, "interpreter")
    if _HEURISTIC_ONLY and _SESSION is None:
        return Choice(paths[0], None, "autotune_off")
    return Choice(paths[0], None, "no_entry")


def run(direction: str, dtypes: tuple, residual: bool, n: int, m: int, paths: list,
        device: torch.device, args: tuple, fastest) -> None:  # fmt: skip
    """Run the call (args) on the path of `paths` (the default first) that serves it: an opt-in
    tuning's pick (fastest(paths, args) measures them) unless a path is forced, else `choose`'s.
    The path's kernels read the chosen configurations from _ACTIVE.configs
    (kernel_launch._launch)."""
    tuning_on = _SESSION is not None or _TUNE_ENV
    if tuning_on and device.type == "cuda" and not _INTERPRETING and not forced(direction):
        session = tunes(direction, dtypes, residual, n, m, device)
        if session is not None and tune_call(
            session, direction, dtypes, residual, n, m, paths, args, device, fastest, path_name
        ):
            return
    path, configs, *_ = choose(direction, dtypes, residual, n, m, paths, device)
    if configs is None:
        path(*args)
        return
    outer = getattr(_ACTIVE, "configs", None)
    _ACTIVE.configs = configs
    try:
        path(*args)
    finally:
        _ACTIVE.configs = outer
