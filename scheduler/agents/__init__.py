"""Agent selection: which agent of a resource group gets a session (or one kernel of a multi-node session).

Built-ins: ``concentrated`` (pack), ``dispersed`` (spread) and ``roundrobin`` (explicit per-group state, see
``scheduler.agents.roundrobin``).

Custom selectors are plain callables registered under the Python entry-point group ``caravan.agent_selectors``::

    # pyproject.toml of the plugin package
    [project.entry-points."caravan.agent_selectors"]
    gpu-first = "my_plugin.selectors:gpu_first"

    # my_plugin/selectors.py
    def gpu_first(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
        ...

The interface (``scheduler.agents.base.AgentSelector``): ``request`` is the session (or kernel) with its requested
slots; ``candidates`` are the group's agents that have every requested slot and enough of it now, sorted by id and
never empty; ``config.resource_priority`` is the group's slot order and ``config.options`` the group's
``selector_options``. Return one candidate's id, or None to let the session wait. Selectors must be pure: no I/O, no
state kept between calls, no mutation of the arguments. A returned id that is not a candidate is a bug and raises.

Load plugins once at startup with ``load_plugin_selectors()`` and put the result in
``PassConfig.plugin_selectors``; a pass never touches package metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points

from scheduler.agents import concentrated, dispersed
from scheduler.agents.base import AgentSelector

__all__ = [
    "BUILTIN_SELECTORS",
    "ENTRY_POINT_GROUP",
    "ROUNDROBIN",
    "UnknownSelectorError",
    "load_plugin_selectors",
    "resolve_selector",
]

ENTRY_POINT_GROUP = "caravan.agent_selectors"
ROUNDROBIN = "roundrobin"
BUILTIN_SELECTORS: Mapping[str, AgentSelector] = {"concentrated": concentrated.select, "dispersed": dispersed.select}


class UnknownSelectorError(ValueError):
    def __init__(self, name: str, valid: Iterable[str]) -> None:
        self.name = name
        super().__init__(f"unknown agent selector {name!r}; valid: {', '.join(sorted(valid))}")


def resolve_selector(name: str, plugins: Mapping[str, AgentSelector]) -> AgentSelector | None:
    """The selector callable for ``name``; None for ``roundrobin``, which the pass drives with its explicit state."""
    if name == ROUNDROBIN:
        return None
    if name in BUILTIN_SELECTORS:
        return BUILTIN_SELECTORS[name]
    if name in plugins:
        return plugins[name]
    raise UnknownSelectorError(name, [*BUILTIN_SELECTORS, ROUNDROBIN, *plugins])


def load_plugin_selectors(names: Iterable[str] | None = None) -> dict[str, AgentSelector]:
    """Load custom selectors from the ``caravan.agent_selectors`` entry points (all, or only ``names``).

    Reads installed package metadata: call it at startup, not inside a pass. A requested name that is neither a
    built-in nor installed raises ``UnknownSelectorError`` listing what is available.
    """
    available = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
    wanted = set(available) if names is None else {n for n in names if n != ROUNDROBIN and n not in BUILTIN_SELECTORS}
    missing = wanted - available.keys()
    if missing:
        raise UnknownSelectorError(sorted(missing)[0], [*BUILTIN_SELECTORS, ROUNDROBIN, *available])
    loaded: dict[str, AgentSelector] = {}
    for name in sorted(wanted):
        selector = available[name].load()
        if not callable(selector):
            raise TypeError(f"agent selector entry point {name!r} is not callable: {selector!r}")
        loaded[name] = selector
    return loaded
