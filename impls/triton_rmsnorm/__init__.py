"""Our fused Triton RMSNorm: ``rmsnorm(x, weight, eps)`` and the ``RMSNorm`` module.

Layers, top to bottom: kernels.py (@triton.jit math) -> launch.py (the launcher's entry: grids,
configs and allocation in its modules, docs/design.md) -> function.py (checks, autograd)
-> module.py (nn.Module) -> backend.py (registry entry).
Which path and configurations serve a call: dispatch.py (decided ahead of time, from the
dispatch table, dispatch_table.py, written by `python -m impls.triton_rmsnorm.tune`;
`dispatch.override(...)` forces a path, `dispatch.tuning()` tunes at run time; explain.py says
which path a call gets and why).
fp8_kernels.py -> fp8.py: rmsnorm_fp8, the norm quantized to fp8 in the same pass.
"""

from . import dispatch
from .fp8 import rmsnorm_fp8
from .function import RMSNormFunction, rmsnorm
from .launch import MAX_N
from .module import RMSNorm

__all__ = ["MAX_N", "RMSNorm", "RMSNormFunction", "dispatch", "rmsnorm", "rmsnorm_fp8"]
