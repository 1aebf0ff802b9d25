"""The compile backend runs compiled code at every shape, past dynamo's recompile limit."""

from __future__ import annotations

import torch

from harness.inputs import make_inputs
from impls import compiled, get_backend
from tests.conftest import DEVICE


def test_every_shape_is_compiled_past_the_recompile_limit():
    backend = get_backend("compile")
    shapes = [(4, 64 + 8 * i) for i in range(compiled.recompile_limit() + 2)]
    for shape in shapes:
        before = compiled.compiled_graph_count()
        fn = backend.build()
        inputs = make_inputs(shape, torch.float32, DEVICE)
        with torch.no_grad():
            fn(inputs.x, inputs.weight, inputs.eps)
        assert compiled.compiled_graph_count() == before + 1, f"{shape} did not compile"


def test_one_shared_compiled_function_would_fall_back():
    """Why build() resets dynamo: one function called at many shapes hits the limit; with the
    limit made an error (as build() does), that is loud instead of silently eager."""
    fn = get_backend("compile").build()
    limit = compiled.recompile_limit()
    failures = []
    with torch.no_grad():
        for i in range(limit + 2):
            inputs = make_inputs((2, 32 + 8 * i), torch.float32, DEVICE)
            try:
                fn(inputs.x, inputs.weight, inputs.eps)
            except Exception as exc:  # the recompile-limit failure, and only that, is expected
                failures.append(exc)
    assert failures, "hitting the recompile limit went unnoticed"
    assert all("recompile" in f"{type(e).__name__} {e}".lower() for e in failures), failures
