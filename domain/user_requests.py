"""Requests about users and API tokens, checked. Pure: no I/O.

Names, projects, labels and expiries are validated here, and so is who may make which change: a SUPERADMIN any;
an ADMIN creates and changes USERs only, only within the projects they administer; nobody raises themself
(a higher role, more projects). Whether the target user is visible at all (else NOT_FOUND) is the caller's
check, with ``domain.access.can_see_user``; these rules apply to a visible target and answer FORBIDDEN.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from core.durations import duration_input
from core.errors import Conflict, Forbidden, InvalidInput
from domain.access import manages_user
from domain.users import BOOTSTRAP_ADMIN_ID, Role, User

NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""User and project names: they are ids, and appear in Redis keys and Nomad job metadata."""
NAME_HELP = "1-64 characters: letters, digits, '_', '.' and '-', starting with a letter or digit"
MAX_PROJECTS = 32
MAX_LABEL = 64
MIN_TOKEN_LIFETIME = 1.0
MAX_TOKEN_LIFETIME = 366 * 86400.0


def checked_name(name: str) -> str:
    if not NAME_RULE.match(name):
        raise InvalidInput(f"name must be {NAME_HELP}", field="name")
    return name


def checked_projects(projects: Sequence[str]) -> tuple[str, ...]:
    """The projects in the order given, each once; at least one."""
    if not 1 <= len(projects) <= MAX_PROJECTS:
        raise InvalidInput(f"give 1 to {MAX_PROJECTS} projects", field="projects")
    for project in projects:
        if not NAME_RULE.match(project):
            raise InvalidInput(f"project {project[:80]!r} is not a valid name: {NAME_HELP}", field="projects")
    return tuple(dict.fromkeys(projects))


def checked_label(label: str) -> str:
    text = label.strip()
    if not 1 <= len(text) <= MAX_LABEL:
        raise InvalidInput(f"label must be 1-{MAX_LABEL} characters", field="label")
    if any(unicodedata.category(c).startswith("C") for c in text):
        raise InvalidInput("label cannot contain control characters", field="label")
    return text


def checked_expiry(expires_in: str | None, now: datetime) -> datetime | None:
    """When a token given ``expires_in`` (a duration such as ``"30d"``) expires; ``None``: never."""
    seconds = duration_input("expiresIn", expires_in, minimum=MIN_TOKEN_LIFETIME, maximum=MAX_TOKEN_LIFETIME)
    return None if seconds is None else now + timedelta(seconds=seconds)


def check_acts_for(viewer: User, target: User, field: str) -> None:
    """Tokens: a user's own, or those of a user ``viewer`` manages."""
    if target.id != viewer.id and not manages_user(viewer, target):
        raise Forbidden(f"you may not manage the tokens of user {target.id}", field=field)


def new_user(viewer: User, name: str, role: Role, projects: Sequence[str]) -> User:
    _check_administrator(viewer)
    user = User(id=checked_name(name), name=name, role=role, projects=checked_projects(projects))
    if viewer.role is Role.ADMIN:
        _check_admin_grant(viewer, user.role, user.projects)
    return user


def updated_user(viewer: User, target: User, role: Role | None, projects: Sequence[str] | None) -> User:
    """``target`` with a new role and/or projects, if ``viewer`` may make that change."""
    _check_administrator(viewer)
    after = replace(
        target,
        role=role or target.role,
        projects=checked_projects(projects) if projects is not None else target.projects,
    )
    if target.id == BOOTSTRAP_ADMIN_ID and after.role is not target.role:
        raise Forbidden("the bootstrap admin stays a SUPERADMIN (it is the configured way in)", field="role")
    if target.id == viewer.id:
        if after.role.rank > target.role.rank:
            raise Forbidden("nobody raises their own role", field="role")
        if viewer.role is not Role.SUPERADMIN and not set(after.projects) <= set(target.projects):
            raise Forbidden("you cannot add yourself to projects", field="projects")
        return after
    if not manages_user(viewer, target):
        raise Forbidden(f"you may not change user {target.id}", field="id")
    if viewer.role is Role.ADMIN:
        _check_admin_grant(viewer, after.role, after.projects)
    return after


def check_deactivation(viewer: User, target: User) -> None:
    _check_activation_change(viewer, target, "deactivate")
    if target.id == BOOTSTRAP_ADMIN_ID:
        raise Forbidden("the bootstrap admin cannot be deactivated (it is the configured way in)", field="id")


def reactivated(viewer: User, target: User) -> User:
    """``target`` active again, if ``viewer`` may deactivate them (the same rules); CONFLICT if they are active. Their
    tokens stay revoked: they get new ones from ``issueToken``."""
    _check_activation_change(viewer, target, "reactivate")
    if target.active:
        raise Conflict(f"user {target.id} is active", field="id")
    return replace(target, active=True)


def _check_activation_change(viewer: User, target: User, verb: str) -> None:
    _check_administrator(viewer)
    if target.id == viewer.id:
        raise Forbidden(f"you cannot {verb} yourself", field="id")
    if not manages_user(viewer, target):
        raise Forbidden(f"you may not {verb} user {target.id}", field="id")


def _check_administrator(viewer: User) -> None:
    if viewer.role is Role.USER:
        raise Forbidden("only administrators manage users")


def _check_admin_grant(viewer: User, role: Role, projects: Sequence[str]) -> None:
    if role is not Role.USER:
        raise Forbidden("an ADMIN may only make USERs", field="role")
    outside = [p for p in projects if p not in viewer.projects]
    if outside:
        raise Forbidden(f"you do not administer project {outside[0]}", field="projects")
