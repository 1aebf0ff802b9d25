"""The dw reduction (launch._reduce_partials: the backward's [programs, N] fp32 partials summed
over programs) at any number of partial rows and any width: every column written, each within
the bound of an fp32 sum in any order of the exact sum. Both of launch.dw_reduce_tile's tiles
run: over few rows (the grouped backwards') and over many (one partial row a program)."""

from __future__ import annotations

import pytest
import torch

from impls.triton_rmsnorm import launch
from tests.conftest import DEVICE

ROWS = [1, 2, 5, 16, 17, 132]
WIDTHS = [7, 1000, 4133]


def _assert_within_an_fp32_sum_of_the_exact(dw, partial):
    """Every column written, each within rows x 2^-24 x sum |partials| of the exact sum: the
    bound of an fp32 sum in any order."""
    exact = partial.double().sum(0)
    bound = partial.shape[0] * 2.0**-24 * partial.double().abs().sum(0)
    error = (dw.double() - exact).abs()
    assert not dw.isnan().any(), "columns left unwritten"
    assert (error <= bound).all(), f"worst error {float((error / bound).max()):.2f} of the bound"


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", WIDTHS)
def test_dw_reduction_sums_every_column(rows, n):
    generator = torch.Generator().manual_seed(rows * 7919 + n)
    partial = torch.randn(rows, n, generator=generator).to(DEVICE)
    dw = torch.full((n,), float("nan"), device=DEVICE)
    launch._reduce_partials(partial, dw)
    _assert_within_an_fp32_sum_of_the_exact(dw, partial)


@pytest.mark.parametrize("rows", [1, 2, 16, 17, 132])
def test_dw_reduction_tile_fits_the_kernel(pretend_device, monkeypatch, rows):
    """On an H200's 132 SMs: few rows get a wide tile that still leaves every SM a program (up to
    DW_REDUCE_MAX_BLOCK_N columns), many rows the 32-column one; every tile a power of two."""
    pretend_device(sm_count=132)
    for n in (4096, 131072, 1 << 20):
        block_rows, block_n, warps = launch.dw_reduce_tile(rows, n, torch.device("cpu"))
        assert block_rows >= rows and block_rows & (block_rows - 1) == 0
        assert block_n & (block_n - 1) == 0 and warps in (4, 8)
        if rows > launch.DW_REDUCE_FEW_ROWS:
            assert block_n == launch.DW_REDUCE_BLOCK_N
        else:
            assert block_rows * block_n <= launch.DW_REDUCE_FEW_ROWS_TILE
            assert launch.DW_REDUCE_BLOCK_N <= block_n <= launch.DW_REDUCE_MAX_BLOCK_N
            assert launch.cdiv(n, block_n) >= min(132, launch.cdiv(n, launch.DW_REDUCE_BLOCK_N))
    assert launch.dw_reduce_tile(2, 1 << 20, torch.device("cpu"))[1] == 1024  # was 32


def test_dw_reduction_over_more_rows_than_one_tile_holds_and_repeats_its_bits():
    """300 partial rows: more than DW_REDUCE_MAX_ROWS, so the kernel's row loop takes two steps;
    a second call gives the same bits (a fixed order)."""
    rows, n = launch.DW_REDUCE_MAX_ROWS + 44, 333
    generator = torch.Generator().manual_seed(300)
    partial = torch.randn(rows, n, generator=generator).to(DEVICE)
    first = torch.full((n,), float("nan"), device=DEVICE)
    again = torch.full((n,), float("nan"), device=DEVICE)
    launch._reduce_partials(partial, first)
    launch._reduce_partials(partial, again)
    _assert_within_an_fp32_sum_of_the_exact(first, partial)
    assert torch.equal(first, again)


@pytest.mark.parametrize("per_sm", [1, 6])
def test_group_counts_cover_every_row_once(pretend_device, monkeypatch, per_sm):
    """launch._group_count (the grouped forward's groups, which take rows g, g + G, ...) and
    launch._row_groups (the grouped backward's contiguous chunks): at least one group and at
    most m, within the program slots, every row in exactly one group, no group without rows."""
    pretend_device(sm_count=132)
    device = torch.device("cpu")
    for m in (1, 2, 5, 23, 24, 25, 64, 300, 513):
        for group in (1, 4, 32, 64, 256):
            groups = launch._group_count(m, group, device, per_sm)
            assert 1 <= groups <= m
            if group <= per_sm * 132:
                assert groups * group <= per_sm * 132
            dealt = sorted(row for g in range(groups) for row in range(g, m, groups))
            assert dealt == list(range(m))
            chunks, rows_per_group = launch._row_groups(m, group, device, per_sm)
            assert 1 <= chunks <= groups and (chunks - 1) * rows_per_group < m
            assert chunks * rows_per_group >= m
