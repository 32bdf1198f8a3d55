"""Today's pass decides exactly what the recorded pass decided (see ``tests.scheduler.replay``)."""

from __future__ import annotations

import json

import pytest

from tests.scheduler.replay import FIXTURE, Case, cases, digest

RECORDED = json.loads(FIXTURE.read_text())


def test_every_case_is_recorded() -> None:
    assert sorted(case.name for case in cases()) == sorted(RECORDED)


@pytest.mark.parametrize("case", list(cases()), ids=lambda case: case.name)
def test_pass_replays_the_recorded_decisions(case: Case) -> None:
    assert digest(case) == RECORDED[case.name]
