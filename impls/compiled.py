"""torch.compile of the eager RMSNorm.

torch.compile silently runs eager code once a function passes its recompile limit (8 shapes by
default). To compile every shape, ``build()`` resets dynamo and returns a fresh compiled function
per (shape, dtype) case, compiled with ``dynamic=False`` and ``fullgraph=True``. Each compiled
graph goes through a counting wrapper around Inductor, so a test can prove that every shape ran
compiled code (``compiled_graph_count``).
"""

from __future__ import annotations

import torch

from impls import Backend
from impls.eager import add_rmsnorm_eager, rmsnorm_eager

_compiled_graphs = 0


def compiled_graph_count() -> int:
    """How many graphs Inductor compiled through this backend in this process."""
    return _compiled_graphs


def recompile_limit() -> int:
    """Dynamo's per-function recompile limit (renamed from cache_size_limit in torch 2.6)."""
    config = torch._dynamo.config
    return getattr(config, "recompile_limit", None) or config.cache_size_limit


def _counting_inductor(graph_module: torch.fx.GraphModule, example_inputs: list):
    global _compiled_graphs
    from torch._inductor.compile_fx import compile_fx

    _compiled_graphs += 1
    return compile_fx(graph_module, example_inputs)


def _fail_loudly_on_recompile_limit() -> None:
    # The flag was renamed across releases; either makes hitting the limit an error, not eager.
    config = torch._dynamo.config
    for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, flag):
            setattr(config, flag, True)


def _allow_repeated_backward() -> None:
    # Donated buffers free saved activations during the backward, which forbids
    # retain_graph=True; the harness replays one backward many times to time it alone.
    functorch_config = torch._functorch.config
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False


def _compiled(fn):
    def build():
        torch._dynamo.reset()
        _fail_loudly_on_recompile_limit()
        _allow_repeated_backward()
        return torch.compile(fn, backend=_counting_inductor, dynamic=False, fullgraph=True)

    return build


def _unavailable() -> str | None:
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    return None


BACKENDS = (
    Backend(
        name="compile",
        label="torch.compile(eager)",
        build=_compiled(rmsnorm_eager),
        numerics="storage_dtype_chain",
        own_backward=False,
        unavailable=_unavailable,
    ),
    Backend(
        name="compile-add",
        label="torch.compile(eager add + RMSNorm)",
        build=_compiled(add_rmsnorm_eager),
        numerics="storage_dtype_chain",
        own_backward=False,
        op="add_rmsnorm",
        unavailable=_unavailable,
    ),
)
