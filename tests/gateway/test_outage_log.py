"""UNAVAILABLE errors in the log: a few lines per outage and cause, however many errors (the pure log with given times,
then a real Redis outage through a network cut)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from urllib.parse import urlparse

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from core.errors import TransientError, Unavailable
from core.settings import Settings
from gateway.graphql import errors
from gateway.outage_log import OutageLog, OutageReporter, outage_of
from tests.faults import NetworkCut
from tests.harness import GraphQLErrors, running_caravan

WARNING, INFO = logging.WARNING, logging.INFO
ERRORS = 20


def levels_and_starts(lines: list) -> list[tuple[int, str]]:  # type: ignore[type-arg]
    return [(line.level, line.message.split(":")[0]) for line in lines]


def test_the_first_error_of_a_cause_is_logged_then_counts_every_interval_then_its_end() -> None:
    outages = OutageLog(interval=30)
    assert levels_and_starts(outages.answered("Redis", "refused", 0)) == [(WARNING, "answering UNAVAILABLE")]
    for t in range(1, 30):  # 29 more within the interval: silent
        assert outages.answered("Redis", "refused", t) == []
    [count] = outages.answered("Redis", "refused", 30)
    assert (count.level, count.message) == (
        WARNING,
        "still answering UNAVAILABLE: Redis: 30 errors in the last 30 s, 31 since it began 30 s ago",
    )
    assert outages.tick(45) == []  # quiet for 15 s: not over yet
    [end] = outages.tick(60)
    assert (end.level, end.message) == (
        INFO,
        "no more UNAVAILABLE errors for Redis: none for 30 s; 31 in all over 30 s",
    )
    assert not outages.open
    assert levels_and_starts(outages.answered("Redis", "refused", 100)) == [
        (WARNING, "answering UNAVAILABLE")
    ]  # a new one


def test_causes_are_logged_apart() -> None:
    outages = OutageLog(interval=10)
    assert len(outages.answered("Redis", "refused", 0)) == 1
    assert len(outages.answered("Nomad", "timed out", 1)) == 1
    assert outages.answered("Redis", "refused", 2) == [] and outages.answered("Nomad", "timed out", 3) == []
    assert [line.message.split(":")[1].strip() for line in outages.tick(11)] == ["Redis", "Nomad"]  # counts
    assert sorted(line.message for line in outages.tick(13)) == [
        "no more UNAVAILABLE errors for Nomad: none for 10 s; 2 in all over 2 s",
        "no more UNAVAILABLE errors for Redis: none for 11 s; 2 in all over 2 s",
    ]


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:6390"), "Redis"),
        (TransientError("Nomad GET /v1/nodes did not answer within 10 s"), "Nomad"),
        (
            Unavailable("the scheduler configuration cannot be read: /etc/s.hcl: gone"),
            "the scheduler configuration cannot be read",
        ),
        (ConnectionResetError("reset"), "network"),
    ],
)
def test_causes_are_named(error: BaseException, cause: str) -> None:
    assert outage_of(error)[0] == cause


def test_an_unavailable_error_is_named_after_what_failed_beneath_it() -> None:
    wrapped = Unavailable("Redis is unreachable; retry shortly")
    wrapped.__cause__ = RedisConnectionError("Connection refused")
    assert outage_of(wrapped) == ("Redis", "Connection refused")


@pytest.mark.slow  # 20 s: an outage long enough for the 5 s reports
async def test_a_redis_outage_logs_a_few_lines_not_one_per_error(
    redis_settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "REPORTER", OutageReporter(interval=5.0))  # > the time one error takes
    caplog.set_level(logging.INFO, logger="gateway.outage_log")
    async with NetworkCut(urlparse(redis_settings.redis.url).port or 6379) as cut:
        behind_cut = replace(redis_settings, redis=replace(redis_settings.redis, url=f"redis://127.0.0.1:{cut.port}/0"))
        async with running_caravan(behind_cut, scheduler=False) as caravan:
            cut.set_cut(True)
            for _ in range(ERRORS):
                with pytest.raises(GraphQLErrors) as refused:
                    await caravan.gql("{ viewer { id } }")
                assert refused.value.codes == ["UNAVAILABLE"], refused.value.errors
            cut.set_cut(False)
            await caravan.gql("{ viewer { id } }")
            deadline = asyncio.get_running_loop().time() + 15
            while not any("no more UNAVAILABLE errors for Redis" in m for m in caplog.messages):
                assert asyncio.get_running_loop().time() < deadline, caplog.messages
                await asyncio.sleep(0.1)
    lines = [r for r in caplog.records if r.name == "gateway.outage_log"]
    assert lines[0].levelno == WARNING and lines[0].getMessage().startswith("answering UNAVAILABLE: Redis (")
    messages = [r.getMessage() for r in lines]
    assert lines[-1].levelno == INFO and f"{ERRORS} in all" in messages[-1], messages
    assert all(m.startswith("still answering UNAVAILABLE: Redis") for m in messages[1:-1]), messages
    assert len(lines) < ERRORS / 2, messages  # the first, the end, and a count every 5 s
