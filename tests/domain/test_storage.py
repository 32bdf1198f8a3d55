"""Storage folders' pure rules: who sees a folder and with which mode, mount paths, resolving mounts (and the node a
session is designated to), paths inside a folder, SFTP keys, committed image references."""

from __future__ import annotations

import base64
import struct
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import CaravanError
from domain.folder_paths import folder_path
from domain.model import Driver, SessionType
from domain.session_requests import CreationRules, SessionRequest, build_sessions
from domain.sftp import checked_public_key
from domain.storage import (
    Folder,
    FolderMode,
    FolderStatus,
    MountRequest,
    check_mounts,
    folders_to_recount,
    mode_for,
    resolve_mounts,
)
from domain.users import Role, User

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = User("alice", "alice", Role.USER)
BOB = User("bob", "bob", Role.USER)
CAROL = User("carol", "carol", Role.USER, projects=("lab",))


def folder(fid: str = "f1", node: str = "node-a", **changes: object) -> Folder:
    base = Folder(fid, "data", "alice", "default", NOW, FolderStatus.READY, node_id=node, volume_id="v", host_path="/x")
    return base.evolve(**changes)


def code_and_field(call: object) -> tuple[str, str | None]:
    with pytest.raises(CaravanError) as failed:
        call()  # type: ignore[operator]
    return failed.value.code, failed.value.field


def test_modes_come_from_ownership_and_shares() -> None:
    f = folder(shared_with_users={"bob": FolderMode.RO}, shared_with_projects={"lab": FolderMode.RW})
    assert (mode_for(ALICE, f), mode_for(BOB, f), mode_for(CAROL, f)) == (FolderMode.RW, FolderMode.RO, FolderMode.RW)
    assert mode_for(User("dave", "dave", Role.USER, projects=("other",)), f) is None
    trashed = f.evolve(status=FolderStatus.TRASHED)
    assert (mode_for(ALICE, trashed), mode_for(BOB, trashed)) == (FolderMode.RW, None)


@pytest.mark.parametrize(
    "path", ["data", "/", "/..", "/a/../b", "/./a", "//a", "/a/", "/etc", "/tmp/x", "/secrets", "/a b", "/a\x00"]
)
def test_mount_paths_that_are_not_plain_absolute_paths_are_refused(path: str) -> None:
    assert code_and_field(lambda: check_mounts([MountRequest("f1", path)])) == ("INVALID_INPUT", "mounts.0.path")


def test_resolving_mounts_checks_visibility_mode_readiness_and_one_node() -> None:
    shared_ro = folder(shared_with_users={"bob": FolderMode.RO})
    assert code_and_field(lambda: resolve_mounts([MountRequest("f1", "/d")], {}, ALICE)) == (
        "NOT_FOUND", "mounts.0.folder",
    )  # fmt: skip
    assert code_and_field(lambda: resolve_mounts([MountRequest("f1", "/d")], {"f1": shared_ro}, CAROL))[0] == (
        "NOT_FOUND"
    )
    assert code_and_field(lambda: resolve_mounts([MountRequest("f1", "/d")], {"f1": shared_ro}, BOB)) == (
        "FORBIDDEN", "mounts.0.mode",
    )  # fmt: skip
    [mount] = resolve_mounts([MountRequest("f1", "/d", FolderMode.RO)], {"f1": shared_ro}, BOB)
    assert (mount.read_only, mount.node_id, mount.volume_name) == (True, "node-a", "caravan-folder-f1")
    creating = {"f1": folder(status=FolderStatus.CREATING, node_id=None)}
    assert code_and_field(lambda: resolve_mounts([MountRequest("f1", "/d")], creating, ALICE)) == (
        "INVALID_INPUT", "mounts.0.folder",
    )  # fmt: skip
    two_nodes = {"f1": folder(), "f2": folder("f2", node="node-b")}
    requests = [MountRequest("f1", "/a"), MountRequest("f2", "/b")]
    assert code_and_field(lambda: resolve_mounts(requests, two_nodes, ALICE)) == ("INVALID_INPUT", "mounts")


def test_a_session_mounting_a_folder_is_designated_to_its_node() -> None:
    request = SessionRequest(name="mounted", type=SessionType.INTERACTIVE, driver=Driver.EXEC)
    mounting = SessionRequest(**{**request.__dict__, "mounts": (MountRequest("f1", "/data"),)})
    rules = CreationRules(folders={"f1": folder()})
    [session] = build_sessions(mounting, viewer=ALICE, now=NOW, rules=rules)
    assert session.designated_agent == "node-a" and [m.path for m in session.mounts] == ["/data"]
    elsewhere = SessionRequest(**{**mounting.__dict__, "designated_agent": "node-b"})
    admin = User("root", "root", Role.SUPERADMIN)
    assert code_and_field(lambda: build_sessions(elsewhere, viewer=admin, now=NOW, rules=rules)) == (
        "INVALID_INPUT", "mounts",
    )  # fmt: skip
    system = SessionRequest(**{**request.__dict__, "type": SessionType.SYSTEM})
    assert code_and_field(lambda: build_sessions(system, viewer=admin, now=NOW))[0] == "FORBIDDEN"


@pytest.mark.parametrize("raw", ["..", "a/../b", "/etc/passwd", "a//b", "./a", "a\x00b", "a/\x01", "x" * 1025])
def test_folder_paths_that_could_leave_are_refused(raw: str) -> None:
    assert code_and_field(lambda: folder_path(raw)) == ("INVALID_INPUT", "path")


def test_folder_paths_are_nfc_parts() -> None:
    assert folder_path("cafe\u0301/x.txt") == ("caf\u00e9", "x.txt")
    assert folder_path("") == () and folder_path("/") == ()
    assert code_and_field(lambda: folder_path("", root_ok=False))[0] == "INVALID_INPUT"
    assert code_and_field(lambda: folder_path(".caravan-upload-x"))[0] == "INVALID_INPUT"


def key_line(kind: str, claimed: str | None = None) -> str:
    blob = struct.pack(">I", len(kind)) + kind.encode() + b"\x00" * 40
    return f"{claimed or kind} {base64.b64encode(blob).decode()} me@host"


def test_public_keys_are_one_line_of_a_known_type() -> None:
    assert checked_public_key(key_line("ssh-ed25519")) == key_line("ssh-ed25519").rsplit(" ", 1)[0]
    for bad in (key_line("ssh-dss"), key_line("ssh-rsa", claimed="ssh-ed25519"), "ssh-ed25519 !!!", "x\ny"):
        assert code_and_field(lambda bad=bad: checked_public_key(bad)) == ("INVALID_INPUT", "publicKey")


def test_folders_are_recounted_first_when_never_counted_then_once_the_interval_has_passed() -> None:
    counted = {"a": NOW - timedelta(seconds=30), "b": NOW - timedelta(seconds=90), "c": NOW - timedelta(seconds=60)}
    due = folders_to_recount(["a", "b", "c", "new"], counted, now=NOW, interval=60)
    assert due == ["new", "b", "c"]  # never counted first, then the longest waiting; "a" was counted 30 s ago
    assert folders_to_recount(["a"], counted, now=NOW + timedelta(seconds=29), interval=60) == []
    assert folders_to_recount(["a"], counted, now=NOW + timedelta(seconds=30), interval=60) == ["a"]
    assert folders_to_recount([], counted, now=NOW, interval=60) == []


def test_a_full_folder_is_mounted_read_only_only() -> None:
    rw, ro = MountRequest("f1", "/data", FolderMode.RW), MountRequest("f1", "/data", FolderMode.RO)
    with pytest.raises(CaravanError) as refused:
        resolve_mounts([rw], {"f1": folder()}, ALICE, full={"f1"})
    assert (refused.value.code, refused.value.field) == ("QUOTA_EXCEEDED", "mounts.0.folder")
    assert resolve_mounts([ro], {"f1": folder()}, ALICE, full={"f1"})[0].read_only
    assert not resolve_mounts([rw], {"f1": folder()}, ALICE, full={"f2"})[0].read_only
