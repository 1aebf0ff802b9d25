"""The grouped kernels' claim protocol (gluon_group_exchange.py's docstring) modelled in Python, step
for step as member 0 runs it: chunks claimed from one counter by groups in any interleaving,
each group's chain of chunks read back through its own links. Checks that member 0 never
needs a link it has not written yet (it reads its own links too, so that would hang it), that
every row is taken by exactly one group and every chunk's rows by one group, for the chunk
sizes launch.py picks and others."""

from __future__ import annotations

import random

import pytest

from impls.triton_rmsnorm import launch


def _run(m: int, rows_per_chunk: int, reach: int, groups: int, seed: int) -> dict:
    """Row -> group, the kernels' claims and links replayed with a random interleaving."""
    rng = random.Random(seed)
    chunks = launch.cdiv(m, rows_per_chunk)
    ahead = reach + 3  # AHEAD in the kernels
    first_chunks = launch.cdiv(ahead, rows_per_chunk)
    counter, links, taken, state = 0, {}, {}, {}
    for g in range(groups):  # _first_claims
        first, counter = counter, counter + first_chunks
        start = first * rows_per_chunk if first < chunks else m
        batch_end = min(start + first_chunks * rows_per_chunk, m)
        chain = {p: start + p if start + p < batch_end else m for p in range(reach + 1)}
        state[g] = {"last": first + first_chunks - 1, "covered": first_chunks * rows_per_chunk,
                    "batch_end": batch_end, "chain": chain, "newest": chain[reach], "j": 0}  # fmt: skip
    active = list(range(groups))
    while active:
        g = rng.choice(active)
        s = state[g]
        j = s["j"]
        row = s["chain"][j]
        if row >= m:
            active.remove(g)
            continue
        claiming = s["covered"] < j + ahead and s["last"] < chunks - 1
        if claiming:
            claimed, counter = counter, counter + 1
        if s["covered"] < j + ahead:
            s["covered"] += rows_per_chunk
        newest, batch_end = s["newest"], s["batch_end"]
        if newest + 1 < m and newest + 1 >= batch_end:  # _following_row reads a link
            link = (batch_end - 1) // rows_per_chunk
            assert link in links, f"group {g} at position {j} needs link {link}, not written"
            chunk = links[link]
            newest = chunk * rows_per_chunk if chunk < chunks else m
            batch_end = min((chunk + 1) * rows_per_chunk, m)
        else:
            newest = newest + 1 if newest + 1 < m else m
        assert row not in taken, (row, g, taken[row])
        taken[row] = g
        s["chain"][j + reach + 1], s["newest"], s["batch_end"] = newest, newest, batch_end
        if claiming:  # _link, at the end of the iteration
            assert s["last"] not in links
            links[s["last"]] = claimed
            s["last"] = claimed
        s["j"] += 1
    return taken


@pytest.mark.parametrize("reach", [2, 3])  # the forward's RING (2, 3), the backward's 3
@pytest.mark.parametrize("groups", [1, 3, 33])
@pytest.mark.parametrize("m", [1, 2, 7, 64, 300, 2048])
def test_every_row_is_taken_once_and_no_link_is_read_before_written(reach, groups, m):
    sizes = {1, launch.held_group_row_chunks(m, groups, 132)[0], 5}
    for rows_per_chunk in sorted(sizes):
        for seed in range(3):
            taken = _run(m, rows_per_chunk, reach, groups, seed)
            assert sorted(taken) == list(range(m))
            for start in range(0, m, rows_per_chunk):
                chunk = range(start, min(start + rows_per_chunk, m))
                assert len({taken[r] for r in chunk}) == 1
