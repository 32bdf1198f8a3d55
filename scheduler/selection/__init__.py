"""Session selection: in which order the pending sessions of a resource group are attempted.

``STRATEGIES`` maps a configured name to an ordering function (``scheduler.selection.base.SessionOrder``);
``get_strategy`` fails on an unknown name with the list of valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.selection import drf, fifo, lifo
from scheduler.selection.base import SessionOrder

__all__ = ["STRATEGIES", "UnknownStrategyError", "get_strategy"]

STRATEGIES: Mapping[str, SessionOrder] = {"fifo": fifo.order, "lifo": lifo.order, "drf": drf.order}


class UnknownStrategyError(ValueError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown session selection strategy {name!r}; valid: {', '.join(sorted(STRATEGIES))}")


def get_strategy(name: str) -> SessionOrder:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UnknownStrategyError(name) from None
