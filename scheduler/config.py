"""The scheduler's own reading of the scheduling configuration: each group's strategy and agent selector resolved.

The file is read by ``domain.scheduling_config`` (the gateway reads the same file for what it checks at creation);
what only the scheduler knows is checked here, at startup, with the same ``file:line: key: reason``: the session
strategies (``scheduler.selection``) and agent selectors (``scheduler.agents``, plugins loaded once, now).
"""

from __future__ import annotations

from domain.scheduling_config import SchedulingConfig, SchedulingConfigError
from scheduler.agents import BUILTIN_SELECTORS, ROUNDROBIN, UnknownSelectorError, load_plugin_selectors
from scheduler.pass_model import PassConfig
from scheduler.scheduling_pass import validate_config
from scheduler.selection import STRATEGIES

__all__ = ["SchedulingConfigError", "pass_config"]


def pass_config(config: SchedulingConfig) -> PassConfig:
    """The pure pass's configuration of ``config``; :class:`SchedulingConfigError` for a strategy or selector nobody
    provides."""
    wanted: dict[str, tuple[str, ...]] = {}
    for where, group in config.group_sites():
        if group.session_strategy not in STRATEGIES:
            raise config.refuse(
                (*where, "session_strategy"),
                f"unknown strategy {group.session_strategy!r} (valid: {', '.join(sorted(STRATEGIES))})",
            )
        if group.agent_selector not in BUILTIN_SELECTORS and group.agent_selector != ROUNDROBIN:
            wanted.setdefault(group.agent_selector, where)
    try:
        plugins = load_plugin_selectors(wanted)
    except UnknownSelectorError as exc:
        raise config.refuse((*wanted.get(exc.name, ()), "agent_selector"), str(exc)) from None
    core = PassConfig(default=config.default_group, groups=config.groups, plugin_selectors=plugins)
    validate_config(core)
    return core
