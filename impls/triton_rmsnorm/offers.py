"""Why each path is or is not offered for a call, in words: the launcher's path lists
(launch.forward_paths, launch.backward_paths) with a reason for every family left out. The
launcher builds its lists with fast predicates and no text (every call that is not replayed
asks); this module asks the same predicates in order and names the first that fails, for
explain.py. tests/test_dispatch_table.py checks that both give the same paths over a grid of
calls and simulated devices.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import backward_launch, common, forward_launch, held_launch, held_paths, launch


class Offer(NamedTuple):
    """A path family for a call: its name, its paths (each configuration of a family is a path
    of its own) and, when none is offered, why."""

    name: str
    paths: tuple
    reason: str | None


def _first_failing(checks) -> str | None:
    for ok, why in checks:
        if not ok():
            return why
    return None


def forward_offers(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                   has_residual: bool) -> list[Offer]:  # fmt: skip
    """Every forward family, the offered ones in launch.forward_paths' order (the default
    first), then those left out with why."""
    if x.dim() == 3:
        two_level = "rows in two levels (a head view) are read by the single tile only"
        return [Offer("single_tile", (forward_launch._forward_single_tile,), None),
                *(Offer(name, (), two_level) for name in ("split", "looped", "held_row",
                                                          "held_group"))]  # fmt: skip
    m, n = x.shape
    looped = forward_launch.forward_is_looped(n)
    split_ok = looped and common.rows_are_split(m, x.device)
    offers = [
        Offer("single_tile", (forward_launch._forward_single_tile,), None if not looped else
              f"N > {forward_launch.SINGLE_TILE_MAX_N} (SINGLE_TILE_MAX_N)"),
        Offer("split", (forward_launch._forward_split,), None if split_ok else
              (f"N <= {forward_launch.SINGLE_TILE_MAX_N}: the single tile takes it" if not looped
               else f"M >= the SM count ({common._programs_cap(x.device)}): rows are not split")),
        Offer("looped", (forward_launch._forward_looped,), None if n > launch.FORWARD_LOOPED_FROM_N
              else f"N <= {launch.FORWARD_LOOPED_FROM_N} (FORWARD_LOOPED_FROM_N)"),
    ]  # fmt: skip
    held_row = _first_failing([
        (lambda: forward_launch.SINGLE_TILE_MAX_N < n <= held_paths.HELD_ROW_MAX_N,
         f"N outside ({forward_launch.SINGLE_TILE_MAX_N}, {held_paths.HELD_ROW_MAX_N}]"),
        *held_paths.held_forward_staging(x, y, has_residual),
        (lambda: held_paths._held_row_fits_device(x.device, n),
         "needs a Hopper-class GPU with the row's shared memory"),
    ])  # fmt: skip
    offers.append(Offer("held_row", (held_launch._forward_held_row,) if held_row is None else (),
                        held_row))  # fmt: skip
    groups = held_paths.held_group_forwards(x, y, weight, has_residual)
    group_why = None if groups else _first_failing([
        (lambda: n > forward_launch.SINGLE_TILE_MAX_N, f"N <= {forward_launch.SINGLE_TILE_MAX_N}"),
        *held_paths.held_forward_staging(x, y, has_residual),
        (lambda: weight.dtype in (torch.float16, torch.bfloat16) and weight.data_ptr() % 16 == 0,
         "a 16-bit w on 16 bytes only"),
    ]) or "no configuration fits this GPU (a Hopper-class one, a program slot a slice)"  # fmt: skip
    offers.append(Offer("held_group", tuple(map(held_launch._held_group_forward_path, groups)),
                        group_why))  # fmt: skip
    return _ordered(offers)


def backward_offers(x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor,
                    dh_out: torch.Tensor | None) -> list[Offer]:  # fmt: skip
    """Every backward family, as forward_offers."""
    n = x.shape[-1]
    looped = backward_launch.backward_is_looped(n)
    cap = backward_launch.BACKWARD_SINGLE_TILE_MAX_N
    if x.dim() == 3:
        two_level = "rows in two levels (a head view) are read by the single tile only"
        return [Offer("single_tile", (backward_launch._backward_single_tile,), None),
                *(Offer(name, (), two_level) for name in ("two_role", "wide", "held_row",
                                                          "held_group"))]  # fmt: skip
    two_role = None if backward_launch.backward_takes_two_roles(x, dy, dh_out) else (
        f"N > {cap}: the single tile does not take it" if looped else _two_role_why(x, dy, dh_out)
        or "not offered (backward_launch.backward_takes_two_roles)")  # fmt: skip
    gluon = (
        lambda: held_paths.gluon_kernels is not None and common._inline_ptx_runs(),
        "needs an NVIDIA GPU and a Triton with Gluon (not the interpreter)",
    )
    stages = (
        lambda: held_paths._held_backward_can_stage(x, dy, weight, dh_out),
        "the tensors do not suit it (16-bit x, dy, w; N a multiple of 16; 16-byte rows)",
    )
    held_row = None if held_paths.backward_holds_row_on_chip(x, dy, weight, dh_out) else (
        _first_failing([
            (lambda: cap < n <= held_paths.HELD_BACKWARD_MAX_N,
             f"N = {n} outside ({cap}, {held_paths.HELD_BACKWARD_MAX_N}]"),
            gluon,
            stages,
            (lambda: held_paths._held_row_backward_fits_device(x.device, n),
             "needs a Hopper-class NVIDIA GPU with the shared memory of its ring"),
        ]) or "not offered (held_paths.backward_holds_row_on_chip)")  # fmt: skip
    groups = held_paths.held_group_backwards(x, dy, weight, dh_out)
    offers = [
        Offer("single_tile", (backward_launch._backward_single_tile,),
              None if not looped else f"N > {cap} (BACKWARD_SINGLE_TILE_MAX_N)"),
        Offer("two_role", (backward_launch._backward_two_role,) if two_role is None else (),
              two_role),
        Offer("wide", (backward_launch._backward_wide,), None if looped else f"N <= {cap}"),
        Offer("held_row", held_launch._HELD_ROW_BACKWARDS if held_row is None else (), held_row),
        Offer("held_group", tuple(map(held_launch._held_group_backward_path, groups)),
              None if groups else _first_failing([
                  (lambda: n > cap, f"N = {n} <= {cap}"), gluon, stages])
              or "no configuration fits (a Hopper-class GPU; at the held row's widths, rows "
              "that fill the slices whole)"),
    ]  # fmt: skip
    return _ordered(offers)


def _two_role_why(x: torch.Tensor, dy: torch.Tensor, dh_out: torch.Tensor | None) -> str | None:
    """The first of backward_launch.backward_takes_two_roles' conditions this call fails, with
    its numbers."""
    m, n = x.shape
    low, high = backward_launch.TWO_ROLE_MIN_N, backward_launch.TWO_ROLE_MAX_N
    cap = backward_launch.TWO_ROLE_MAX_ELEMENTS
    x_and_dy = m * n * (x.element_size() + dy.element_size())
    return _first_failing([
        (lambda: low <= n <= high, f"N = {n} outside {low}-{high} (TWO_ROLE_MIN_N, TWO_ROLE_MAX_N)"),
        (lambda: m * n <= cap, f"M x N = {m * n} elements > {cap} (TWO_ROLE_MAX_ELEMENTS)"),
        (lambda: backward_launch.backward_row_period(x, dy, dh_out) == 1,
         "rows not on 16 bytes (the shifted single tile serves them)"),
        (lambda: backward_launch._two_role_fits_device(x.device, x_and_dy),
         f"x and dy ({x_and_dy / 2**20:.0f} MiB) not within half of this GPU's L2 "
         f"({common._l2_bytes(x.device) / 2**20:.0f} MiB; none under the interpreter)"),
    ])  # fmt: skip


def _ordered(offers: list[Offer]) -> list[Offer]:
    """The offered families first, in their order, then the others (with no paths)."""
    return [o for o in offers if o.reason is None] + [
        o._replace(paths=()) for o in offers if o.reason is not None
    ]


def offered_paths(offers: list[Offer]) -> list:
    return [path for offer in offers if offer.reason is None for path in offer.paths]
