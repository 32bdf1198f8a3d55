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

    @property
    def batch_deadlines(self) -> str:
        """ZSET of RUNNING BATCH session ids scored by when their batch timeout expires."""
        return f"{self.prefix}:sessions:batch-deadlines"

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

    @property
    def scheduler_roundrobin(self) -> str:
        """HASH resource group -> next agent index of the round-robin selector (survives a new leader)."""
        return f"{self.prefix}:scheduler:roundrobin"

    @property
    def known_slot_types(self) -> str:
        """HASH slot name -> slot type (``count``/``bytes``) of every slot any agent ever reported; never shrinks.

        Written by the scheduler, read by the gateway to refuse requests for slots no agent has."""
        return f"{self.prefix}:scheduler:slot-types"

    def user_policy(self, user_id: str) -> str:
        """JSON resource policy of one user (concurrency, pending and slot limits)."""
        return f"{self.prefix}:policy:user:{user_id}"

    def project_policy(self, project: str) -> str:
        """JSON resource policy of one project (slot limits)."""
        return f"{self.prefix}:policy:project:{project}"

    @property
    def idle_lease(self) -> str:
        return f"{self.prefix}:lease:idle"

    @property
    def idle_fence(self) -> str:
        """Fencing counter of the idle checker's leadership terms."""
        return f"{self.prefix}:lease:idle:fence"

    @property
    def idle_last_activity(self) -> str:
        """ZSET of session ids scored by their last user traffic (unix seconds), written by the gateway."""
        return f"{self.prefix}:idle:last-activity"

    def idle_connections(self, session_id: str) -> str:
        """ZSET of a session's open app connections, scored by when each lapses unless refreshed."""
        return f"{self.prefix}:idle:connections:{session_id}"

    def idle_report(self, session_id: str) -> str:
        """JSON of the idle checker's last verdict on a session (short TTL; GraphQL ``idleChecks``)."""
        return f"{self.prefix}:idle:report:{session_id}"

    @property
    def idle_windows(self) -> str:
        """HASH session id -> utilization window JSON, saved now and then so a new leader resumes."""
        return f"{self.prefix}:idle:windows"

    @property
    def idle_policy(self) -> str:
        """HASH of the policy the idle checker enforces: ``source`` (file path or "built-in") and ``text``."""
        return f"{self.prefix}:idle:policy"

    def session_events(self, session_id: str) -> str:
        """Pub/sub channel of one session's status changes."""
        return f"{self.prefix}:events:session:{session_id}"

    def owner_events(self, owner_id: str) -> str:
        """Pub/sub channel of status changes of all of one owner's sessions."""
        return f"{self.prefix}:events:owner:{owner_id}"

    def rate_limit(self, subject: str, window: int) -> str:
        """Counter of one API token's (or client address's) GraphQL requests in one fixed window; expires with it."""
        return f"{self.prefix}:rate:{subject}:{window}"
