"""Redis as the stack starts it answers nobody without a password, and a component's user only the commands and keys
Caravan needs (on the tests' session Redis, started by the same code as the dev stack's)."""

from __future__ import annotations

import signal
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from caravan.stack.processes import free_port
from caravan.stack.redis_acl import describe_users
from caravan.stack.redis_server import start_redis
from core.secrets import COMPONENT_ROLES, ROLES, redis_acl_path, redis_password_path
from core.settings import RedisSettings, Settings


def raw_reply(port: int, command: bytes) -> bytes:
    """What Redis answers a client that never authenticated (as ``printf 'PING\\r\\n' | nc`` from a session)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(command)
        return connection.recv(200)


def test_an_unauthenticated_connection_gets_nothing(redis_server: str) -> None:
    port = urlparse(redis_server).port
    assert port
    assert raw_reply(port, b"PING\r\n").startswith(b"-NOAUTH")
    assert raw_reply(port, b"KEYS *\r\n").startswith(b"-NOAUTH")
    assert raw_reply(port, b"GET caravan:user:admin\r\n").startswith(b"-NOAUTH")
    assert raw_reply(port, b"AUTH default \r\n").startswith(b"-WRONGPASS")


async def test_a_wrong_password_is_refused(redis_settings: Settings) -> None:
    client = Redis.from_url(redis_settings.redis.url.replace("admin:", "gateway:"), decode_responses=True)
    with pytest.raises(AuthenticationError):
        await client.ping()
    await client.aclose()


@pytest.fixture(params=COMPONENT_ROLES)
async def as_role(request: pytest.FixtureRequest, redis_settings: Settings) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_settings.for_role(request.param).redis.url, decode_responses=True)
    yield client
    await client.aclose()


DENIED = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "*"),
    ("CONFIG", "SET", "dir", "/tmp"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "evil", "on", ">x", "+@all", "~*"),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("INFO",),
    ("SLOWLOG", "GET"),
    ("SHUTDOWN",),
    ("MONITOR",),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("SELECT", "1"),
    ("RANDOMKEY",),
    ("FUNCTION", "FLUSH"),
    ("SCRIPT", "FLUSH"),
    ("SAVE",),
    ("BGREWRITEAOF",),
    ("REPLICAOF", "127.0.0.1", "1"),
    ("MODULE", "LIST"),
    ("PUBLISH", "ch", "x"),
]


@pytest.mark.parametrize("command", DENIED, ids=lambda c: " ".join(c[:2]))
async def test_a_component_user_cannot_run_admin_or_dangerous_commands(
    as_role: Redis, command: tuple[str, ...]
) -> None:
    with pytest.raises(NoPermissionError):
        await as_role.execute_command(*command)


async def test_a_component_user_reaches_only_keys_under_the_prefix(as_role: Redis, redis_settings: Settings) -> None:
    mine = f"{redis_settings.redis.prefix}:acl-probe"
    await as_role.set(mine, "1")
    assert await as_role.get(mine) == "1"
    assert await as_role.eval("return redis.call('GET', KEYS[1])", 1, mine) == "1"
    for outside in ("caravan:user:admin", "other", "user:admin"):
        with pytest.raises(NoPermissionError):
            await as_role.get(outside)
        with pytest.raises(NoPermissionError):
            await as_role.set(outside, "x")
    with pytest.raises(ResponseError, match="can't access"):  # a script runs with the caller's rights
        await as_role.eval("return redis.call('GET', 'other')", 0)


def test_the_passwords_and_the_acl_file_are_owner_only(redis_settings: Settings) -> None:
    assert stat.S_IMODE(redis_settings.secrets.stat().st_mode) == 0o700
    secrets = redis_settings.secrets
    paths = [redis_password_path(secrets, role) for role in ROLES] + [redis_acl_path(secrets)]
    assert {stat.S_IMODE(path.stat().st_mode) for path in paths} == {0o600}
    acl = redis_acl_path(redis_settings.secrets).read_text()
    for role in ROLES:
        assert redis_password_path(redis_settings.secrets, role).read_text().strip() not in acl  # hashed only
    assert "user default off resetpass " in acl and " nopass" not in acl and ">" not in acl


@pytest.mark.redis  # starts a Redis of its own
async def test_transactions_survive_a_kill_and_restart(tmp_path: Path) -> None:
    """Each component writes in MULTI/EXEC; Redis replays them from its AOF as the ``default`` user, whose rights it
    re-checks at EXEC (redis/redis#14541): with ``default`` at ``-@all`` every transaction was lost on restart."""
    port, secrets = free_port(), tmp_path / "secrets"
    service = start_redis(
        tmp_path / "redis", port, log=tmp_path / "redis.log", secrets_dir=secrets, key_prefixes=("t",)
    )
    settings = Settings(home=tmp_path, redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0", prefix="t"))
    try:
        for role in COMPONENT_ROLES:
            client = Redis.from_url(settings.for_role(role).redis.url, decode_responses=True)
            async with client.pipeline(transaction=True) as pipe:
                await pipe.set(f"t:{role}:a", "1").hset(f"t:{role}:b", "f", "2").execute()
            await client.aclose()
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(10)
        service = start_redis(
            tmp_path / "redis", port, log=tmp_path / "redis.log", secrets_dir=secrets, key_prefixes=("t",)
        )
        admin = Redis.from_url(settings.for_role("admin").redis.url, decode_responses=True)
        for role in COMPONENT_ROLES:
            assert (await admin.get(f"t:{role}:a"), await admin.hget(f"t:{role}:b", "f")) == ("1", "2")
        await admin.aclose()
        assert "CRITICAL" not in (tmp_path / "redis.log").read_text()
    finally:
        service.stop()


def test_the_users_printed_for_operators_have_the_same_rules(redis_settings: Settings) -> None:
    def without_passwords(lines: list[str]) -> list[list[str]]:
        return [
            [word for word in line.split() if not word.startswith("#")] for line in lines if line.startswith("user")
        ]

    applied = redis_acl_path(redis_settings.secrets).read_text().splitlines()
    assert without_passwords(describe_users("t*").splitlines()) == without_passwords(applied)


def test_redis_runs_with_no_credentials_in_its_environment(redis_server: str, secrets_dir: Path) -> None:
    port = urlparse(redis_server).port
    pids = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _serves(p, port)]
    assert pids
    environ = (pids[0] / "environ").read_bytes()
    assert b"CARAVAN_" not in environ
    for role in ROLES:
        assert redis_password_path(secrets_dir, role).read_text().strip().encode() not in environ


def _serves(proc: Path, port: int | None) -> bool:
    try:  # Redis sets its process title to "redis-server 127.0.0.1:<port>"
        return f"127.0.0.1:{port}".encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
