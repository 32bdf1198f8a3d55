"""Each request's and each user's share of the gateway's Nomad connections.

The gateway process has one Nomad client whose pool (``nomad_jobs.client.CONNECTIONS`` connections) every request
shares. A call of a request first takes a slot of that request's own semaphore (``CARAVAN_GRAPHQL_MAX_NOMAD_CALLS``,
so one query's fan-out runs a few calls at a time), then one of its user's (``CARAVAN_GRAPHQL_MAX_USER_NOMAD_CALLS``,
shared by all the user's requests in this process and below the pool size): however many heavy queries one user
sends, they hold at most that many connections, and another user's call finds one free at once while fewer than
``CONNECTIONS / max_user_nomad_calls`` users are that busy. Both semaphores are FIFO; a call's wait for them counts
against its timeout (:meth:`nomad_jobs.client.NomadClient.admitted`), so a starved call fails ``UNAVAILABLE`` rather
than hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator

from nomad_jobs.client import Admission


class NomadShares:
    def __init__(self, per_request: int, per_user: int) -> None:
        """``per_request``, ``per_user``: Nomad calls in flight at once per request, per user."""
        self.per_request = per_request
        self.per_user = per_user
        self._users: weakref.WeakValueDictionary[str, asyncio.Semaphore] = weakref.WeakValueDictionary()
        """A user's semaphore lives while one of their requests holds it."""

    def admission(self, user_id: str) -> Admission:
        """The admission of a new request of ``user_id``'s (for ``NomadClient.admitted``)."""
        user = self._users.get(user_id)
        if user is None:
            user = self._users[user_id] = asyncio.Semaphore(self.per_user)
        request = asyncio.Semaphore(self.per_request)

        @contextlib.asynccontextmanager
        async def admitted() -> AsyncIterator[None]:
            async with request, user:
                yield

        return admitted
