"""Session templates: a named set of creation parameters, overridable at creation: the model and who may use and
write which (pure). Kept in Redis by ``stores.templates``.

A template is PERSONAL (its owner's; like any object of theirs, their project's admins reach it too) or PROJECT
(usable by every member of its project, written by the project's admins). The spec's values are checked with the
creation rules (``domain.session_requests.check_request``) when the template is written, and again at every creation
from it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from core.errors import InvalidInput
from domain.access import administers, can_access
from domain.apps import App
from domain.model import DEFAULT_PRIORITY, ClusterMode, Driver, RoleSpec, SessionType
from domain.storage import MountRequest
from domain.users import Role, User

TEMPLATE_NAME_RULE = re.compile(r"^[A-Za-z0-9_.-](?:[A-Za-z0-9 _.-]{0,62}[A-Za-z0-9_.-])?$")


class TemplateScope(StrEnum):
    PERSONAL = "PERSONAL"
    PROJECT = "PROJECT"


@dataclass(frozen=True)
class TemplateSpec:
    """The creation parameters a template stores, as the user gave them (slots and durations unnormalized): every
    option of a creation but those of one creation (its session name, idempotency key, dependencies, owner and
    project). The names are ``domain.session_requests.SessionRequest``'s."""

    type: SessionType = SessionType.INTERACTIVE
    driver: Driver = Driver.DOCKER
    image: str | None = None
    startup_command: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    resources: dict[str, str] = field(default_factory=dict)
    resource_group: str = "default"
    starts_at: str | None = None
    """BATCH: an ISO 8601 moment, or a duration counted from each creation (``"1h"``)."""
    batch_timeout: str | None = None
    """BATCH: a duration (``"30s"``)."""
    cluster_size: int = 1
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    count: int = 1
    """Sessions each creation makes."""
    preopen_ports: tuple[int, ...] = ()
    shared_memory: str | None = None
    """/dev/shm of docker kernels, as written (``"64m"``)."""
    designated_agent: str | None = None
    priority: int = DEFAULT_PRIORITY
    preset: str | None = None
    kernel_roles: dict[str, RoleSpec] = field(default_factory=dict)
    """Role (``main``, ``sub``) -> its own image and slots."""
    replicas: int | None = None
    service_port: int | None = None
    health_check_path: str | None = None
    health_check_grace: str | None = None
    """INFERENCE: a duration (``"30s"``)."""
    apps: tuple[App, ...] = ()
    """Named ports the gateway proxies (``domain.apps``)."""
    mounts: tuple[MountRequest, ...] = ()
    """Storage folders to mount (by id), checked again at every creation."""

    def given(self) -> frozenset[str]:
        """The fields whose value is not the default: what the template sets."""
        blank = TemplateSpec()
        return frozenset(f.name for f in fields(self) if getattr(self, f.name) != getattr(blank, f.name))


@dataclass(frozen=True)
class Template:
    id: str
    name: str
    owner_id: str
    project: str
    scope: TemplateScope
    spec: TemplateSpec
    created_at: datetime
    updated_at: datetime

    def evolve(self, **changes: Any) -> Template:
        return replace(self, **changes)


# -- decisions (pure) --


def may_use(viewer: User, template: Template) -> bool:
    """May ``viewer`` see ``template`` and create sessions from it? (Not: NOT_FOUND.)"""
    if template.scope is TemplateScope.PROJECT:
        return viewer.role is Role.SUPERADMIN or template.project in viewer.projects
    return can_access(viewer, template.owner_id, template.project)


def may_write(viewer: User, template: Template) -> bool:
    """May ``viewer`` update or delete ``template``? (Usable but not writable: FORBIDDEN.)"""
    if template.scope is TemplateScope.PROJECT:
        return administers(viewer, template.project)
    return can_access(viewer, template.owner_id, template.project)


def check_template_name(name: str) -> None:
    if not TEMPLATE_NAME_RULE.match(name):
        raise InvalidInput("a template name is 1-64 characters: letters, digits, spaces, '_', '.', '-'", field="name")


def new_template(
    *, name: str, owner: User, project: str, scope: TemplateScope, spec: TemplateSpec, now: datetime
) -> Template:
    """A template to store, once the caller has checked the spec and that ``owner`` may write it there."""
    check_template_name(name)
    return Template(str(uuid.uuid4()), name, owner.id, project, scope, spec, now, now)
