"""Settings read from the environment: a removed variable stops the start instead of being silently ignored."""

from __future__ import annotations

import pytest

from core.settings import load_settings


def test_the_raw_exec_opt_in_for_users_is_refused_loudly() -> None:
    with pytest.raises(ValueError, match="CARAVAN_ALLOW_RAW_EXEC_FOR_USERS was removed: .*SUPERADMIN"):
        load_settings({"CARAVAN_ALLOW_RAW_EXEC_FOR_USERS": "1"})
    assert load_settings({"CARAVAN_ALLOW_RAW_EXEC_FOR_USERS": ""}).home.name == ".caravan"


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_redis_idle_timeout_that_is_not_a_positive_number_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="CARAVAN_REDIS_IDLE_TIMEOUT must be a number of seconds > 0"):
        load_settings({"CARAVAN_REDIS_IDLE_TIMEOUT": value})
    assert load_settings({"CARAVAN_REDIS_IDLE_TIMEOUT": "2.5"}).redis.idle_timeout == 2.5
    assert load_settings({}).redis.idle_timeout == 30.0


def test_trusted_proxies_are_none_unless_listed_and_must_be_addresses() -> None:
    assert load_settings({}).gateway.trusted_proxies == ()
    listed = load_settings({"CARAVAN_TRUSTED_PROXIES": " 10.0.0.5, 10.1.0.0/16,::1 ,"}).gateway.trusted_proxies
    assert listed == ("10.0.0.5", "10.1.0.0/16", "::1")
    for value in ("*", "ingress.local", "10.0.0.0/99"):
        with pytest.raises(ValueError, match="CARAVAN_TRUSTED_PROXIES must list IP addresses or networks"):
            load_settings({"CARAVAN_TRUSTED_PROXIES": value})
