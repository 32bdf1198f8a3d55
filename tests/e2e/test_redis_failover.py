"""The gateway through a Redis failover: the primary behind Sentinel is killed under a stream of ``createSession``;
the gateway answers UNAVAILABLE (never another error) for the failover's window, then creates again by itself, and
every session it acknowledged is on the new primary."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from caravan.stack.redis_sentinel import SentinelGroup, start_sentinel_group
from core.secrets import read_secret, redis_sentinel_client_path
from core.settings import Settings
from tests.conftest import TEST_KEY_PREFIXES
from tests.failover import longest_gap
from tests.harness import CREATE, GraphQLErrors, running_caravan

pytestmark = [pytest.mark.redis]

BATCH = {"type": "BATCH", "driver": "EXEC", "startupCommand": "exit 0"}


@pytest.fixture
def group(tmp_path: Path, redis_settings: Settings) -> Iterator[SentinelGroup]:
    # a copy of the test stack's secrets (the components' passwords): the group writes its own ACL file and users
    # (replication, sentinel) there, never into the shared Redis' secrets
    secrets = shutil.copytree(redis_settings.secrets, tmp_path / "secrets")
    started = start_sentinel_group(tmp_path / "sentinel-group", secrets_dir=secrets, key_prefixes=TEST_KEY_PREFIXES)
    yield started
    started.stop()


async def test_the_gateway_rides_out_a_failover(redis_settings: Settings, group: SentinelGroup) -> None:
    sentinel_password = read_secret(redis_sentinel_client_path(group.secrets_dir))
    settings = replace(
        redis_settings,
        secrets_dir=group.secrets_dir,
        redis=replace(
            redis_settings.redis,
            sentinels=group.sentinel_addresses,
            sentinel_username="caravan",
            sentinel_password=sentinel_password,
            wait_replicas=1,
        ),
    )
    acknowledged: list[tuple[float, str]] = []
    unavailable: list[float] = []
    stop = asyncio.Event()
    async with running_caravan(settings, scheduler=False) as caravan:

        async def client(n: int) -> None:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                try:
                    data = await caravan.gql(CREATE, {"input": {**BATCH, "name": f"c{n}-{i}"}})
                except GraphQLErrors as raised:
                    assert raised.codes == ["UNAVAILABLE"], raised.errors
                    unavailable.append(time.monotonic())
                    await asyncio.sleep(0.05)
                else:
                    acknowledged.append((time.monotonic(), data["createSession"]["sessions"][0]["id"]))

        clients = [asyncio.create_task(client(n)) for n in range(4)]
        try:
            while len(acknowledged) < 20:
                await asyncio.sleep(0.05)
            old = group.primary_port()
            assert old is not None
            killed_at = time.monotonic()
            group.node(old).kill()
            deadline = killed_at + 60
            while sum(t > killed_at for t, _ in acknowledged) < 20 or group.primary_port() in (old, None):
                assert time.monotonic() < deadline, "the gateway did not create sessions again after the failover"
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        stored = await caravan.store.get_many([session_id for _, session_id in acknowledged])
    assert None not in stored, f"{stored.count(None)} of {len(acknowledged)} acknowledged sessions lost"
    assert unavailable, "the kill was not felt: the test did not test a failover"
    window = longest_gap(t for t, _ in acknowledged if t > killed_at - 1)
    print(
        f"\ngateway through a failover: {window:.2f}s without a created session; "
        f"{len(unavailable)} UNAVAILABLE answers; {len(acknowledged)} sessions created, none lost"
    )
