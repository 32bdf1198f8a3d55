"""Settings read from the environment: a removed variable stops the start instead of being silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.secrets import redis_sentinel_client_path, write_secret
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


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_scheduler_lease_ttl_that_is_not_a_positive_number_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="CARAVAN_SCHEDULER_LEASE_TTL must be a number of seconds > 0"):
        load_settings({"CARAVAN_SCHEDULER_LEASE_TTL": value})
    assert load_settings({"CARAVAN_SCHEDULER_LEASE_TTL": "4"}).scheduler.lease_ttl == 4.0
    assert load_settings({}).scheduler.lease_ttl == 10.0


@pytest.mark.parametrize(
    ("value", "refusal"),
    [("0", "a number of seconds > 0"), ("soon", "a number of seconds > 0"), ("901", "at most 900 seconds")],
)
def test_a_restart_delay_is_seconds_that_two_restarts_fit_in_thirty_minutes(value: str, refusal: str) -> None:
    with pytest.raises(ValueError, match=f"CARAVAN_NOMAD_RESTART_DELAY must be {refusal}"):
        load_settings({"CARAVAN_NOMAD_RESTART_DELAY": value})
    assert load_settings({"CARAVAN_NOMAD_RESTART_DELAY": "900"}).nomad.restart_delay == 900.0
    assert load_settings({}).nomad.restart_delay == 15.0


def test_trusted_proxies_are_none_unless_listed_and_must_be_addresses() -> None:
    assert load_settings({}).gateway.trusted_proxies == ()
    listed = load_settings({"CARAVAN_TRUSTED_PROXIES": " 10.0.0.5, 10.1.0.0/16,::1 ,"}).gateway.trusted_proxies
    assert listed == ("10.0.0.5", "10.1.0.0/16", "::1")
    for value in ("*", "ingress.local", "10.0.0.0/99"):
        with pytest.raises(ValueError, match="CARAVAN_TRUSTED_PROXIES must list IP addresses or networks"):
            load_settings({"CARAVAN_TRUSTED_PROXIES": value})


def test_sentinels_are_host_port_pairs_and_turn_on_waiting_for_a_replica(tmp_path: Path) -> None:
    plain = load_settings({}).redis
    assert (plain.sentinels, plain.wait_replicas) == ((), 0)
    redis = load_settings(
        {"CARAVAN_REDIS_SENTINELS": "127.0.0.1:26379, [::1]:26380", "CARAVAN_REDIS_SENTINEL_MASTER": "m"}
    ).redis
    assert redis.sentinels == (("127.0.0.1", 26379), ("::1", 26380))
    assert (redis.sentinel_master, redis.wait_replicas, redis.wait_timeout) == ("m", 1, 1.0)
    assert (
        load_settings({"CARAVAN_REDIS_SENTINELS": "h:1", "CARAVAN_REDIS_WAIT_REPLICAS": "2"}).redis.wait_replicas == 2
    )
    for value in ("h", "h:port", ":26379", "h:70000"):
        with pytest.raises(ValueError, match="CARAVAN_REDIS_SENTINELS must list host:port pairs"):
            load_settings({"CARAVAN_REDIS_SENTINELS": value})
    with pytest.raises(ValueError, match="CARAVAN_REDIS_WAIT_REPLICAS must be a whole number"):
        load_settings({"CARAVAN_REDIS_WAIT_REPLICAS": "all"})


def test_a_role_asks_the_sentinels_with_the_client_password_from_the_secrets_directory(tmp_path: Path) -> None:
    write_secret(redis_sentinel_client_path(tmp_path), "s3cret")
    environ = {"CARAVAN_SECRETS_DIR": str(tmp_path), "CARAVAN_REDIS_SENTINELS": "127.0.0.1:26379"}
    redis = load_settings(environ).for_role("gateway").redis
    assert (redis.sentinel_username, redis.sentinel_password) == ("caravan", "s3cret")
    given = load_settings({**environ, "CARAVAN_REDIS_SENTINEL_PASSWORD": "mine"}).for_role("gateway").redis
    assert given.sentinel_password == "mine"
    assert load_settings({"CARAVAN_SECRETS_DIR": str(tmp_path)}).for_role("gateway").redis.sentinel_password is None
