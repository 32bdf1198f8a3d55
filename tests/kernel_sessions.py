"""Running INTERACTIVE sessions for the exec, terminal and code-execution tests: each driver's kernel, idling."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from nomad_jobs.meta import TASK_NAME
from tests.conftest import DOCKER
from tests.harness import ADMIN_TOKEN, CREATE, Caravan

DRIVERS = [
    pytest.param("EXEC", id="exec"),
    pytest.param("DOCKER", id="docker", marks=[pytest.mark.docker, pytest.mark.skipif(not DOCKER, reason="no docker")]),
]
"""The drivers whose kernels Nomad execs into (QEMU has no exec path; raw_exec runs on the host)."""

HOSTILE_BYTES = (
    "".join(
        [
            'say "hi"',
            "${attr.unique.hostname}",
            "%{ if true }x%{ endif }",
            "$${literal}",
            "back\\slash\\\\ and \\n not a newline",
            "line one\nline two\r\n\ttabbed",
            '" }\n  task "evil" { driver = "raw_exec" config { command = "/bin/sh" } }\n  x = "',
            "unicode ✓ ünïcödé \u2028 and \x07 bell",
        ]
    ).encode()
    + bytes(range(256))  # every byte value: NUL, control bytes, and bytes that are not UTF-8
)
"""The job encoder's hostile strings (tests/e2e/test_hostile_strings.py), then every byte value."""


async def running_session(caravan: Caravan, driver: str, *, token: str = ADMIN_TOKEN) -> tuple[str, str]:
    """A new INTERACTIVE session of ``driver`` owned by ``token``'s user, RUNNING: (session id, its main alloc id)."""
    data = await caravan.gql(
        CREATE,
        {"input": {"name": "exec-" + uuid.uuid4().hex[:8], "type": "INTERACTIVE", "driver": driver}},
        token=token,
    )
    session_id = data["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING", timeout=120)
    session = await caravan.store.get(session_id)
    assert session is not None and session.kernels[0].alloc_id
    return session_id, session.kernels[0].alloc_id


DOCKER_SOCKET = "/var/run/docker.sock"


def docker_container(alloc_id: str) -> str:
    """The name Nomad's docker driver gives the container of a kernel's task in ``alloc_id``."""
    return f"{TASK_NAME}-{alloc_id}"


@asynccontextmanager
async def docker_slow_to_start_execs(
    container: str, *, seconds: float = 2.0, holders: int = 2, hold: float = 0.3, warmup: float = 1.0
) -> AsyncIterator[None]:
    """Docker made slow to start execs in ``container`` for ``seconds``, for real, as a burst of load does: archive
    reads of the container (what ``docker cp`` out of it does) hold its lock in dockerd until their stream is closed,
    and these are not read, each held ``hold`` seconds, over and over, by ``holders`` staggered readers. dockerd
    answers an exec's start (its HTTP upgrade) before it takes that lock and marks the exec running, so the exec waits
    there while an inspect of it already answers. Leaving the block waits for the readers to stop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + warmup + seconds
    request = f"GET /containers/{container}/archive?path=/ HTTP/1.1\r\nHost: docker\r\n\r\n".encode()
    held = asyncio.Event()

    async def hold_over_and_over() -> None:
        while loop.time() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the archive cannot fit in the buffers
            sock.setblocking(False)
            await loop.sock_connect(sock, DOCKER_SOCKET)
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=4096)
            try:
                writer.write(request)
                status = await reader.readline()  # sent once dockerd holds the container's lock
                assert status.startswith(b"HTTP/1.1 200"), status
                held.set()
                await asyncio.sleep(hold)
            finally:
                writer.close()

    tasks = []
    for _ in range(holders):
        tasks.append(asyncio.create_task(hold_over_and_over()))
        await asyncio.sleep(hold / holders)  # staggered: the lock is always held or waited for
    try:
        await held.wait()
        await asyncio.sleep(warmup)  # the readers in step: one holds the lock, the next one waits for it
        yield
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    finally:
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [end for end in ended if isinstance(end, BaseException)]
    assert not failed, f"an archive read of {container} failed: {failed}"  # then docker was not slow at all
