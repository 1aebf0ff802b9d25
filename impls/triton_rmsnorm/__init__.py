"""Our fused Triton RMSNorm: ``rmsnorm(x, weight, eps)`` and the ``RMSNorm`` module.

Layers, top to bottom: kernels.py (@triton.jit math) -> launch.py (grids, configs, allocation)
-> function.py (checks, autograd) -> module.py (nn.Module) -> backend.py (registry entry).
fp8_kernels.py -> fp8.py: rmsnorm_fp8, the norm quantized to fp8 in the same pass.
"""

from .fp8 import rmsnorm_fp8
from .function import RMSNormFunction, rmsnorm
from .launch import MAX_N
from .module import RMSNorm

__all__ = ["MAX_N", "RMSNorm", "RMSNormFunction", "rmsnorm", "rmsnorm_fp8"]
