"""Our fused Triton RMSNorm: ``rmsnorm(x, weight, eps)`` and the ``RMSNorm`` module.

Layers, top to bottom: kernels.py (@triton.jit math) -> launch.py (grids, configs, allocation)
-> function.py (checks, autograd) -> module.py (nn.Module) -> backend.py (registry entry).
"""

from .function import RMSNormFunction, rmsnorm
from .launch import MAX_N
from .module import RMSNorm

__all__ = ["MAX_N", "RMSNorm", "RMSNormFunction", "rmsnorm"]
