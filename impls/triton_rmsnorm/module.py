"""nn.Module wrapper that behaves like torch.nn.RMSNorm over the last dimension."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .function import rmsnorm


class RMSNorm(nn.Module):
    """Drop-in for ``torch.nn.RMSNorm(normalized_shape, eps, elementwise_affine)``.

    Only normalization over the last dimension is supported: ``normalized_shape`` is an int N or
    ``(N,)``. ``eps=None`` uses ``torch.finfo(x.dtype).eps``, as torch.nn.RMSNorm does.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                f"normalized_shape: only the last dimension can be normalized, expected N or "
                f"(N,), got {normalized_shape}"
            )
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        # the unit weight a call without one reads: made at the first call on x's device and
        # dtype, then kept (not a buffer: no state to broadcast, load or leave uninitialised by
        # to_empty; torch.nn.RMSNorm without affine holds none)
        self._unit_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        weight = self.weight
        if weight is None:
            weight = self._unit_weight
            if weight is None or weight.dtype != x.dtype or weight.device != x.device:
                weight = torch.ones(self.normalized_shape, device=x.device, dtype=x.dtype)
                self._unit_weight = weight
        return rmsnorm(x, weight, eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )
