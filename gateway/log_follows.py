"""How many kernel logs (``kernelLogs`` subscriptions) a gateway process, one user and one WebSocket connection follow
at once.

Each follow holds one connection of the Nomad client's follow pool (``nomad_jobs.client.LOG_FOLLOWS``) for as long as
it runs; a follow beyond the pool would wait for a free one without a word, for as long as the others run. So a
subscription beyond any cap is refused at once, with ``TOO_MANY_LOG_FOLLOWS`` and the cap it hit (``limit``, ``per``:
``connection``, ``user`` or ``gateway``); ending another frees its place. The user's cap is below the pool, so that
one user following from many connections leaves follows to the others (as ``gateway.kernel_exec`` does for execs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from core.errors import CaravanError


class TooManyLogFollows(CaravanError):
    code = "TOO_MANY_LOG_FOLLOWS"


class LogFollows:
    """The follows of one gateway process: at most ``per_process`` at once, ``per_user`` of one user's (all their
    connections together), ``per_connection`` of one connection's."""

    def __init__(self, per_process: int, per_user: int, per_connection: int) -> None:
        self.per_process = per_process
        self.per_user = per_user
        self.per_connection = per_connection
        self.open = 0
        """Follows running (or waiting for their kernel to start) in this process."""
        self.users: dict[str, int] = {}
        """User id -> their follows running in this process (a user without one is left out)."""

    def connection(self) -> ConnectionFollows:
        """The follows of a new connection (or request)."""
        return ConnectionFollows(self)


class ConnectionFollows:
    def __init__(self, process: LogFollows) -> None:
        self.process = process
        self.open = 0

    @contextlib.contextmanager
    def claimed(self, user_id: str) -> Iterator[None]:
        """A place for one follow of ``user_id``'s while the block runs; ``TooManyLogFollows`` when there is none."""
        process = self.process
        if self.open >= process.per_connection:
            raise TooManyLogFollows(
                f"this connection already follows {self.open} kernel logs, the most one connection may follow at "
                f"once (CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS): complete one first",
                limit=process.per_connection,
                per="connection",
            )
        following = process.users.get(user_id, 0)
        if following >= process.per_user:
            raise TooManyLogFollows(
                f"you already follow {following} kernel logs on this gateway, the most one user may follow at once "
                f"(CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS): complete one first",
                limit=process.per_user,
                per="user",
            )
        if process.open >= process.per_process:
            raise TooManyLogFollows(
                f"this gateway already follows {process.open} kernel logs, the most it follows at once: retry later "
                f"or read the logs without following them (Kernel.logs)",
                limit=process.per_process,
                per="gateway",
            )
        self.open += 1
        process.open += 1
        process.users[user_id] = following + 1
        try:
            yield
        finally:
            self.open -= 1
            process.open -= 1
            left = process.users[user_id] - 1
            if left:
                process.users[user_id] = left
            else:
                del process.users[user_id]
