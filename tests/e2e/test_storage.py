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
