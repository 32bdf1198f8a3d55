"""The agent-selector interface: what a selector sees and what it returns.

A selector is a pure callable::

    def select(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None

``candidates`` are the schedulable agents of the request's resource group that have every slot the request asks for
and enough of it *right now* (sorted by id; never empty when a selector is called). The selector returns the id of
one of them, or None to decline (the session then waits as if nothing fitted). It must not do I/O, keep state between
calls or mutate its arguments: the pass calls it once per placement attempt, with the state after earlier placements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from domain.slots import ResourceSlots

__all__ = ["AgentSelector", "AgentView", "SelectionRequest", "SelectorConfig"]


@dataclass(frozen=True)
class AgentView:
    id: str
    capacity: ResourceSlots
    remaining: ResourceSlots
    """Capacity minus everything occupied, placed earlier in this pass, or held for another session's reservation."""


@dataclass(frozen=True)
class SelectionRequest:
    session_id: str
    user: str
    kernel_role: str
    """``main1`` (or the whole session, single-node), ``sub1``, ... for multi-node kernels."""
    requested: ResourceSlots


@dataclass(frozen=True)
class SelectorConfig:
    resource_priority: tuple[str, ...]
    options: Mapping[str, object] = field(default_factory=dict)


class AgentSelector(Protocol):
    def __call__(
        self, request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig
    ) -> str | None: ...
