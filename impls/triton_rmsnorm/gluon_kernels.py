"""Kernels in Gluon (triton.experimental.gluon): Triton's lower-level language, with explicit
layouts and shared memory, which Triton's own language does not expose. Every Gluon kernel is
importable from here, where the launchers look them up:

- gluon_common.py: what they share (the cp.async load, the upcasts, the backward's staging);
- gluon_held_row.py: one program holds each row (forward and backward);
- gluon_group_exchange.py: how GROUP programs share a row (places, claims, the sums' exchange);
- gluon_group_kernels.py: the grouped kernels, GROUP programs a row (forward and backward).

Imported only where Gluon is (held_paths.py falls back without it); launched only on NVIDIA GPUs
(cp.async, inline PTX), never under the interpreter.
"""

from .gluon_group_kernels import rmsnorm_bwd_held_group_kernel, rmsnorm_fwd_held_group_kernel
from .gluon_held_row import rmsnorm_bwd_held_row_kernel, rmsnorm_fwd_held_row_kernel

__all__ = [
    "rmsnorm_bwd_held_group_kernel",
    "rmsnorm_bwd_held_row_kernel",
    "rmsnorm_fwd_held_group_kernel",
    "rmsnorm_fwd_held_row_kernel",
]
