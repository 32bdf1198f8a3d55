"""The one admission path of new sessions, below the services: what a creation is checked against, read from Redis
and the settings (:func:`read_creation_rules`: ``domain.session_requests.CreationRules``), and the owner's and
project's resource policies it is admitted under (:class:`Policies`: ``domain.resource_policies.check_admission``, and
the owner's pending limit, checked exactly as the sessions are stored).

:class:`SessionCreation` holds both for one caller. Every creation goes through it: the gateway's ``createSession``
(and ``createSessionFromTemplate``), ``requestSftp``, a schedule's ``createSchedule`` and ``updateSchedule`` (its runs'
sessions checked and admitted then, so a schedule its runs would fail is refused), and the scheduler's schedule runner
at each run (which reads the policies of many owners at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from domain.autoscaling import ScalingRules
from domain.endpoint_scaling import check_replica_ceiling
from domain.model import Session
from domain.resource_policies import ProjectResourcePolicy, UserResourcePolicy, check_admission
from domain.scheduling_config import SchedulingConfig
from domain.session_requests import CreationRules
from domain.storage import at_bytes_quota
from domain.users import User
from stores.environments import EnvironmentStore
from stores.folders import FolderStore
from stores.images import ImageStore
from stores.known_resources import known_resource_groups, known_slot_types
from stores.presets import PresetStore
from stores.resource_policies import PolicyStore, pending_admission
from stores.sessions import Admission, SessionStore


async def read_creation_rules(
    redis: Redis,
    keys: Keys,
    settings: Settings,
    config: SchedulingConfig,
    *,
    resource_group: str,
    preset: str | None,
    folders: Sequence[str] = (),
    images: Sequence[str] = (),
    users: Sequence[str] = (),
) -> CreationRules:
    """The rules for a session in ``resource_group`` with ``preset``: known slots and groups, images, the preset, the
    group's allowed drivers and default resources in the scheduling configuration ``config``, and the storage
    ``folders`` it mounts (and which of them are full: their owner or project at a bytes quota), and the committed
    ``images`` it names (``ImageStore.named``, for the ``users`` who ask)."""
    store = FolderStore(redis, keys)
    mounted = {f.id: f for f in await store.many(dict.fromkeys(folders))}
    full = set()
    for folder in mounted.values():
        user_bytes, project_bytes = await store.bytes_of(folder.owner_id, folder.project)
        if at_bytes_quota(user_bytes=user_bytes, project_bytes=project_bytes, quota=settings.storage):
            full.add(folder.id)
    return CreationRules(
        known_slots=await known_slot_types(redis, keys),
        default_image=settings.default_image,
        docker_images=settings.docker_images,
        presets=await PresetStore(redis, keys).named(preset),
        qemu_images=settings.qemu_images,
        allowed_drivers=config.drivers_allowed(resource_group),
        known_groups=await known_resource_groups(redis, keys, configured=config.groups),
        default_resources=config.default_resources(resource_group),
        folders=mounted,
        full_folders=frozenset(full),
        committed_images=await ImageStore(redis, keys).named(images, users),
        environments=await EnvironmentStore(redis, keys).all(),
    )


@dataclass(frozen=True)
class Policies:
    """The stored resource policies of some owners and projects (those without one are left out)."""

    users: Mapping[str, UserResourcePolicy]
    projects: Mapping[str, ProjectResourcePolicy]

    def admit(self, sessions: Sequence[Session], *, viewer: User) -> Admission | None:
        """Refuse (``FORBIDDEN``) a creation of ``sessions`` the policies do not allow ``viewer`` (who asks; the
        runner passes the owner); else the check of the owner's pending limit that ``SessionStore.create`` runs as it
        stores them (``QUOTA_EXCEEDED``, exact under racing creations), None without a limit."""
        first = sessions[0]
        user = self.users.get(first.owner_id)
        check_admission(first, viewer=viewer, user=user, project=self.projects.get(first.project))
        self.admit_replicas(first, first.autoscaling)
        limit = user.max_pending_sessions if user is not None else None
        return pending_admission(first.owner_id, limit, adding=len(sessions))

    def admit_replicas(
        self, session: Session, rules: ScalingRules | None, *, replica: Mapping[str, str] | None = None
    ) -> None:
        """Refuse (``FORBIDDEN``) an endpoint whose most replicas under ``rules`` the owner's or the project's policy
        could never hold (``check_replica_ceiling``), each of ``replica``'s slots when given (a rolling update's new
        slots): a creation is checked so, and so is an update of the rules or of the replicas' slots."""
        user, project = self.users.get(session.owner_id), self.projects.get(session.project)
        check_replica_ceiling(session, rules, user=user, project=project, replica=replica)


class SessionCreation:
    """The admission path for one caller: the creation rules read with its settings and scheduling configuration, the
    policies read as they are stored now."""

    def __init__(self, sessions: SessionStore, settings: Settings, config: SchedulingConfig) -> None:
        self.sessions = sessions
        self.settings = settings
        self.config = config
        self.policy_store = PolicyStore(sessions.redis, sessions.keys)

    async def rules(
        self,
        *,
        resource_group: str,
        preset: str | None,
        folders: Sequence[str] = (),
        images: Sequence[str] = (),
        users: Sequence[str] = (),
    ) -> CreationRules:
        """The configuration a new session (or a template's spec) is checked against, with the storage ``folders``
        it mounts and the committed ``images`` it names, for the ``users`` it is checked for
        (:func:`read_creation_rules`)."""
        store = self.sessions
        return await read_creation_rules(
            store.redis,
            store.keys,
            self.settings,
            self.config,
            resource_group=resource_group,
            preset=preset,
            folders=folders,
            images=images,
            users=users,
        )

    async def policies(self, owners: Iterable[str], projects: Iterable[str]) -> Policies:
        """The policies of ``owners`` and ``projects``: two Redis reads, however many."""
        users, found = await asyncio.gather(self.policy_store.users(owners), self.policy_store.projects(projects))
        return Policies(users, found)

    async def admit(self, sessions: Sequence[Session], *, viewer: User) -> Admission | None:
        """:meth:`Policies.admit` with the owner's and the project's policies as stored now."""
        first = sessions[0]
        return (await self.policies([first.owner_id], [first.project])).admit(sessions, viewer=viewer)

    async def store(self, sessions: Sequence[Session], *, viewer: User, client_token: str | None) -> list[Session]:
        """Admit the new ``sessions`` (:meth:`admit`), then store them atomically, under the owner's pending limit
        (a repeated ``client_token`` returns the first call's sessions)."""
        admit = await self.admit(sessions, viewer=viewer)
        return await self.sessions.create(sessions, client_token=client_token, admit=admit)
