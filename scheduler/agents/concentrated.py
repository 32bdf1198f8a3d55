"""``concentrated`` (pack): fewest unused accelerator kinds, then the LEAST remaining, slot by slot in priority order.

Packing keeps whole agents free for big sessions. This is the reference implementation over ``AgentView``; the pass
uses the equivalent indexed search in ``scheduler.agents.index`` (tests check both agree).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.agents.base import AgentView, SelectionRequest, SelectorConfig
from scheduler.agents.ranking import order_slots, unused_accelerator_kinds

__all__ = ["select"]


def select(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
    return _best(request, candidates, config, direction=1)


def _best(
    request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig, direction: int
) -> str | None:
    """The candidate with the smallest (unused kinds, direction * remaining[k1], ..., id); only agents that fit."""
    slots = order_slots(request.requested, config.resource_priority)
    fitting = [agent for agent in candidates if request.requested.fits_in(agent.remaining)]
    if not fitting:
        return None
    best = min(
        fitting,
        key=lambda agent: (
            unused_accelerator_kinds(agent.capacity, slots),
            *(direction * agent.remaining.amount(slot) for slot in slots),
            agent.id,
        ),
    )
    return best.id
