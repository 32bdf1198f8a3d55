"""Who may see and act on what. Pure: decisions on a viewer and an object's owner and project.

- A USER sees and acts on their own objects only.
- An ADMIN also on every object of the projects they belong to (``User.projects``): they administer those.
- A SUPERADMIN on everything.

Callers answer NOT_FOUND (never FORBIDDEN) when an object exists but is not visible, so that its
existence is not revealed.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.users import Role, User


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
