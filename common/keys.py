"""Every Redis key Caravan uses, in one place (as arq's ``constants.py``).

All keys live under one prefix so that tests (and several Caravans on one Redis) stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def session(self, session_id: str) -> str:
        """JSON document of one session."""
        return f"{self.prefix}:session:{session_id}"

    @property
    def sessions_by_created(self) -> str:
        """ZSET of every session id scored by creation time (listing, paging)."""
        return f"{self.prefix}:sessions:by-created"

    def sessions_of_owner(self, owner_id: str) -> str:
        """ZSET of one owner's session ids scored by creation time."""
        return f"{self.prefix}:sessions:owner:{owner_id}"

    @property
    def sessions_live(self) -> str:
        """SET of session ids not yet in a terminal status (reconciliation walks it)."""
        return f"{self.prefix}:sessions:live"

    def pending_queue(self, resource_group: str) -> str:
        """ZSET of PENDING session ids of a resource group scored by creation time."""
        return f"{self.prefix}:queue:{resource_group}"

    @property
    def resource_groups(self) -> str:
        """SET of resource groups that have (or had) pending sessions."""
        return f"{self.prefix}:resource-groups"

    @property
    def work_to_submit(self) -> str:
        """SET of SCHEDULED session ids whose Nomad job may not be registered yet."""
        return f"{self.prefix}:sessions:to-submit"

    def live_name(self, owner_id: str, name: str) -> str:
        """Claim on a session name, unique per owner among live sessions."""
        return f"{self.prefix}:name:{owner_id}:{name}"

    def client_token(self, owner_id: str, token: str) -> str:
        """Idempotency record: a creation request's client token → the session id(s) it made."""
        return f"{self.prefix}:client-token:{owner_id}:{token}"

    def user(self, user_id: str) -> str:
        return f"{self.prefix}:user:{user_id}"

    def api_token(self, token_hash: str) -> str:
        """Hashed API token → user id."""
        return f"{self.prefix}:token:{token_hash}"

    @property
    def scheduler_wakeup(self) -> str:
        """LIST the gateway pushes to when there is new work; the scheduler blocks on it."""
        return f"{self.prefix}:scheduler:wakeup"

    @property
    def scheduler_lease(self) -> str:
        return f"{self.prefix}:lease:scheduler"

    @property
    def scheduler_fence(self) -> str:
        """Monotonic fencing counter: each new leadership term takes the next number."""
        return f"{self.prefix}:lease:scheduler:fence"

    @property
    def nomad_event_index(self) -> str:
        """Last Nomad event-stream index applied, to resume after a disconnect."""
        return f"{self.prefix}:nomad:event-index"

    def session_events(self, session_id: str) -> str:
        """Pub/sub channel of one session's status changes."""
        return f"{self.prefix}:events:session:{session_id}"

    def owner_events(self, owner_id: str) -> str:
        """Pub/sub channel of status changes of all of one owner's sessions."""
        return f"{self.prefix}:events:owner:{owner_id}"
