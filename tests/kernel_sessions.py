"""Running INTERACTIVE sessions for the exec, terminal and code-execution tests: each driver's kernel, idling."""

from __future__ import annotations

import uuid

import pytest

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
