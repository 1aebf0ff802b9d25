"""The bandwidth ceiling, measured in the same run: a copy moves what a perfect RMSNorm moves.

- card ceiling: a large (2 GiB) device-to-device copy, bytes read + written, best of
  torch's copy_ and a plain Triton copy kernel, timed host-inclusive with do_bench (a captured
  copy_ would become a memcpy node, which runs slower than kernels do).
- shape floor: the same Triton copy kernel over the shape's bytes (read x once, write once),
  timed with both timers; what a fused forward could at best reach at that shape.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _copy_kernel(SRC, DST, numel, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < numel
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=mask), mask=mask)


_COPY_BLOCK = 4096


def triton_copy(src, dst) -> None:
    """dst[:] = src[:] for contiguous tensors of the same numel, one read and one write."""
    numel = src.numel()
    _copy_kernel[(triton.cdiv(numel, _COPY_BLOCK),)](
        src, dst, numel, BLOCK=_COPY_BLOCK, num_warps=8
    )


def card_ceiling_gbps(nbytes: int = 2 << 30) -> dict:
    """Copy bandwidth of the card (GB/s, read + write counted), two ways; the best is the ceiling."""
    import torch

    from harness.timing import time_host
    from harness.traffic import gbps

    src = torch.empty(nbytes // 2, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    torch_copy = time_host(lambda: dst.copy_(src))
    kernel_copy = time_host(lambda: triton_copy(src, dst))
    assert torch.equal(src, dst), "the copy kernel did not copy"
    moved = 2 * nbytes
    result = {
        "bytes_copied": nbytes,
        "torch_copy_gbps": gbps(moved, torch_copy.ms),
        "triton_copy_gbps": gbps(moved, kernel_copy.ms),
    }
    result["ceiling_gbps"] = max(result["torch_copy_gbps"], result["triton_copy_gbps"])
    return result
