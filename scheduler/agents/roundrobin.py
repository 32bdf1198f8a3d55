"""``roundrobin``: agents in id order, starting where the previous placement of the group stopped.

The state (next index per resource group) is explicit: it comes in with the snapshot and goes out with the result,
so a restart or a second scheduler replica continues the rotation. Sizes are ignored except that the agent must fit.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import chain

__all__ = ["select"]


def select(
    agent_count: int, next_index: int, fits: Callable[[int], bool], candidates: Sequence[int] | None = None
) -> tuple[int | None, int]:
    """Scan agents ``next_index, next_index + 1, ...`` cyclically for the first that ``fits``.

    ``candidates``: the sorted agent indexes that could fit at all (the others are skipped without a look; the
    result is the same as scanning every agent). Returns (picked agent index or None, new next index). When nothing
    fits the rotation does not move.
    """
    if agent_count == 0:
        return None, next_index
    start = next_index % agent_count
    if candidates is None:
        candidates = range(agent_count)
    split = bisect_left(candidates, start)
    for position in chain(range(split, len(candidates)), range(split)):
        index = candidates[position]
        if fits(index):
            return index, (index + 1) % agent_count
    return None, start
