"""dispatch.override: forcing a path by name for the calls of a block (tests, experiments,
explain), and the public names of paths (dispatch tables and overrides name paths so).
dispatch.py re-exports every public name here."""

from __future__ import annotations

import contextlib
import threading


class _Layers(threading.local):
    """Per thread: the stack of override layers (innermost last), each a dict of the forced
    forward and backward names, their configurations and offered_only; None in a thread that
    has made none (a class default: read at every call, it raises nothing)."""

    stack = None


_OVERRIDES = _Layers()


# ---- override -----------------------------------------------------------------------------


@contextlib.contextmanager
def override(
    forward: str | None = None,
    backward: str | None = None,
    forward_configs: dict | None = None,
    backward_configs: dict | None = None,
    *,
    offered_only: bool = True,
):
    """Force the forward and/or backward path by name (dispatch.path_name: "single_tile",
    "looped", "split", "held_row", "held_row(warps=16)", "wide", "two_role", ...) for calls
    made in this thread inside the block, and for the backwards of eager forwards made there
    (autograd may run them on another thread: CUDA's). A block around .backward() alone forces
    nothing on CUDA (the backward runs on autograd's thread): put the forward inside it (a
    forward that reentrant checkpointing recomputes there is not forced either). A forced
    path that is not offered for a call raises ValueError naming the offered ones. The kernels
    take forward_configs / backward_configs (kernel name -> launch keywords, as in a table
    entry) when given, else the table's when the table picks the same path for the call, else
    the heuristic's; replays are bypassed (but for offered_only=False: replays of their own).

    offered_only=False (kernel tests): the named paths serve every call of the block whether or
    not the launcher offers them for it, as its only path (launch.forward_paths and
    backward_paths); a path that cannot run the tensors fails in its kernel. Rows in two levels
    (x [outer, heads, N]) still take the single tile only."""
    for name, value in (("forward", forward), ("backward", backward)):
        if value is not None and not isinstance(value, str):
            raise TypeError(
                f"{name}: expected a path name (str) or None, got {type(value).__name__}"
            )
    for name, value, path in (("forward_configs", forward_configs, forward),
                              ("backward_configs", backward_configs, backward)):  # fmt: skip
        if value is not None and (not isinstance(value, dict) or path is None):
            raise TypeError(
                f"{name}: expected a dict of kernel name -> launch keywords, with its path named"
            )
    if not isinstance(offered_only, bool):
        raise TypeError(f"offered_only: expected a bool, got {type(offered_only).__name__}")
    stack = _override_stack()
    stack.append({"fwd": forward, "bwd": backward, "fwd_configs": forward_configs,
                  "bwd_configs": backward_configs, "offered_only": offered_only})  # fmt: skip
    try:
        yield
    finally:
        stack.pop()


def _innermost(direction: str) -> dict | None:
    """The innermost layer of this thread's overrides that forces `direction`, or None."""
    for layer in reversed(getattr(_OVERRIDES, "stack", None) or ()):
        if layer[direction] is not None:
            return layer
    return None


def forced_configs(direction: str) -> dict | None:
    layer = _innermost(direction)
    return None if layer is None else layer[direction + "_configs"]


def _override_stack() -> list:
    stack = getattr(_OVERRIDES, "stack", None)
    if stack is None:
        stack = _OVERRIDES.stack = []
    return stack


def overridden() -> bool:
    """Whether a path is forced in this thread (replays are then bypassed)."""
    return bool(getattr(_OVERRIDES, "stack", None))


def backward_overrides_in_effect() -> tuple:
    """The overrides forcing this thread's backward path now (innermost last), for a forward to
    hand to its backward: autograd runs a CUDA backward on a thread of its own, which sees none.
    Forward-only layers are left out (they would only turn the backward's replays off)."""
    return tuple(layer for layer in getattr(_OVERRIDES, "stack", None) or ()
                 if layer["bwd"] is not None)  # fmt: skip


@contextlib.contextmanager
def overrides_of_forward(layers: tuple):
    """Inside the block this thread's calls take `layers` (backward_overrides_in_effect() of the
    forward whose backward runs here) on top of the thread's own overrides, so that the
    forward's choice wins on every device (on the CPU autograd runs the backward on the calling
    thread, which may have overrides of its own; on CUDA on a thread that has none)."""
    stack = _override_stack()
    depth = len(stack)
    stack.extend(layers)
    try:
        yield
    finally:
        del stack[depth:]


def forced(direction: str) -> str | None:
    layer = _innermost(direction)
    return None if layer is None else layer[direction]


def replay_tag() -> tuple | None:
    """What the overrides in effect add to a replay key (replays.py): () with none; with only a
    kernel test's layers (offered_only=False) their forced names and configurations, so that
    their replays are their own; None with any other layer (no replay: a forced choice among
    the offered paths is made at every call, as it can differ from the table's)."""
    stack = getattr(_OVERRIDES, "stack", None)
    if not stack:
        return ()
    if any(layer["offered_only"] for layer in stack):
        return None
    return tuple((layer["fwd"], layer["bwd"], repr(layer["fwd_configs"]),
                  repr(layer["bwd_configs"])) for layer in stack)  # fmt: skip


def forced_beyond_offers(direction: str) -> str | None:
    """The path name an override(offered_only=False) forces in this direction, else None."""
    layer = _innermost(direction)
    return None if layer is None or layer["offered_only"] else layer[direction]


def path_named(paths: list, name: str, direction: str):
    """The path of every path (`paths`) named `name` (path_name; a bare name takes the first of
    its kind), for an override(offered_only=False); ValueError naming them otherwise."""
    path = _find_named(paths, name)
    if path is not None:
        return path
    raise ValueError(f"dispatch.override: no {direction} path is named {name!r}; the "
                     f"{direction} paths: {', '.join(path_name(p) for p in paths)}")  # fmt: skip


# ---- path names ------------------------------------------------------------------------------


def path_name(path) -> str:
    """A path's public name (dispatch tables, dispatch.override): paths.Path.name, its family
    with its settings ("single_tile", "held_row(warps=16)",
    "held_group(slice_n=4096,ring=3,per_sm=6,warps=4)")."""
    return path.name


def _find_named(paths: list, name: str):
    """The path of `paths` of that name, or None; a bare name ("held_row") takes the first of
    its kind."""
    for path in paths:
        full = path_name(path)
        if full == name or full.split("(")[0] == name:
            return path
    return None


def _named_path(paths: list, name: str, direction: str):
    """The offered path of that name (_find_named), else ValueError naming the offered ones."""
    path = _find_named(paths, name)
    if path is not None:
        return path
    offered = ", ".join(path_name(p) for p in paths)
    raise ValueError(
        f"dispatch.override: the {direction} path {name!r} is not offered for this call; "
        f"offered: {offered}"
    )
