"""torch.nn.functional.rms_norm with an fp32 weight on 16-bit input: the mixed-dtype case.

Models that keep norm weights in fp32 (mixed-precision training) call it this way. PyTorch
(2.9 to 2.11 at least) then skips its fused kernel and runs composite ops, with a one-time
warning; this backend shows what that costs beside the matched-dtype ``torch`` backend.
The fp32 copy of the weight is made once per call here (N elements, negligible next to M*N).
"""

from __future__ import annotations

import torch

from impls import Backend, RMSNormFn
from impls.torch_native import _unavailable


def _build() -> RMSNormFn:
    def torch_rms_norm_fp32_weight(x: torch.Tensor, weight: torch.Tensor, eps: float):
        return torch.nn.functional.rms_norm(x, weight.shape, weight.float(), eps)

    return torch_rms_norm_fp32_weight


BACKEND = Backend(
    name="torch-fp32w",
    label="F.rms_norm, fp32 weight (unfused)",
    build=_build,
    numerics="two_roundings",
    own_backward=False,
    unavailable=_unavailable,
)
