"""Bearer tokens the app proxy checked a moment ago, remembered in this gateway process for :data:`TTL` seconds.

Without it every proxied request pays a Redis round trip for its token (``UserStore.authenticate``) before the one
for its session. A hit needs none. Revocation stays immediate: every revocation (``revokeToken``,
``deactivateUser``, a replaced bootstrap token) is in the stream :class:`gateway.revocations.RevocationWatch` reads,
and the watch drops the token's entry here as it reads it (within its ``XREAD``'s delivery, milliseconds). An entry is
only filled when no revocation arrived while its Redis check ran (a revocation read between the check and the fill
could otherwise be outlived by the entry), and the cache is cleared and bypassed while the watch cannot read the
stream. What the cache may hold stale for up to :data:`TTL` is the user's role and projects (an admin demoted a second
ago may pass once more); an app's session is read from Redis at every request, never cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from domain.users import hash_token
from gateway.revocations import RevocationWatch
from stores.users import Authenticated, UserStore

TTL = 2.0
"""Seconds a checked token is trusted without asking Redis again (bounded further by the token's own expiry)."""
MAX_ENTRIES = 10_000
"""Tokens remembered at once; beyond, the memory is cleared (each then costs one Redis check again)."""


@dataclass(frozen=True)
class _Entry:
    found: Authenticated
    until: float
    """Monotonic second after which the entry is not used."""


class TokenCache:
    """``authenticate`` as :class:`UserStore` answers it, remembered per token hash for a moment."""

    def __init__(self, users: UserStore, revocations: RevocationWatch, ttl: float = TTL) -> None:
        self.users = users
        self.revocations = revocations
        self.ttl = ttl
        self._entries: dict[str, _Entry] = {}
        self._generation = 0
        """Counts revocations read (and read failures): a check that saw it change fills nothing."""
        revocations.listen(self._revoked)

    def _revoked(self, token_hash: str | None) -> None:
        """The watch read a revocation of ``token_hash``, or (None) could not read: forget it, or everything."""
        self._generation += 1
        if token_hash is None:
            self._entries.clear()
        else:
            self._entries.pop(token_hash, None)

    def lookup(self, token_hash: str, monotonic: float) -> Authenticated | None:
        """The remembered answer for ``token_hash`` at monotonic second ``monotonic``, if still trusted."""
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        if monotonic >= entry.until:
            del self._entries[token_hash]
            return None
        return entry.found

    async def authenticate(self, token: str, monotonic: float, now: datetime) -> Authenticated | None:
        """Who ``token`` belongs to (None: unknown, revoked, expired or deactivated); Redis only on a miss."""
        token_hash = hash_token(token)
        found = self.lookup(token_hash, monotonic)
        if found is not None and (found.expires_at is None or found.expires_at > now):
            return found
        await self.revocations.open()  # the watch reads from before the check below
        generation = self._generation
        found = await self.users.authenticate(token, now)
        if found is not None and generation == self._generation and self.revocations.reading:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[token_hash] = _Entry(found, monotonic + self.ttl)
        return found
