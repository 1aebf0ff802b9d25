"""The byte model: how many bytes RMSNorm must move, and bandwidth from a time.

A model, not a DRAM counter. Forward: read x, write y = 2*M*N elements. Backward: read x, read dy,
write dx = 3*M*N elements. Weight, rstd and dw partials are O(M + N) and not counted, so a kernel
that re-reads x or spills is charged nothing extra: it simply shows a lower bandwidth.
"""

from __future__ import annotations

#: Elements of M*N moved by each mode.
ELEMENTS_PER_ROW_ELEMENT = {"fwd": 2, "bwd": 3}


def counted_bytes(mode: str, m: int, n: int, element_size: int) -> int:
    """Bytes the op must move in ``mode`` ('fwd' or 'bwd') for an [M, N] input."""
    if mode not in ELEMENTS_PER_ROW_ELEMENT:
        raise ValueError(f"mode: expected one of {sorted(ELEMENTS_PER_ROW_ELEMENT)}, got {mode!r}")
    return ELEMENTS_PER_ROW_ELEMENT[mode] * m * n * element_size


def copy_bytes(m: int, n: int, element_size: int) -> int:
    """A same-shape copy reads M*N and writes M*N elements: each shape's floor."""
    return 2 * m * n * element_size


def gbps(nbytes: int, ms: float) -> float:
    """Bandwidth in GB/s (1e9 bytes per second) for nbytes moved in ms milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms: expected a positive time, got {ms}")
    return nbytes / (ms * 1e-3) / 1e9
