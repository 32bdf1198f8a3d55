"""Storage folders mounted into sessions: the input of createSession (and templates) and what a session shows."""

from __future__ import annotations

from collections.abc import Sequence

import strawberry

from domain import storage
from domain.model import Session
from gateway.graphql.folders.types import FolderMode


@strawberry.input(description="A storage folder to mount into every kernel of the session.")
class MountInput:
    folder: strawberry.ID = strawberry.field(description="The folder's id (one you see: yours or shared with you).")
    path: str = strawberry.field(
        description="Where the kernel sees it: absolute, 1-8 parts of letters, digits, '_', '.', '-' "
        "(not under /bin, /etc, /proc, /tmp, ... or Nomad's /alloc, /local, /secrets)."
    )
    mode: FolderMode = strawberry.field(default=FolderMode.RW, description="RO, or RW (needs an RW share).")


@strawberry.type(description="A folder mounted into a session (or asked by a template).")
class SessionMount:
    folder: strawberry.ID
    path: str
    mode: FolderMode


def mounts_of(inputs: Sequence[MountInput]) -> tuple[storage.MountRequest, ...]:
    return tuple(storage.MountRequest(folder=str(m.folder), path=m.path, mode=m.mode) for m in inputs)


def mount_inputs_of(requests: Sequence[storage.MountRequest]) -> list[MountInput]:
    return [MountInput(folder=strawberry.ID(m.folder), path=m.path, mode=m.mode) for m in requests]


def mount_specs_of(requests: Sequence[storage.MountRequest]) -> list[SessionMount]:
    return [SessionMount(folder=strawberry.ID(m.folder), path=m.path, mode=m.mode) for m in requests]


def session_mounts_of(session: Session) -> list[SessionMount]:
    return [
        SessionMount(
            folder=strawberry.ID(m.folder_id), path=m.path, mode=FolderMode.RO if m.read_only else FolderMode.RW
        )
        for m in session.mounts
    ]
