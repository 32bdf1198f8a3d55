"""The policy in force: loaded at start, reloaded on change or SIGHUP, a broken file refused (real Redis)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from core.settings import Settings
from domain.idle.config import DEFAULT_CHECK_INTERVAL
from domain.idle.policy_file import PolicyFileError
from idle.reload import BUILT_IN, PolicySource, reload_on_sighup
from tests.idle.running import eventually, policy_file, running_idle

LIFETIME_1H = 'defaults {\n  max_session_lifetime = "1h"\n}\n'
LIFETIME_2H = 'defaults {\n  max_session_lifetime = "2h"\n}\n'
BROKEN = 'defaults {\n  max_session_lifetime = "1h"\n  network_idle_timeout = "soon"\n}\n'
BROKEN_REASON = (
    "defaults.network_idle_timeout: invalid duration 'soon': "
    'use a number with a unit s, m, h or d, such as "90s" or "1h30m"'
)


def lifetime_of(source: PolicySource) -> float | None:
    return source.config.effective(resource_group="default", user_policy=None).max_session_lifetime


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "idle.reload" and r.levelno == logging.ERROR]


def test_without_a_file_nothing_is_reclaimed() -> None:
    source = PolicySource(None)
    policy = source.config.effective(resource_group="default", user_policy=None)
    assert source.published.source == BUILT_IN
    assert policy.check_interval == DEFAULT_CHECK_INTERVAL == 15.0
    assert (policy.max_session_lifetime, policy.network_idle_timeout) == (None, None)
    assert policy.utilization is not None and dict(policy.utilization.thresholds) == {}
    assert source.refresh() is False


def test_a_broken_file_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError) as refused:
        PolicySource(policy_file(tmp_path, BROKEN))
    assert (refused.value.line, refused.value.path) == (3, str(tmp_path / "idle-policy.hcl"))


def test_an_edit_replaces_the_policy(tmp_path: Path) -> None:
    path = policy_file(tmp_path, LIFETIME_1H)
    source = PolicySource(path)
    assert source.refresh() is False  # unchanged
    path.write_text(LIFETIME_2H)
    assert source.refresh() is True
    assert lifetime_of(source) == 7200
    assert source.published.text == LIFETIME_2H


def test_a_broken_edit_is_refused_once_and_the_previous_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = policy_file(tmp_path, LIFETIME_1H)
    source = PolicySource(path)
    path.write_text(BROKEN)
    assert source.refresh() is False
    assert source.refresh() is False  # still broken: not logged again
    assert lifetime_of(source) == 3600 and source.published.text == LIFETIME_1H
    assert refusals(caplog) == [f"idle policy refused, the previous one stays in force: {path}:3: {BROKEN_REASON}"]
    path.write_text(LIFETIME_2H)
    assert source.refresh() is True and lifetime_of(source) == 7200


def test_a_vanished_file_is_refused_and_the_previous_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = policy_file(tmp_path, LIFETIME_1H)
    source = PolicySource(path)
    path.unlink()
    assert source.refresh() is False and source.refresh() is False
    assert lifetime_of(source) == 3600
    [refusal] = refusals(caplog)
    assert f"{path}:-: cannot read the file" in refusal


async def test_sighup_calls_the_reload_hook() -> None:
    heard = asyncio.Event()
    with reload_on_sighup(heard.set):
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(heard.wait(), timeout=30)


async def test_a_reload_request_takes_effect_before_the_next_sweep_is_due(
    redis_settings: Settings, tmp_path: Path
) -> None:
    """With a sweep every hour, only the reload request (SIGHUP's hook) can pick up the edit within seconds."""
    first, second = 'check_interval = "1h"\n' + LIFETIME_1H, 'check_interval = "1h"\n' + LIFETIME_2H
    path = policy_file(tmp_path, first)
    async with running_idle(redis_settings, path) as service:

        async def published(text: str) -> bool:
            found = await service.idle_store.published_policy()
            return found is not None and found[0].text == text

        await eventually(lambda: published(first), timeout=30)
        path.write_text(second)
        assert not await published(second)  # the next sweep is an hour away: only the request can pick it up now
        service.request_reload()
        await eventually(lambda: published(second), timeout=3)
