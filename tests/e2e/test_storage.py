"""Storage folders on the real stack: the scheduler's job owner makes each folder a Nomad dynamic host volume on the
storage node, and purges a trashed folder's volume and data once its grace has passed."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from core.settings import Settings, StorageSettings
from tests.harness import Caravan, GraphQLErrors, running_caravan

CREATE = "mutation($name: String!) { createFolder(input: {name: $name}) { id status } }"
FOLDER = "query($id: ID!) { folder(id: $id) { id status statusInfo nodeId } }"
DELETE = "mutation($id: ID!) { deleteFolder(id: $id) { status purgeAt } }"


async def ready_folder(caravan: Caravan, token: str, name: str, timeout: float = 30.0) -> dict[str, Any]:
    created = (await caravan.gql(CREATE, {"name": name}, token=token))["createFolder"]
    assert created["status"] == "CREATING"
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, Any] = (await caravan.gql(FOLDER, {"id": created["id"]}, token=token))["folder"]
        if found["status"] != "CREATING":
            assert found["status"] == "READY", found
            return found
        assert time.monotonic() < deadline, f"folder still CREATING after {timeout}s"
        await asyncio.sleep(0.1)


async def test_a_folder_becomes_a_volume_on_the_storage_node_and_its_trash_is_purged(settings: Settings) -> None:
    quick_trash = dataclasses.replace(settings, storage=StorageSettings(trash_grace=1.0))
    async with running_caravan(quick_trash) as caravan:
        alice = await caravan.user("alice")
        folder = await ready_folder(caravan, alice, "data")
        [node] = [n for n in await caravan.nomad.nodes() if n["Status"] == "ready"]
        assert folder["nodeId"] == node["ID"]
        stored = await caravan.nomad._json("GET", "/v1/volumes", params={"type": "host"})
        [volume] = [v for v in stored if v["Name"] == f"caravan-folder-{folder['id']}"]
        detail = await caravan.nomad._json("GET", f"/v1/volume/host/{volume['ID']}")
        host_path = Path(detail["HostPath"])
        assert host_path.is_dir()
        (host_path / "kept.txt").write_text("until purged")

        await caravan.gql(DELETE, {"id": folder["id"]}, token=alice)
        deadline = time.monotonic() + 30
        while host_path.exists() or await _still_there(caravan, alice, folder["id"]):
            assert time.monotonic() < deadline, "the trashed folder was not purged"
            await asyncio.sleep(0.2)
        left = await caravan.nomad._json("GET", "/v1/volumes", params={"type": "host"})
        assert not [v for v in left if v["ID"] == volume["ID"]]


async def _still_there(caravan: Caravan, token: str, folder_id: str) -> bool:
    try:
        await caravan.gql(FOLDER, {"id": folder_id}, token=token)
    except GraphQLErrors as exc:
        assert exc.codes == ["NOT_FOUND"]
        return False
    return True


SHARE = "mutation($input: FolderShareInput!) { shareFolder(input: $input) { id } }"
SESSION_MOUNTS = "query($id: ID!) { session(id: $id) { mounts { folder path mode } } }"


async def batch(caravan: Caravan, token: str, name: str, command: str, mounts: list[dict[str, str]]) -> str:
    """A BATCH exec session running ``command`` with ``mounts``; its id."""
    spec = {"name": name, "type": "BATCH", "driver": "EXEC", "startupCommand": command, "mounts": mounts}
    data = await caravan.gql(CREATE_SESSION, {"input": spec}, token=token)
    return str(data["createSession"]["sessions"][0]["id"])


CREATE_SESSION = "mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"


async def refused_codes(caravan: Caravan, token: str, mounts: list[dict[str, str]]) -> tuple[str, str]:
    try:
        await batch(caravan, token, "refused", "true", mounts)
    except GraphQLErrors as exc:
        [error] = exc.errors
        return str(error["extensions"]["code"]), str(error["extensions"].get("field"))
    raise AssertionError(f"mounts {mounts} were accepted")


async def test_a_file_written_in_one_session_is_read_in_another_and_ro_mounts_refuse_writes(
    caravan: Caravan,
) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    folder = await ready_folder(caravan, alice, "shared")
    rw = [{"folder": folder["id"], "path": "/data", "mode": "RW"}]
    writer = await batch(caravan, alice, "writer", "echo written-by-one > /data/note.txt", rw)
    done = await caravan.wait_for(writer, "TERMINATED", "ERROR")
    assert done["result"] == "SUCCESS", done
    assert 'source          = "caravan-folder-' in done["jobHcl"] or "caravan-folder-" in done["jobHcl"]
    mounts = (await caravan.gql(SESSION_MOUNTS, {"id": writer}, token=alice))["session"]["mounts"]
    assert mounts == [{"folder": folder["id"], "path": "/data", "mode": "RW"}]

    reader = await batch(caravan, alice, "reader", "cat /data/note.txt", rw)
    read = await caravan.wait_for(reader, "TERMINATED", "ERROR")
    assert read["mainKernel"]["logs"]["stdout"] == "written-by-one\n"

    # bob: cannot see it (NOT_FOUND); shared RO he reads it, cannot mount it RW, and an RO mount refuses writes
    assert await refused_codes(caravan, bob, rw) == ("NOT_FOUND", "mounts.0.folder")
    await caravan.gql(SHARE, {"input": {"folder": folder["id"], "user": "bob", "mode": "RO"}}, token=alice)
    assert await refused_codes(caravan, bob, rw) == ("FORBIDDEN", "mounts.0.mode")
    ro = [{"folder": folder["id"], "path": "/shared/in", "mode": "RO"}]
    probe = "cat /shared/in/note.txt && if echo x > /shared/in/evil.txt; then echo WROTE; else echo REFUSED; fi"
    bobs = await batch(caravan, bob, "bob-reads", probe, ro)
    seen = await caravan.wait_for(bobs, "TERMINATED", "ERROR")
    assert seen["mainKernel"]["logs"]["stdout"] == "written-by-one\nREFUSED\n", seen["mainKernel"]["logs"]


async def test_mount_paths_that_escape_or_clash_are_refused(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    folder = await ready_folder(caravan, alice, "paths")
    for path in ("data", "/", "/data/../etc", "/./data", "/etc", "/proc/x", "/alloc", "/secrets", "/a//b", "/d\x00"):
        code, field = await refused_codes(caravan, alice, [{"folder": folder["id"], "path": path}])
        assert (code, field) == ("INVALID_INPUT", "mounts.0.path"), path
    twice = [{"folder": folder["id"], "path": "/data"}, {"folder": folder["id"], "path": "/data/sub"}]
    assert await refused_codes(caravan, alice, twice) == ("INVALID_INPUT", "mounts.1.path")


async def test_a_trashed_folder_a_session_still_mounts_is_purged_once_the_session_ends(settings: Settings) -> None:
    quick_trash = dataclasses.replace(settings, storage=StorageSettings(trash_grace=0.5))
    async with running_caravan(quick_trash) as caravan:
        alice = await caravan.user("alice")
        folder = await ready_folder(caravan, alice, "in-use")
        spec = {"name": "holder", "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": "sleep 600"}
        spec["mounts"] = [{"folder": folder["id"], "path": "/data", "mode": "RW"}]
        holder = (await caravan.gql(CREATE_SESSION, {"input": spec}, token=alice))["createSession"]["sessions"][0]
        await caravan.wait_for(holder["id"], "RUNNING")
        await caravan.gql(DELETE, {"id": folder["id"]}, token=alice)
        # a purge Nomad refuses while the volume is mounted is tried again later; the job owner goes on working
        await caravan.gql("mutation($id: ID!) { destroySession(ids: [$id]) { id } }", {"id": holder["id"]}, token=alice)
        await caravan.wait_for(holder["id"], "TERMINATED")
        deadline = time.monotonic() + 150
        while await _still_there(caravan, alice, folder["id"]):
            assert time.monotonic() < deadline, "the trashed folder was not purged after its session ended"
            await asyncio.sleep(0.5)


USAGE = "query($id: ID!) { folder(id: $id) { usageBytes } folderUsage { bytes maxBytes } }"


async def usage_becomes(caravan: Caravan, token: str, folder_id: str, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen = await caravan.gql(USAGE, {"id": folder_id}, token=token)
        if seen["folder"]["usageBytes"] == expected and seen["folderUsage"]["bytes"] == expected:
            return
        assert time.monotonic() < deadline, f"usage {seen}, not {expected}, after {timeout}s"
        await asyncio.sleep(0.2)


async def test_bytes_written_inside_a_session_through_a_mount_count_in_the_usage_and_the_quota(
    settings: Settings,
) -> None:
    quota = 4 * 1024 * 1024
    recounted = dataclasses.replace(settings, storage=StorageSettings(max_bytes_per_user=quota, recount_interval=0.5))
    async with running_caravan(recounted) as caravan:
        alice = await caravan.user("alice")
        folder = await ready_folder(caravan, alice, "written-inside")
        await usage_becomes(caravan, alice, folder["id"], 0)
        rw = [{"folder": folder["id"], "path": "/data", "mode": "RW"}]
        write = f"mkdir -p /data/out && head -c {quota} /dev/zero > /data/out/four.bin && ln -s / /data/root"
        writer = await batch(caravan, alice, "writes", write, rw)
        assert (await caravan.wait_for(writer, "TERMINATED", "ERROR"))["result"] == "SUCCESS"
        await usage_becomes(caravan, alice, folder["id"], quota)  # the symlink to / counts nothing

        # the quota sees them: no upload, no RW mount (RO still)
        files = caravan.url.removesuffix("/graphql") + f"/folders/{folder['id']}/files"
        auth = {"authorization": f"Bearer {alice}"}
        upload = await caravan.http.put(files, params={"path": "more.bin"}, content=b"x", headers=auth)
        assert upload.status_code == 413 and upload.json()["error"]["code"] == "QUOTA_EXCEEDED", upload.text
        assert await refused_codes(caravan, alice, rw) == ("QUOTA_EXCEEDED", "mounts.0.folder")
        ro = [{"folder": folder["id"], "path": "/data", "mode": "RO"}]
        reader = await batch(caravan, alice, "reads", "ls /data/out", ro)
        assert (await caravan.wait_for(reader, "TERMINATED", "ERROR"))["result"] == "SUCCESS"

        remover = await caravan.http.delete(files, params={"path": "out"}, headers=auth)  # freeing space is allowed
        assert remover.status_code == 200, remover.text
        await usage_becomes(caravan, alice, folder["id"], 0)
        writer = await batch(caravan, alice, "writes-again", "echo ok > /data/ok && rm /data/ok", rw)
        assert (await caravan.wait_for(writer, "TERMINATED", "ERROR"))["result"] == "SUCCESS"
