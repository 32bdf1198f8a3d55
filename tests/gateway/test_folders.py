"""Storage folders through the real gateway (real Redis; no scheduler, so folders stay CREATING): who sees and changes
which folder, shares, the trash, quotas, and typed errors naming the field."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from core.clock import utcnow
from core.settings import Settings, StorageSettings
from domain.storage import FolderStatus, purge_claim
from domain.users import Role
from stores.folders import FolderStore
from tests.harness import Caravan, GraphQLErrors, running_caravan

FIELDS = """id name ownerId project status myMode usageBytes trashedAt purgeAt
sharedWithUsers { userId mode } sharedWithProjects { project mode }"""
CREATE = f"mutation($input: CreateFolderInput!) {{ createFolder(input: $input) {{ {FIELDS} }} }}"
FOLDERS = "{ folders { id name myMode status } }"
FOLDER = f"query($id: ID!) {{ folder(id: $id) {{ {FIELDS} }} }}"
RENAME = "mutation($id: ID!, $name: String!) { renameFolder(id: $id, name: $name) { id name } }"
DELETE = "mutation($id: ID!) { deleteFolder(id: $id) { id status trashedAt purgeAt } }"
RESTORE = "mutation($id: ID!) { restoreFolder(id: $id) { id status trashedAt } }"
SHARE = f"mutation($input: FolderShareInput!) {{ shareFolder(input: $input) {{ {FIELDS} }} }}"
UNSHARE = """mutation($folder: ID!, $user: String, $project: String) {
  unshareFolder(folder: $folder, user: $user, project: $project) { id sharedWithUsers { userId } } }"""
USAGE = "{ folderUsage { folders maxFolders bytes maxBytes } }"


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str) -> dict[str, Any]:
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(query, variables, token=token)
    [error] = failed.value.errors
    return dict(error["extensions"])


async def create(caravan: Caravan, token: str, name: str = "data", **more: Any) -> dict[str, Any]:
    return dict((await caravan.gql(CREATE, {"input": {"name": name, **more}}, token=token))["createFolder"])


async def test_a_folder_is_its_owners_and_no_one_elses(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    folder = await create(caravan, alice)
    assert (folder["ownerId"], folder["project"], folder["status"], folder["myMode"]) == (
        "alice", "default", "CREATING", "RW",
    )  # fmt: skip
    assert [f["name"] for f in (await caravan.gql(FOLDERS, token=alice))["folders"]] == ["data"]
    assert (await caravan.gql(FOLDERS, token=bob))["folders"] == []
    for query, variables in (
        (FOLDER, {"id": folder["id"]}),
        (RENAME, {"id": folder["id"], "name": "mine"}),
        (DELETE, {"id": folder["id"]}),
        (SHARE, {"input": {"folder": folder["id"], "user": "bob", "mode": "RW"}}),
    ):
        error = await refused(caravan, query, variables, bob)
        assert error["code"] == "NOT_FOUND", (query, error)
    assert (await caravan.gql(FOLDER, {"id": folder["id"]}, token=alice))["folder"]["name"] == "data"


async def test_names_are_checked_unique_and_renamable(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    for bad in ("", "..", ".", "a/b", "x" * 65, "nul\x00", "sp ace"):
        error = await refused(caravan, CREATE, {"input": {"name": bad}}, alice)
        assert (error["code"], error["field"]) == ("INVALID_INPUT", "name"), bad
    first = await create(caravan, alice, "one")
    await create(caravan, alice, "two")
    error = await refused(caravan, CREATE, {"input": {"name": "one"}}, alice)
    assert (error["code"], error["field"]) == ("CONFLICT", "name")
    error = await refused(caravan, RENAME, {"id": first["id"], "name": "two"}, alice)
    assert (error["code"], error["field"]) == ("CONFLICT", "name")
    await caravan.gql(RENAME, {"id": first["id"], "name": "three"}, token=alice)
    await create(caravan, alice, "one")  # the old name is free again
    names = [f["name"] for f in (await caravan.gql(FOLDERS, token=alice))["folders"]]
    assert names == ["one", "three", "two"]
    error = await refused(caravan, CREATE, {"input": {"name": "p", "project": "elsewhere"}}, alice)
    assert (error["code"], error["field"]) == ("NOT_FOUND", "project")


async def test_shares_give_at_most_their_mode_and_only_the_owner_changes_them(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    carol = await caravan.user("carol", projects=("lab",))
    folder = await create(caravan, alice)
    shared = (await caravan.gql(SHARE, {"input": {"folder": folder["id"], "user": "bob"}}, token=alice))["shareFolder"]
    assert shared["sharedWithUsers"] == [{"userId": "bob", "mode": "RO"}]
    seen = (await caravan.gql(FOLDER, {"id": folder["id"]}, token=bob))["folder"]
    assert (seen["myMode"], seen["sharedWithUsers"]) == ("RO", [])  # shares are the owner's business
    error = await refused(caravan, RENAME, {"id": folder["id"], "name": "bobs"}, bob)
    assert (error["code"], error["field"]) == ("FORBIDDEN", "id")
    assert (await caravan.gql(FOLDERS, token=carol))["folders"] == []
    error = await refused(caravan, SHARE, {"input": {"folder": folder["id"], "project": "lab"}}, alice)
    assert (error["code"], error["field"]) == ("NOT_FOUND", "project")  # not a project of alice's
    error = await refused(caravan, SHARE, {"input": {"folder": folder["id"], "user": "nobody"}}, alice)
    assert (error["code"], error["field"]) == ("NOT_FOUND", "user")
    error = await refused(caravan, SHARE, {"input": {"folder": folder["id"]}}, alice)
    assert (error["code"], error["field"]) == ("INVALID_INPUT", "user")
    await caravan.gql(SHARE, {"input": {"folder": folder["id"], "project": "default", "mode": "RW"}}, token=alice)
    assert (await caravan.gql(FOLDER, {"id": folder["id"]}, token=bob))["folder"]["myMode"] == "RW"
    await caravan.gql(UNSHARE, {"folder": folder["id"], "project": "default"}, token=alice)
    await caravan.gql(UNSHARE, {"folder": folder["id"], "user": "bob"}, token=alice)
    assert (await caravan.gql(FOLDERS, token=bob))["folders"] == []


async def test_a_deleted_folder_goes_to_the_trash_out_of_shares_and_can_come_back(caravan: Caravan) -> None:
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    folder = await create(caravan, alice)
    await caravan.gql(SHARE, {"input": {"folder": folder["id"], "user": "bob"}}, token=alice)
    trashed = (await caravan.gql(DELETE, {"id": folder["id"]}, token=alice))["deleteFolder"]
    assert trashed["status"] == "TRASHED" and trashed["purgeAt"] > trashed["trashedAt"]
    assert (await caravan.gql(FOLDERS, token=bob))["folders"] == []
    error = await refused(caravan, SHARE, {"input": {"folder": folder["id"], "user": "bob"}}, alice)
    assert (error["code"], error["field"]) == ("INVALID_INPUT", "folder")
    restored = (await caravan.gql(RESTORE, {"id": folder["id"]}, token=alice))["restoreFolder"]
    assert (restored["status"], restored["trashedAt"]) == ("CREATING", None)  # no volume yet: no scheduler here
    assert [f["myMode"] for f in (await caravan.gql(FOLDERS, token=bob))["folders"]] == ["RO"]
    error = await refused(caravan, RESTORE, {"id": folder["id"]}, alice)
    assert (error["code"], error["field"]) == ("INVALID_INPUT", "id")


async def test_a_folder_whose_purge_began_cannot_come_back(caravan: Caravan) -> None:
    alice, _ = await caravan.user("alice"), await caravan.user("bob")
    folder = await create(caravan, alice)
    await caravan.gql(DELETE, {"id": folder["id"]}, token=alice)
    store = FolderStore(caravan.store.redis, caravan.store.keys)
    # the job owner claims the purge once the grace has passed (here: a day from now)
    claimed = await store.settle(
        folder["id"], lambda f: purge_claim(f, caravan.settings.storage, utcnow() + timedelta(days=365)), None
    )
    assert claimed is not None and claimed.status is FolderStatus.PURGING
    error = await refused(caravan, RESTORE, {"id": folder["id"]}, alice)
    assert (error["code"], error["field"]) == ("INVALID_INPUT", "id")
    error = await refused(caravan, SHARE, {"input": {"folder": folder["id"], "user": "bob"}}, alice)
    assert error["code"] == "INVALID_INPUT"
    again = (await caravan.gql(DELETE, {"id": folder["id"]}, token=alice))["deleteFolder"]
    assert again["status"] == "PURGING"
    assert (await caravan.gql(FOLDER, {"id": folder["id"]}, token=alice))["folder"]["status"] == "PURGING"


async def test_admins_reach_their_projects_folders(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    admin = await caravan.user("lead", role=Role.ADMIN)
    folder = await create(caravan, alice)
    assert [f["id"] for f in (await caravan.gql(FOLDERS, token=admin))["folders"]] == [folder["id"]]
    await caravan.gql(RENAME, {"id": folder["id"], "name": "renamed-by-admin"}, token=admin)


async def test_the_number_of_folders_is_capped(redis_settings: Settings) -> None:
    capped = dataclasses.replace(redis_settings, storage=StorageSettings(max_per_user=2))
    async with running_caravan(capped, scheduler=False) as caravan:
        alice = await caravan.user("alice")
        first = await create(caravan, alice, "a")
        await create(caravan, alice, "b")
        error = await refused(caravan, CREATE, {"input": {"name": "c"}}, alice)
        assert (error["code"], error["field"]) == ("QUOTA_EXCEEDED", "name")
        await caravan.gql(DELETE, {"id": first["id"]}, token=alice)  # the trash still counts
        error = await refused(caravan, CREATE, {"input": {"name": "c"}}, alice)
        assert error["code"] == "QUOTA_EXCEEDED"
        usage = (await caravan.gql(USAGE, token=alice))["folderUsage"]
        assert (usage["folders"], usage["maxFolders"], usage["bytes"]) == (2, 2, 0)


CREATE_TEMPLATE = """mutation($input: CreateSessionTemplateInput!) {
  createSessionTemplate(input: $input) { id spec { mounts { folder path mode } } } }"""
FROM_TEMPLATE = """mutation($id: ID!, $overrides: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $id, overrides: $overrides) { sessions { id mounts { folder path mode } } } }"""


async def test_templates_carry_mounts_and_sessions_from_them_run_on_the_folders_node(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    created = await create(caravan, alice)
    store = FolderStore(caravan.store.redis, caravan.store.keys)
    # no scheduler here: made READY on "node-a" as the job owner would
    ready = {"status": FolderStatus.READY, "node_id": "node-a", "volume_id": "v", "host_path": "/x"}
    assert await store.settle(created["id"], lambda f: f.evolve(**ready), None) is not None
    mounts = [{"folder": created["id"], "path": "/data", "mode": "RO"}]
    spec = {"type": "INTERACTIVE", "driver": "EXEC", "mounts": mounts}
    template = (await caravan.gql(CREATE_TEMPLATE, {"input": {"name": "with-data", "spec": spec}}, token=alice))[
        "createSessionTemplate"
    ]
    assert template["spec"]["mounts"] == mounts
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "from-t"}}, token=alice)
    [session] = data["createSessionFromTemplate"]["sessions"]
    assert session["mounts"] == mounts
    model = await caravan.store.get(session["id"])
    assert model is not None and model.designated_agent == "node-a"
    error = await refused(
        caravan,
        CREATE_TEMPLATE,
        {"input": {"name": "bad", "spec": {**spec, "mounts": [{**mounts[0], "path": "/etc"}]}}},
        alice,
    )
    assert (error["code"], error["field"]) == ("INVALID_INPUT", "spec.mounts.0.path")
