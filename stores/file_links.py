"""Download links to a folder's file: how a browser downloads a large file without its API token in a URL and without
holding the file in memory (Redis).

1. ``POST /folders/{id}/files/link?path=…`` (with the token) stores a **link**: a random secret, single use, valid
   :data:`LINK_TTL` seconds, kept under its SHA-256 and holding the token's hash, the folder and the path.
2. The browser opens ``/folders/download/<secret>``; the gateway takes the link (``GETDEL``: a second use finds
   nothing) and streams the file as an attachment, after checking again that the token is still valid (a revoked
   token or a deactivated user downloads nothing) and still reads the folder (an unshared folder neither).

Only hashes of the secrets are stored: a leak of Redis' contents downloads nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from redis.asyncio import Redis

from core.codec import MalformedDocument, decode, encode
from core.keys import Keys
from core.replies import optional_text
from domain.users import hash_token

LINK_TTL = 60
"""Seconds a download link may wait to be opened."""


@dataclass(frozen=True, slots=True)
class FileLink:
    """What a download link stands for."""

    token_hash: str
    """The SHA-256 of the API token that made it: the token must still be valid when the link is opened."""
    folder_id: str
    path: str
    """The file's path in the folder, as checked by ``domain.folder_paths`` when the link was made."""


class FileLinkStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def new_link(self, token: str, folder_id: str, path: str) -> str:
        """A fresh link's secret (it is not stored: only its hash is)."""
        secret = secrets.token_urlsafe(32)
        link = FileLink(hash_token(token), folder_id, path)
        await self.redis.set(self.keys.file_link(hash_token(secret)), encode(link), ex=LINK_TTL)
        return secret

    async def take(self, secret: str) -> FileLink | None:
        """The link, once: it is gone after this call (None: unknown, used or expired)."""
        found = optional_text(await self.redis.getdel(self.keys.file_link(hash_token(secret))))
        if found is None:
            return None
        try:
            return decode(found, FileLink)
        except MalformedDocument:
            return None
