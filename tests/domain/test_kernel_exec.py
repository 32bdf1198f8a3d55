"""The pure rules of commands in kernels (domain/kernel_exec.py) and their settings."""

from __future__ import annotations

import pytest

from domain.kernel_exec import ActivityClock, CappedOutput, ExecLimits, TooManyExecs
from gateway.kernel_exec import ExecSlots, exec_limits_from_env


def test_output_past_the_cap_is_counted_and_flagged() -> None:
    out = CappedOutput.of(5)
    out.add(b"abc")
    assert not out.truncated
    out.add(b"defg")
    out.add(b"h")
    assert (bytes(out.data), out.dropped, out.truncated) == (b"abcde", 3, True)


def test_traffic_is_recorded_at_most_once_per_interval() -> None:
    clock = ActivityClock(10.0)
    assert [clock.due(t) for t in (0.0, 1.0, 9.9, 10.0, 15.0, 20.5)] == [True, False, False, True, False, True]


def test_limits_come_from_the_environment_and_are_checked() -> None:
    limits = exec_limits_from_env({"CARAVAN_EXEC_MAX_TIMEOUT": "60", "CARAVAN_EXEC_MAX_USER_EXECS": "2"})
    assert (limits.max_timeout, limits.max_user_execs, limits.default_timeout) == (60.0, 2, 30.0)
    with pytest.raises(ValueError, match="CARAVAN_EXEC_DEFAULT_TIMEOUT"):
        exec_limits_from_env({"CARAVAN_EXEC_MAX_TIMEOUT": "10"})
    with pytest.raises(ValueError, match="CARAVAN_EXEC_MAX_USER_EXECS must be a number"):
        exec_limits_from_env({"CARAVAN_EXEC_MAX_USER_EXECS": "many"})
    with pytest.raises(ValueError, match="positive"):
        ExecLimits(max_connection_execs=0)


def test_execs_beyond_a_users_or_a_connections_cap_are_refused() -> None:
    slots = ExecSlots(ExecLimits(max_user_execs=3, max_connection_execs=2))
    first, second = slots.connection(), slots.connection()
    with slots.claimed("u", first), slots.claimed("u", first):
        with pytest.raises(TooManyExecs) as per_connection, slots.claimed("u", first):
            pass
        assert per_connection.value.details == {"limit": 2, "per": "connection"}
        with slots.claimed("u", second):
            with pytest.raises(TooManyExecs) as per_user, slots.claimed("u"):  # a terminal: no connection of its own
                pass
            assert per_user.value.details == {"limit": 3, "per": "user"}
            with slots.claimed("another user"):
                pass
    with slots.claimed("u", first), slots.claimed("u", first):  # all places free again
        pass
