"""``requestSftp``: SFTP access to some of the viewer's folders through a SYSTEM session (``domain.sftp``) that mounts
only them, reachable with the key the user gives or one generated here and shown once."""

from __future__ import annotations

import dataclasses
import secrets

import strawberry
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core.clock import utcnow
from core.errors import Unavailable
from domain.session_requests import build_sessions
from domain.sftp import SFTP_PORT, SFTP_USER, checked_public_key, sftp_request
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.folders.queries import folder_of_viewer
from gateway.graphql.sessions.types import Session, session_type_of


@strawberry.input
class RequestSftpInput:
    folders: list[strawberry.ID] = strawberry.field(description="1-8 folders you see (RO shares are served RO).")
    public_key: str | None = strawberry.field(
        default=None,
        description="An OpenSSH public key line ('ssh-ed25519 AAAA...'); left out: a key pair is generated and its "
        "private key returned once (privateKey).",
    )


@strawberry.type(description="An SFTP system session: connect once it is RUNNING, at session.sftpAddress.")
class SftpAccess:
    session: Session
    user: str = strawberry.field(description="The account to log in as.")
    port: int = strawberry.field(description="The server's port in its kernel (the address maps it).")
    private_key: str | None = strawberry.field(
        description="Generated keys only: the OpenSSH private key, shown this once (save it with mode 0600)."
    )


def generated_key_pair() -> tuple[str, str]:
    """A new Ed25519 key pair: (OpenSSH private key, public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


@strawberry.type
class SftpMutations:
    @fields.mutation(
        description="Start an SFTP server (a SYSTEM session, reclaimed when idle like any) that sees only these "
        "folders under /folders/<name> (mounted in the kernel at /srv/folders/<name>: sshd's chroot is /srv), for "
        "one key; SFTP only (no shell, no forwarding)."
    )
    async def request_sftp(self, info: Info, input: RequestSftpInput) -> SftpAccess:
        ctx = info.context
        viewer = ctx.viewer
        image = ctx.settings.sftp_image
        if image is None:
            raise Unavailable("SFTP is not set up here (CARAVAN_SFTP_IMAGE; ops/build-sftp-image)", field="folders")
        private_key = None
        if input.public_key is None:
            private_key, public_key = generated_key_pair()
        else:
            public_key = checked_public_key(input.public_key)
        folders = [await folder_of_viewer(ctx, str(f), viewer, field="folders") for f in input.folders]
        request = sftp_request(folders, public_key, image=image, name=f"sftp-{secrets.token_hex(4)}")
        rules = await ctx.creation.rules(
            resource_group=request.resource_group, preset=None, folders=[f.id for f, _ in folders]
        )
        platform = dataclasses.replace(rules, platform=True)  # the one creation of a SYSTEM session
        sessions = build_sessions(request, viewer=viewer, now=utcnow(), rules=platform)
        [stored] = await ctx.creation.store(sessions, viewer=viewer, client_token=None)
        return SftpAccess(session=session_type_of(stored), user=SFTP_USER, port=SFTP_PORT, private_key=private_key)
