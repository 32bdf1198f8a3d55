"""``dispersed`` (spread): fewest unused accelerator kinds, then the MOST remaining, slot by slot in priority order.

Spreading lowers contention between sessions on one node. Reference implementation; the pass uses
``scheduler.agents.index``.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.agents.base import AgentView, SelectionRequest, SelectorConfig
from scheduler.agents.concentrated import _best

__all__ = ["select"]


def select(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
    return _best(request, candidates, config, direction=-1)
