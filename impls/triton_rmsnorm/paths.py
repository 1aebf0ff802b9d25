"""A path: one way to serve a call, with its public name. Which paths serve a call is launch.py's
(and offers.py's) business; which one runs is dispatch.py's."""

from __future__ import annotations


class Path:
    """The function that makes a call's launches, with its public name (dispatch tables,
    dispatch.override, explain): its family ("single_tile", "looped", "split", "wide",
    "two_role", "held_row", "held_group") and its settings, passed to the function as keywords
    and written into the name ("held_row(warps=16)"; a configuration NamedTuple by its fields:
    "held_group(slice_n=4096,ring=3,per_sm=6,warps=4)"). Paths compare by identity: one object
    a path (the measured paths' key holds them)."""

    __slots__ = ("run", "family", "settings", "name")

    def __init__(self, run, family: str, **settings) -> None:
        self.run, self.family, self.settings = run, family, settings
        parts = []
        for key, value in settings.items():
            fields = getattr(value, "_asdict", None)
            if fields is not None:
                parts.extend(f"{k}={v}" for k, v in fields().items())
            else:
                parts.append(f"{key}={value}")
        self.name = f"{family}({','.join(parts)})" if parts else family

    def __call__(self, *args) -> None:
        self.run(*args, **self.settings)

    def __repr__(self) -> str:
        return f"Path({self.name})"


def path(family: str):
    """A decorator: the function as the Path of that family, without settings."""
    return lambda run: Path(run, family)
