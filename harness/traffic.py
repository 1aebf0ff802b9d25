"""The byte model: how many bytes RMSNorm must move, and bandwidth from a time.

A model, not a DRAM counter. rmsnorm forward: read x, write y = 2*M*N elements; backward: read
x, read dy, write dx = 3*M*N. add_rmsnorm (h = x + r, y = RMSNorm(h)) forward: read x and r,
write y and h = 4*M*N; backward: read h, dy and dh, write dx (which is also dr) = 4*M*N.
Weight, rstd and dw partials are O(M + N) and not counted, so a kernel that re-reads x or spills
is charged nothing extra: it simply shows a lower bandwidth.
"""

from __future__ import annotations

#: M*N-sized tensors each (op, mode) must read or write once.
TENSORS_MOVED = {
    ("rmsnorm", "fwd"): 2,
    ("rmsnorm", "bwd"): 3,
    ("add_rmsnorm", "fwd"): 4,
    ("add_rmsnorm", "bwd"): 4,
}


#: Of those, the ones read (the rest are written): x; x and dy; x and r; h, dy and dh.
TENSORS_READ = {
    ("rmsnorm", "fwd"): 1,
    ("rmsnorm", "bwd"): 2,
    ("add_rmsnorm", "fwd"): 2,
    ("add_rmsnorm", "bwd"): 3,
}


def counted_read_bytes(mode: str, m: int, n: int, element_size: int, op: str = "rmsnorm") -> int:
    """The part of counted_bytes that ``op`` reads in ``mode``."""
    counted_bytes(mode, m, n, element_size, op)  # the same argument check
    return TENSORS_READ[(op, mode)] * m * n * element_size


def counted_bytes(mode: str, m: int, n: int, element_size: int, op: str = "rmsnorm") -> int:
    """Bytes ``op`` must move in ``mode`` ('fwd' or 'bwd') for an [M, N] input."""
    if (op, mode) not in TENSORS_MOVED:
        raise ValueError(f"op, mode: expected one of {sorted(TENSORS_MOVED)}, got {(op, mode)!r}")
    return TENSORS_MOVED[(op, mode)] * m * n * element_size


def fp8_counted_bytes(
    mode: str,
    m: int,
    n: int,
    element_size: int,
    *,
    scaling: str,
    residual: bool = False,
    group: int = 128,
) -> int:
    """Bytes rmsnorm_fp8 must move. fwd: read x (and r), write the 1-byte codes, the fp32
    scales (M per token, M * ceil(N / group) per block, none per tensor) and h with a residual;
    bwd: the plain op's (read x or h and dy, write dx; with a residual also read dh)."""
    if mode == "bwd":
        return counted_bytes("bwd", m, n, element_size, "add_rmsnorm" if residual else "rmsnorm")
    if mode != "fwd":
        raise ValueError(f"mode: expected 'fwd' or 'bwd', got {mode!r}")
    scales = {"per_token": m, "per_tensor": 0, "block": m * -(-n // group)}
    if scaling not in scales:
        raise ValueError(f"scaling: expected one of {sorted(scales)}, got {scaling!r}")
    inputs = (3 if residual else 1) * m * n * element_size  # x, and r read and h written
    return inputs + m * n + 4 * scales[scaling]


def model_bytes(shape: str, mode: str, dtype: str, op: str) -> tuple[int, int]:
    """The model's (bytes moved, bytes read) for one measurement: shape "MxN", mode, dtype name
    (fp16, bf16, fp32), op (what harness.ncu_bytes sets beside Nsight Compute's counts)."""
    from harness.shapes import parse_shape

    m, n = parse_shape(shape)
    element_size = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    return (counted_bytes(mode, m, n, element_size, op),
            counted_read_bytes(mode, m, n, element_size, op))  # fmt: skip


def copy_bytes(m: int, n: int, element_size: int) -> int:
    """A same-shape copy reads M*N and writes M*N elements: each shape's floor."""
    return 2 * m * n * element_size


def gbps(nbytes: int, ms: float) -> float:
    """Bandwidth in GB/s (1e9 bytes per second) for nbytes moved in ms milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms: expected a positive time, got {ms}")
    return nbytes / (ms * 1e-3) / 1e9
