"""SFTP system sessions on the real stack, with OpenSSH's own ``sftp`` client in batch mode: a 20 MiB file up and
down byte-exact, only the folders asked are there, the key is the only way in."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from core.clock import utcnow
from core.errors import PermanentError, TransientError
from core.settings import Settings
from domain.model import SessionStatus
from domain.sftp import ACTIVITY_FILE, ACTIVITY_PERIOD
from tests.conftest import STACK
from tests.e2e.test_storage import ready_folder
from tests.harness import CREATE, Caravan, GraphQLErrors, running_caravan
from tests.idle.running import eventually, policy_file, running_idle, swept_since

SFTP_IMAGE = STACK.get("CARAVAN_SFTP_IMAGE", "")
pytestmark = pytest.mark.skipif(not SFTP_IMAGE, reason="no SFTP image: run ops/build-sftp-image")

REQUEST = """mutation($input: RequestSftpInput!) {
  requestSftp(input: $input) { user port privateKey session { id type status mounts { path mode } } } }"""
ADDRESS = "query($id: ID!) { session(id: $id) { status sftpAddress } }"
MIB = 1024 * 1024


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with running_caravan(dataclasses.replace(settings, sftp_image=SFTP_IMAGE)) as running:
        yield running


async def sftp_address(caravan: Caravan, token: str, session_id: str) -> str:
    session = await caravan.wait_for(session_id, "RUNNING", "ERROR")
    assert session["status"] == "RUNNING", (session["statusInfo"], session["statusHistory"], session["mainKernel"])
    found = (await caravan.gql(ADDRESS, {"id": session_id}, token=token))["session"]
    assert found["sftpAddress"], found
    return str(found["sftpAddress"])


def sftp(address: str, key: Path, commands: str, *, patience: float = 30.0) -> str:
    """Run ``commands`` with ``sftp -b``; retried while the server is still starting (connection refused)."""
    host, port = address.rsplit(":", 1)
    argv = ["sftp", "-q", "-b", "-", "-i", str(key), "-P", port, "-o", "StrictHostKeyChecking=no"]
    argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", f"root@{host}"]
    deadline = time.monotonic() + patience
    while True:
        done = subprocess.run(argv, input=commands, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout
        if time.monotonic() > deadline or "Connection refused" not in done.stderr + done.stdout:
            raise AssertionError(f"sftp failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        time.sleep(0.5)


async def test_a_20_mib_file_goes_up_and_down_byte_exact_and_other_folders_are_unseen(
    caravan: Caravan, tmp_path: Path
) -> None:
    alice = await caravan.user("alice")
    served = await ready_folder(caravan, alice, "results")
    await ready_folder(caravan, alice, "private")  # not asked for: must not be there
    access: dict[str, Any] = (await caravan.gql(REQUEST, {"input": {"folders": [served["id"]]}}, token=alice))[
        "requestSftp"
    ]
    assert (access["user"], access["port"], access["session"]["type"]) == ("root", 2222, "SYSTEM")
    assert access["session"]["mounts"] == [{"path": "/srv/folders/results", "mode": "RW"}]  # /srv: sshd's chroot
    key = tmp_path / "id_ed25519"
    key.write_text(access["privateKey"])
    key.chmod(0o600)
    address = await sftp_address(caravan, alice, access["session"]["id"])

    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(20 * MIB))
    back = tmp_path / "back.bin"
    listing = await asyncio.to_thread(
        sftp,
        address,
        key,
        f"put {blob} /folders/results/blob.bin\nget /folders/results/blob.bin {back}\nls -1 /folders\n",
    )
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(blob.read_bytes()).digest()
    echoed = [line for line in listing.splitlines() if line.strip() and not line.startswith("sftp>")]
    assert [line.strip().rsplit("/", 1)[-1] for line in echoed] == ["results"], listing

    # SFTP only, chrooted: no shell or command, and nothing of the container is in sight (dropbear gave a shell)
    host, port = address.rsplit(":", 1)
    ssh = ["ssh", "-i", str(key), "-p", port, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    ssh += ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", f"root@{host}", "id; cat /etc/passwd"]
    shell = await asyncio.to_thread(subprocess.run, ssh, capture_output=True, text=True, timeout=60)
    assert "uid=" not in shell.stdout and "root:" not in shell.stdout, shell.stdout
    assert "sftp connections only" in shell.stdout + shell.stderr, (shell.stdout, shell.stderr)
    root = await asyncio.to_thread(sftp, address, key, "ls -1 /\n")
    assert [line.strip().strip("/") for line in root.splitlines() if line.strip() and not line.startswith("sftp>")] == [
        "folders"
    ], root

    stranger = tmp_path / "stranger"
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)]
    await asyncio.to_thread(subprocess.run, keygen, check=True)
    with pytest.raises(AssertionError, match=r"sftp failed \(255\)"):  # refused at authentication
        await asyncio.to_thread(sftp, address, stranger, "ls /folders\n", patience=0)


async def test_keys_are_checked_and_system_sessions_come_only_from_request_sftp(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "keys")
    for bad in (
        "ssh-ed25519",
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
        "ssh-ed25519 AAAAC3NzaC1yc2EAAAADAQABAAABAQCxxxxxxxxxxxxxxxxxxxxxx",
    ):
        with pytest.raises(GraphQLErrors) as failed:
            await caravan.gql(REQUEST, {"input": {"folders": [folder["id"]], "publicKey": bad}}, token=alice)
        assert [e["extensions"]["field"] for e in failed.value.errors] == ["publicKey"], bad
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(REQUEST, {"input": {"folders": ["nope"]}}, token=alice)
    assert [(e["extensions"]["code"], e["extensions"]["field"]) for e in failed.value.errors] == [
        ("NOT_FOUND", "folders")
    ]
    with pytest.raises(GraphQLErrors) as failed:  # not even an admin creates a SYSTEM session directly
        await caravan.gql(CREATE, {"input": {"name": "sys1", "type": "SYSTEM", "driver": "EXEC"}})
    assert failed.value.codes == ["FORBIDDEN"]


async def test_a_connected_sftp_client_keeps_its_session_from_network_idleness(
    caravan: Caravan, tmp_path: Path
) -> None:
    """SFTP traffic never passes through the gateway: the session's own server says when a client is connected, and
    the idle checker reads that through Nomad. Connected, the session outlives its network idle timeout; once the
    client leaves, it is reclaimed like any idle session, and so is a session nobody connected to."""
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "kept")
    sessions = []
    for _ in range(2):
        access = (await caravan.gql(REQUEST, {"input": {"folders": [folder["id"]]}}, token=alice))["requestSftp"]
        key = tmp_path / f"key-{len(sessions)}"
        key.write_text(access["privateKey"])
        key.chmod(0o600)
        sessions.append((access["session"]["id"], key))
    (used, key), (unused, _) = sessions
    host, port = (await sftp_address(caravan, alice, used)).rsplit(":", 1)
    await sftp_address(caravan, alice, unused)
    argv = ["sftp", "-q", "-b", "-", "-i", str(key), "-P", port, "-o", "StrictHostKeyChecking=no"]
    argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", f"root@{host}"]
    client = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write(b"ls -1 /folders\n")  # connected and working; stdin stays open, and so does the connection
    await client.stdin.drain()
    assert b"kept" in await asyncio.wait_for(client.stdout.readuntil(b"kept"), timeout=60)
    stored = await caravan.store.get(used)
    assert stored is not None and stored.kernels[0].alloc_id is not None
    alloc_id = stored.kernels[0].alloc_id

    async def client_seen() -> datetime | None:
        try:
            return await caravan.nomad.file_modified(alloc_id, ACTIVITY_FILE)
        except (TransientError, PermanentError):
            return None

    await eventually(client_seen, timeout=3 * ACTIVITY_PERIOD)
    path = policy_file(tmp_path, 'check_interval = "1s"\ndefaults {\n  network_idle_timeout = "4s"\n}\n')
    try:
        async with running_idle(caravan.settings, path) as service:
            ended = await caravan.wait_for(unused, "TERMINATED", "ERROR", timeout=60)
            assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "idle-timeout")
            kept = await swept_since(service.idle_store, used, utcnow())  # judged since, and kept
            network = next(r for r in kept.verdict.reports if r.name.value == "network_timeout")
            assert (network.expired, network.note) == (False, "app connections open")
            found = await caravan.store.get(used)
            assert found is not None and found.status is SessionStatus.RUNNING

            client.stdin.close()  # the client leaves
            assert await asyncio.wait_for(client.wait(), timeout=30) == 0
            ended = await caravan.wait_for(used, "TERMINATED", "ERROR", timeout=60)
            assert (ended["status"], ended["statusInfo"]) == ("TERMINATED", "idle-timeout")
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()
