"""``roundrobin``: agents in id order, starting where the previous placement of the group stopped.

The state (next index per resource group) is explicit: it comes in with the snapshot and goes out with the result,
so a restart or a second scheduler replica continues the rotation. Sizes are ignored except that the agent must fit.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["select"]


def select(agent_count: int, next_index: int, fits: Callable[[int], bool]) -> tuple[int | None, int]:
    """Scan agents ``next_index, next_index + 1, ...`` cyclically for the first that ``fits``.

    Returns (picked agent index or None, new next index). When nothing fits the rotation does not move.
    """
    if agent_count == 0:
        return None, next_index
    start = next_index % agent_count
    for step in range(agent_count):
        index = (start + step) % agent_count
        if fits(index):
            return index, (index + 1) % agent_count
    return None, start
