"""A Redis that survives its primary: a primary, replicas and three Sentinels on loopback, users on every one of them.

- Data nodes (:func:`caravan.stack.redis_server.start_redis`: AOF with ``appendfsync always``, ``default`` off) have
  Caravan's users plus two: ``replication`` (a replica authenticating to its primary: ``PSYNC``, ``REPLCONF``,
  ``PING`` only) and ``sentinel`` (what Redis' documentation lists for a Sentinel: ``INFO``, ``ROLE``, ``CONFIG
  REWRITE``, ``SLAVEOF``, ``CLIENT KILL``, Pub/Sub on its hello channel, ...). Every node is started as a possible
  primary: ``masteruser``/``masterauth`` (for when it is made a replica) and ``min-replicas-to-write 1`` with
  ``min-replicas-max-lag`` seconds: a primary cut off from every replica refuses writes (``NOREPLICAS``) after that.
- Sentinels (``redis-server <file> --sentinel``, the binary Debian's ``redis-sentinel`` runs) have users of their own:
  ``default`` off, ``sentinel`` (the Sentinels talking to each other) and ``caravan``, which may only ask where the
  primary is (``SENTINEL MASTERS``/``GET-MASTER-ADDR-BY-NAME``/...): Caravan's processes use it.
- Passwords: ``redis-replication.password``, ``redis-sentinel.password`` and ``redis-sentinel-client.password`` in the
  secrets directory, generated once (the Sentinels' own config file, which they rewrite, holds the ``sentinel`` one
  in clear for their ``auth-pass``: it is 0600 in a 0700 directory).

Timers: ``down_after_ms`` without an answer and a quorum of two Sentinels make the primary down; a failover is retried
after ``failover_timeout_ms``. The tests use 1,000 ms; Sentinel's own defaults are 30 s and 3 min.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from caravan.stack.nomad_agent import CLEAN_ENV
from caravan.stack.processes import Service, StartupFailed, free_port, spawn, wait_until
from caravan.stack.redis_acl import hashed_password
from caravan.stack.redis_server import start_redis
from core.secrets import (
    ensure_secret,
    ensure_secrets_dir,
    read_secret,
    redis_password_path,
    redis_sentinel_client_path,
    write_private,
)

MASTER_NAME = "caravan"
REPLICATION_USER = "replication"
SENTINEL_USER = "sentinel"
SENTINEL_CLIENT_USER = "caravan"
REPLICATION_RULES = "resetchannels -@all +psync +replconf +ping"
SENTINEL_RULES = (
    "allchannels -@all +multi +slaveof +replicaof +ping +exec +subscribe +config|rewrite +role +publish +info "
    "+client|setname +client|kill +script|kill"
)
"""A Sentinel's rights on a data node, as Redis' Sentinel documentation lists them ("Redis access control list")."""
SENTINEL_CLIENT_RULES = (
    "resetchannels -@all +ping +hello +auth +client|setname +sentinel|masters +sentinel|master "
    "+sentinel|get-master-addr-by-name +sentinel|sentinels +sentinel|replicas +sentinel|slaves"
)
"""What Caravan's processes may ask a Sentinel: where the primary is, nothing that changes anything."""


def _password(secrets_dir: Path, name: str) -> Path:
    return secrets_dir / f"redis-{name}.password"


def _sync_client(port: int, username: str, password: str | None) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, username=username, password=password, socket_timeout=2, decode_responses=True
    )


@dataclass
class RedisNode:
    service: Service
    port: int

    def kill(self) -> None:
        """kill -9: the process dies at once, without writing anything more."""
        os.kill(self.service.pid, signal.SIGKILL)
        self.service.process.wait(10)


@dataclass
class SentinelGroup:
    """The data nodes (the first one started as primary) and the Sentinels."""

    nodes: list[RedisNode]
    sentinels: list[RedisNode]
    master_name: str
    secrets_dir: Path

    @property
    def sentinel_addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(("127.0.0.1", s.port) for s in self.sentinels)

    def admin(self, port: int) -> redis.Redis:
        """A synchronous admin client to the data node on ``port``."""
        return _sync_client(port, "admin", read_secret(redis_password_path(self.secrets_dir, "admin")))

    def sentinel_client(self, port: int) -> redis.Redis:
        """A synchronous client to the Sentinel on ``port``, as Caravan's processes ask it."""
        return _sync_client(port, SENTINEL_CLIENT_USER, read_secret(redis_sentinel_client_path(self.secrets_dir)))

    def sentinel_admin(self, port: int) -> redis.Redis:
        """A synchronous client to the Sentinel on ``port`` as the Sentinels' own user (every command)."""
        return _sync_client(port, SENTINEL_USER, read_secret(_password(self.secrets_dir, SENTINEL_USER)))

    def primary_port(self) -> int | None:
        """The primary's port as the first Sentinel that answers names it (None if none answers)."""
        for sentinel in self.sentinels:
            try:
                with self.sentinel_client(sentinel.port) as client:
                    address = client.sentinel_get_master_addr_by_name(self.master_name)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        return None

    def node(self, port: int) -> RedisNode:
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            node.service.stop()


def data_node_users(secrets_dir: Path) -> list[str]:
    """The ACL lines a data node has besides Caravan's users: the replicas' user and the Sentinels'."""
    replication = hashed_password(_password(secrets_dir, REPLICATION_USER))
    sentinel = hashed_password(_password(secrets_dir, SENTINEL_USER))
    return [
        f"user {REPLICATION_USER} on {replication} resetkeys {REPLICATION_RULES}",
        f"user {SENTINEL_USER} on {sentinel} resetkeys {SENTINEL_RULES}",
    ]


def start_sentinel_group(
    state_dir: Path,
    *,
    secrets_dir: Path,
    key_prefixes: Sequence[str] = ("caravan",),
    replicas: int = 2,
    sentinels: int = 3,
    master_name: str = MASTER_NAME,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 2000,
    min_replicas_max_lag: int = 2,
) -> SentinelGroup:
    """Start a primary, ``replicas`` replicas and ``sentinels`` Sentinels on free loopback ports under ``state_dir``;
    returns once every replica is in sync and every Sentinel sees all the others and every replica."""
    ensure_secrets_dir(secrets_dir)
    users = data_node_users(secrets_dir)
    replication_password = ensure_secret(_password(secrets_dir, REPLICATION_USER))
    node_args = [
        "--masteruser",
        REPLICATION_USER,
        "--masterauth",
        replication_password,
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        str(min_replicas_max_lag),
        "--repl-diskless-sync-delay",
        "0",
    ]
    group = SentinelGroup(nodes=[], sentinels=[], master_name=master_name, secrets_dir=secrets_dir)
    try:
        for index in range(1 + replicas):
            port = free_port()
            follow = ["--replicaof", "127.0.0.1", str(group.nodes[0].port)] if index else []
            service = start_redis(
                state_dir / f"redis-{index}",
                port,
                log=state_dir / f"redis-{index}.log",
                secrets_dir=secrets_dir,
                key_prefixes=key_prefixes,
                extra_users=users,
                extra_args=[*node_args, *follow],
                name=f"redis-{index}",
            )
            group.nodes.append(RedisNode(service, port))
        primary = group.nodes[0].port
        for index in range(sentinels):
            group.sentinels.append(
                _start_sentinel(
                    state_dir / f"sentinel-{index}",
                    secrets_dir,
                    primary,
                    master_name=master_name,
                    down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms,
                    quorum=sentinels // 2 + 1,
                )
            )
        wait_until(lambda: _settled(group, replicas, sentinels), what="the Sentinel group", timeout=60)
    except BaseException:
        group.stop()
        raise
    return group


def _start_sentinel(
    directory: Path,
    secrets_dir: Path,
    primary: int,
    *,
    master_name: str,
    down_after_ms: int,
    failover_timeout_ms: int,
    quorum: int,
) -> RedisNode:
    binary = shutil.which("redis-server")
    if not binary:
        raise StartupFailed("redis-server is not installed (ops/install installs Debian's redis-server)")
    ensure_secrets_dir(directory)  # 0700: the config file it rewrites holds the sentinel password
    sentinel_password = ensure_secret(_password(secrets_dir, SENTINEL_USER))
    client = hashed_password(redis_sentinel_client_path(secrets_dir))
    port = free_port()
    config = directory / "sentinel.conf"
    write_private(
        config,
        "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {directory}",
                "daemonize no",
                f"sentinel monitor {master_name} 127.0.0.1 {primary} {quorum}",
                f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
                f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
                f"sentinel parallel-syncs {master_name} 1",
                f"sentinel auth-user {master_name} {SENTINEL_USER}",
                f"sentinel auth-pass {master_name} {sentinel_password}",
                f"sentinel sentinel-user {SENTINEL_USER}",
                f"sentinel sentinel-pass {sentinel_password}",
                "user default off resetpass -@all",
                f"user {SENTINEL_USER} on {hashed_password(_password(secrets_dir, SENTINEL_USER))} allchannels +@all",
                f"user {SENTINEL_CLIENT_USER} on {client} {SENTINEL_CLIENT_RULES}",
            ]
        ),
    )
    service = spawn(
        f"sentinel-{port}", [binary, str(config), "--sentinel"], directory / "sentinel.log", env=CLEAN_ENV, clean=True
    )
    return RedisNode(service, port)


def _settled(group: SentinelGroup, replicas: int, sentinels: int) -> bool:
    with group.admin(group.nodes[0].port) as primary:
        info = primary.info("replication")
    if int(info.get("connected_slaves", 0)) < replicas:
        return False
    if any(info[f"slave{i}"]["state"] != "online" for i in range(replicas)):
        return False
    for sentinel in group.sentinels:
        with group.sentinel_client(sentinel.port) as client:
            state = client.sentinel_master(group.master_name)
        if int(state["num-other-sentinels"]) < sentinels - 1 or int(state["num-slaves"]) < replicas:
            return False
    return True
