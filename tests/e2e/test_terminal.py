"""A kernel's terminal (``gateway/terminal.py``) on real sessions: a shell with a TTY through Nomad's exec."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from core.clock import utcnow
from stores.activity import read_activity
from tests.conftest import DOCKER
from tests.e2e.test_kernel_exec import run
from tests.harness import ADMIN_TOKEN, Caravan
from tests.kernel_sessions import DRIVERS, docker_container, docker_slow_to_start_execs, running_session


def terminal_url(caravan: Caravan, session_id: str, kernel: str = "main1") -> str:
    base = caravan.url.removesuffix("/graphql").replace("http://", "ws://", 1)
    return f"{base}/sessions/{session_id}/kernels/{kernel}/terminal"


@asynccontextmanager
async def terminal(
    caravan: Caravan, session_id: str, token: str | None = ADMIN_TOKEN, *, header: bool = True
) -> AsyncIterator[ClientConnection]:
    headers = {"Authorization": f"Bearer {token}"} if header and token else {}
    async with connect(terminal_url(caravan, session_id), additional_headers=headers, proxy=None) as ws:
        if not header and token:
            await ws.send(json.dumps({"type": "auth", "token": token}))
        yield ws


async def until_exit(ws: ClientConnection) -> tuple[bytes, dict[str, Any]]:
    """The terminal's output until its exit message."""
    output = bytearray()
    while True:
        message = await asyncio.wait_for(ws.recv(), 60)
        if isinstance(message, bytes):
            output += message
            continue
        return bytes(output), json.loads(message)


async def until_output(ws: ClientConnection, *wanted: bytes) -> bytes:
    """The terminal's output until it holds one of ``wanted``."""
    output = bytearray()
    while not any(w in output for w in wanted):
        message = await asyncio.wait_for(ws.recv(), 60)
        assert isinstance(message, bytes), message
        output += message
    return bytes(output)


async def closed(ws: ClientConnection) -> tuple[int | None, list[Any]]:
    """The close code, and the text messages received before it."""
    texts: list[Any] = []
    try:
        while True:
            message = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(message, str):
                texts.append(json.loads(message))
    except ConnectionClosed:
        pass
    return ws.close_code, texts


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_terminal_runs_a_shell_resizes_and_exits(caravan: Caravan, driver: str) -> None:
    session_id, _ = await running_session(caravan, driver)
    async with terminal(caravan, session_id) as ws:
        await ws.send(json.dumps({"type": "resize", "rows": 33, "cols": 101}))
        # The shell is up (its prompt: '#' as root in docker, '$' as nobody in exec): type from here on, as a person
        # would. The resize came before the exec had started: it must hold all the same.
        prompt = await until_output(ws, b"# ", b"$ ")
        await ws.send(b"stty size; echo $((6*7))\n")
        # Type the next line once the shell has answered, as a person would: a shell that sets its terminal's
        # mode between lines (tcsetattr with TCSAFLUSH) discards input typed ahead of it.
        answered = prompt + await until_output(ws, b"\n42\r\n")
        await ws.send(json.dumps({"type": "stdin", "data": "exit 5\n"}))
        output, end = await until_exit(ws)
        assert end == {"type": "exit", "exitCode": 5}
        text = (answered + output).replace(b"\r\n", b"\n")
        assert b"\n33 101\n" in text and b"\n42\n" in text
        code, _ = await closed(ws)
        assert code == 1000


@pytest.mark.docker
@pytest.mark.skipif(not DOCKER, reason="no docker")
async def test_a_terminal_docker_is_slow_to_start_still_runs_its_shell(caravan: Caravan) -> None:
    """Nomad's docker driver inspects an exec as soon as it is attached to it, and docker answers the attach before it
    marks the exec running: an exec docker is slow to start was reported ended, code 0, before its shell ran (under
    CPU load, now and then: the terminal's first message was its exit). Here docker is made slow for real, a while."""
    session_id, alloc = await running_session(caravan, "DOCKER")
    for _ in range(8):  # without the shell's start awaited, about one in three was reported ended at once
        async with docker_slow_to_start_execs(docker_container(alloc)), terminal(caravan, session_id) as ws:
            await ws.send(json.dumps({"type": "resize", "rows": 30, "cols": 100}))
            await until_output(ws, b"# ")
            await ws.send(b"exit 4\n")
            assert (await until_exit(ws))[1] == {"type": "exit", "exitCode": 4}


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_terminal_its_client_leaves_hangs_up_its_shell(caravan: Caravan, driver: str) -> None:
    """A tab closed while its shell runs a program: the shell and the program are hung up, as a terminal closed
    would; before, both stayed in the kernel (docker does not end an exec whose client went away), one more shell at
    every tab closed."""
    session_id, _ = await running_session(caravan, driver)
    async with terminal(caravan, session_id) as ws:
        await until_output(ws, b"# ", b"$ ")
        await ws.send(b"sleep 600 & echo pid-$$-$!-; wait\n")
        output = bytearray()
        while (found := re.search(rb"pid-(\d+)-(\d+)-", output)) is None:
            output += await until_output(ws, b"-")
    shell, program = (int(pid) for pid in found.groups())
    deadline = time.monotonic() + 30
    while True:
        left = await run(caravan, session_id, shell=f"for p in {shell} {program}; do [ -d /proc/$p ] && echo $p; done")
        if not left["stdout"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert left["stdout"] == "", f"left running in the kernel: {left['stdout'].split()} (shell {shell})"


async def test_browsers_authenticate_with_a_first_message_and_the_terminal_is_activity(caravan: Caravan) -> None:
    session_id, _ = await running_session(caravan, "EXEC")
    user = "term-" + uuid.uuid4().hex[:6]
    token = await caravan.user(user)
    mine, _ = await running_session(caravan, "EXEC", token=token)
    store = caravan.store
    async with terminal(caravan, mine, token, header=False) as ws:
        # type at the prompt, as a person would (input typed ahead of a shell setting its terminal's mode may be
        # discarded), and the next line once the shell has answered and prompts again
        await until_output(ws, b"# ", b"$ ")
        await ws.send(b"echo ready\n")
        answer = await until_output(ws, b"\r\nready\r\n")  # the command's output, not the echo of the line typed
        after = answer.split(b"\r\nready\r\n", 1)[1]
        if b"# " not in after and b"$ " not in after:
            await until_output(ws, b"# ", b"$ ")
        activity = (await read_activity(store.redis, store.keys, [mine], utcnow()))[mine]
        assert activity.open_connections == 1 and activity.last is not None
        await ws.send(b"exit 3\n")
        assert (await until_exit(ws))[1]["exitCode"] == 3
    assert (await read_activity(store.redis, store.keys, [mine], utcnow()))[mine].open_connections == 0
    # another user's session: not found, by either way of authenticating (never revealed as forbidden)
    with pytest.raises(InvalidStatus) as refused:
        async with terminal(caravan, session_id, token):
            pass
    assert refused.value.response.status_code == 404
    async with terminal(caravan, session_id, token, header=False) as ws:
        code, texts = await closed(ws)
    assert code == 4404 and texts[0]["code"] == "NOT_FOUND"
    async with terminal(caravan, str(uuid.uuid4()), token, header=False) as ws:
        assert (await closed(ws))[0] == 4404
    # no token, a bad token
    async with terminal(caravan, mine, None) as ws:
        await ws.send(json.dumps({"type": "resize", "rows": 1, "cols": 1}))
        code, texts = await closed(ws)
    assert code == 4401 and texts[0]["code"] == "UNAUTHENTICATED"
    with pytest.raises(InvalidStatus) as bad:
        async with terminal(caravan, mine, "not-a-token"):
            pass
    assert bad.value.response.status_code == 401


async def test_a_revoked_token_closes_an_open_terminal(caravan: Caravan) -> None:
    user = "revoked-" + uuid.uuid4().hex[:6]
    token = await caravan.user(user)
    session_id, _ = await running_session(caravan, "EXEC", token=token)
    async with terminal(caravan, session_id, token, header=False) as ws:
        await ws.send(b"echo open\n")
        seen = bytearray()
        while b"open\r\n" not in seen:
            seen += await asyncio.wait_for(ws.recv(), 30)  # type: ignore[operator]
        for issued in await caravan.users.tokens_of(user):
            await caravan.users.revoke_token(issued.id)
        code, _ = await closed(ws)
    assert code == 4403


async def test_bad_messages_and_qemu_kernels_are_refused_with_a_code(caravan: Caravan) -> None:
    session_id, _ = await running_session(caravan, "EXEC")
    async with terminal(caravan, session_id) as ws:
        await ws.send(json.dumps({"type": "resize", "rows": 0, "cols": 80}))
        code, texts = await closed(ws)
    assert code == 4400 and texts[-1]["code"] == "INVALID_INPUT"
