"""Shape presets for harness.compare: (M, N) pairs, M rows of hidden size N."""

from __future__ import annotations

Shape = tuple[int, int]

PRESETS: dict[str, tuple[str, list[Shape]]] = {
    "seed": (
        "the seed's sweep: N in {2048, 4096, 8192} x M in {512, 1024, 2048, 4096}",
        [(m, n) for n in (2048, 4096, 8192) for m in (512, 1024, 2048, 4096)],
    ),
    "narrow": (
        "many narrow rows, as in per-head QK-norm: N in {128, 512, 1024}, M*N = 32M",
        [(2**25 // n, n) for n in (128, 512, 1024)],
    ),
    "large": (
        "large inputs, M*N >= 128M: N = 4096 and 8192",
        [(32768, 4096), (16384, 8192), (65536, 8192)],
    ),
    "odd": (
        "odd hidden sizes of real models: N in {3584, 4095, 5120, 7168}, M = 8192",
        [(8192, n) for n in (3584, 4095, 5120, 7168)],
    ),
    "wide": (
        "wide rows, N from 16384 to 1048576, M*N = 64M",
        [(2**26 // n, n) for n in (16384, 32768, 65536, 131072, 262144, 1048576)],
    ),
    "cpu": (
        "a small sweep for machines without CUDA (interpreter: not performance numbers)",
        [(64, 512), (128, 1000)],
    ),
}


def parse_shape(text: str) -> Shape:
    """'4096x8192' -> (4096, 8192); a clear error otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"shape: expected MxN such as 4096x8192, got {text!r}")
    m, n = (int(p) for p in parts)
    if m <= 0 or n <= 0:
        raise ValueError(f"shape: M and N must be positive, got {text!r}")
    return m, n


def resolve(presets: list[str], explicit: list[str]) -> list[Shape]:
    """Shapes of the named presets, then explicit shapes, without duplicates, in order."""
    shapes: list[Shape] = []
    for name in presets:
        if name not in PRESETS:
            raise ValueError(f"preset: unknown {name!r}; known: {', '.join(PRESETS)}")
        shapes.extend(PRESETS[name][1])
    shapes.extend(parse_shape(s) for s in explicit)
    return list(dict.fromkeys(shapes))
