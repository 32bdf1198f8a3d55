"""Who may see and act on what. Pure: decisions on a viewer and an object's owner and project.

- A USER sees and acts on their own objects only.
- An ADMIN also on every object of the projects they belong to (``User.projects``): they administer those.
- A SUPERADMIN on everything.

Users themselves are objects too: see ``can_see_user`` and ``manages_user``.

Callers answer NOT_FOUND (never FORBIDDEN) when an object exists but is not visible, so that its
existence is not revealed.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.users import Role, User


def can_access(viewer: User, owner_id: str, project: str) -> bool:
    """May ``viewer`` see and act on an object owned by ``owner_id`` in ``project``?"""
    if viewer.role is Role.SUPERADMIN or owner_id == viewer.id:
        return True
    return viewer.role is Role.ADMIN and project in viewer.projects


def administers(viewer: User, project: str) -> bool:
    """May ``viewer`` manage ``project`` itself (its policies, project templates, members' sessions)?"""
    return viewer.role is Role.SUPERADMIN or (viewer.role is Role.ADMIN and project in viewer.projects)


@dataclass(frozen=True)
class Scope:
    """What a listing may return for a viewer: everything, or the union of some owners' and projects' objects."""

    everything: bool
    owners: tuple[str, ...] = ()
    projects: tuple[str, ...] = ()


def listing_scope(viewer: User) -> Scope:
    if viewer.role is Role.SUPERADMIN:
        return Scope(everything=True)
    if viewer.role is Role.ADMIN:
        return Scope(everything=False, owners=(viewer.id,), projects=viewer.projects)
    return Scope(everything=False, owners=(viewer.id,))


def can_see_user(viewer: User, target: User) -> bool:
    """Is ``target`` visible to ``viewer`` (``users``, ``user``)? Yourself; for an ADMIN every member of a project
    they administer; everyone for a SUPERADMIN. A user not visible is NOT_FOUND."""
    if viewer.role is Role.SUPERADMIN or target.id == viewer.id:
        return True
    return viewer.role is Role.ADMIN and not set(target.projects).isdisjoint(viewer.projects)


def manages_user(viewer: User, target: User) -> bool:
    """May ``viewer`` act for another user (their tokens, role, projects, deactivation)? A SUPERADMIN for anyone; an
    ADMIN for a USER all of whose projects they administer (acting for them reaches all their sessions)."""
    if viewer.role is Role.SUPERADMIN:
        return True
    return viewer.role is Role.ADMIN and target.role is Role.USER and set(target.projects) <= set(viewer.projects)


def may_create_for(viewer: User, owner_id: str) -> bool:
    """May ``viewer`` create sessions owned by ``owner_id``? Their own; a SUPERADMIN's for anyone."""
    return owner_id == viewer.id or viewer.role is Role.SUPERADMIN
