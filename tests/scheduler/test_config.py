"""What only the scheduler checks of the scheduling configuration: strategy and selector names, with their line."""

from __future__ import annotations

import pytest

from domain.scheduling_config import SchedulingConfigError, parse_scheduling_config
from scheduler.config import pass_config


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            'default {\n  session_strategy = "sjf"\n}',
            2,
            "default.session_strategy: unknown strategy 'sjf' (valid: drf, fifo, lifo)",
        ),
        (
            'resource_group "a" {\n  agent_selector = "best"\n}',
            2,
            "resource_group.a.agent_selector: unknown agent selector 'best'; "
            "valid: concentrated, dispersed, roundrobin",
        ),
    ],
)
def test_an_unknown_strategy_or_selector_is_refused_with_its_line(text: str, line: int, reason: str) -> None:
    config = parse_scheduling_config(text, "scheduler.hcl")  # the gateway reads it as it is
    with pytest.raises(SchedulingConfigError) as refused:
        pass_config(config)
    assert refused.value.line == line and reason in refused.value.reason
    assert str(refused.value).startswith(f"scheduler.hcl:{line}: ")


def test_the_pass_gets_each_groups_configuration() -> None:
    config = parse_scheduling_config(
        'default {\n  session_strategy = "drf"\n}\nresource_group "gpu" {\n  agent_selector = "concentrated"\n}',
        "s.hcl",
    )
    core = pass_config(config)
    assert core.for_group("gpu").agent_selector == "concentrated"
    assert core.for_group("gpu").session_strategy == core.for_group("other").session_strategy == "drf"
