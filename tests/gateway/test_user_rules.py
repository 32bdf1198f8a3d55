"""The pure rules about users: who sees and manages whom, who may make which change, a new session's project."""

from __future__ import annotations

import pytest

from core.errors import CaravanError, Forbidden, InvalidInput
from domain.access import can_see_user, manages_user, may_create_for
from domain.session_requests import session_project
from domain.user_requests import checked_projects, new_user, updated_user
from domain.users import BOOTSTRAP_ADMIN_ID, Role, User

ROOT = User("root", "root", Role.SUPERADMIN, ("ops",))
CAROL = User("carol", "carol", Role.ADMIN, ("ml", "cv"))
ERIN = User("erin", "erin", Role.ADMIN, ("ml",))
ALICE = User("alice", "alice", Role.USER, ("ml",))
FRANK = User("frank", "frank", Role.USER, ("ml", "web"))
BOB = User("bob", "bob", Role.USER, ("web",))
BOOTSTRAP = User(BOOTSTRAP_ADMIN_ID, "admin", Role.SUPERADMIN)


@pytest.mark.parametrize(
    ("viewer", "target", "sees", "manages"),
    [
        (ALICE, ALICE, True, False),  # oneself: seen; one's own tokens are allowed by their own rule
        (ALICE, FRANK, False, False),  # a USER sees no one else, even in the same project
        (CAROL, ALICE, True, True),  # a USER wholly inside carol's projects
        (CAROL, FRANK, True, False),  # shares ml, but is also in web, which carol does not administer
        (CAROL, BOB, False, False),
        (CAROL, ERIN, True, False),  # a fellow ADMIN: seen, not managed
        (CAROL, ROOT, False, False),
        (ROOT, BOB, True, True),
        (ROOT, CAROL, True, True),
    ],
)
def test_who_sees_and_manages_whom(viewer: User, target: User, sees: bool, manages: bool) -> None:
    assert (can_see_user(viewer, target), manages_user(viewer, target)) == (sees, manages)


def test_only_a_superadmin_creates_sessions_for_others() -> None:
    assert may_create_for(ALICE, "alice") and may_create_for(ROOT, "alice")
    assert not may_create_for(CAROL, "alice")


@pytest.mark.parametrize(
    ("viewer", "target", "role", "projects", "refused"),
    [
        (CAROL, ALICE, None, ["ml", "cv"], None),
        (CAROL, ALICE, Role.ADMIN, None, (Forbidden, "role")),
        (CAROL, ALICE, None, ["web"], (Forbidden, "projects")),
        (CAROL, FRANK, None, ["ml"], (Forbidden, "id")),  # not wholly hers
        (CAROL, ERIN, None, ["ml"], (Forbidden, "id")),  # a fellow ADMIN
        (CAROL, CAROL, Role.SUPERADMIN, None, (Forbidden, "role")),  # raising oneself
        (CAROL, CAROL, None, ["ml", "cv", "web"], (Forbidden, "projects")),
        (CAROL, CAROL, Role.USER, ["ml"], None),  # lowering oneself is fine
        (ALICE, ALICE, None, ["ml"], (Forbidden, None)),  # USERs change nobody, themselves included
        (ROOT, ALICE, Role.SUPERADMIN, ["x", "y"], None),
        (ROOT, ROOT, None, ["anything"], None),
        (ROOT, BOOTSTRAP, Role.ADMIN, None, (Forbidden, "role")),
        (ROOT, ALICE, None, [], (InvalidInput, "projects")),
        (ROOT, ALICE, None, ["not valid"], (InvalidInput, "projects")),
    ],
)
def test_who_changes_whom(
    viewer: User,
    target: User,
    role: Role | None,
    projects: list[str] | None,
    refused: tuple[type[CaravanError], str | None] | None,
) -> None:
    if refused is None:
        after = updated_user(viewer, target, role, projects)
        assert after.role is (role or target.role)
        assert after.projects == (tuple(projects) if projects is not None else target.projects)
        return
    with pytest.raises(refused[0]) as error:
        updated_user(viewer, target, role, projects)
    assert error.value.field == refused[1]


def test_new_users() -> None:
    assert new_user(CAROL, "gus", Role.USER, ["cv"]) == User("gus", "gus", Role.USER, ("cv",))
    assert new_user(ROOT, "boss", Role.SUPERADMIN, ["a"]).role is Role.SUPERADMIN
    with pytest.raises(Forbidden):
        new_user(ALICE, "gus", Role.USER, ["ml"])
    with pytest.raises(InvalidInput) as error:
        new_user(ROOT, "bad/name", Role.USER, ["ml"])
    assert error.value.field == "name"


def test_projects_keep_their_order_once_each() -> None:
    assert checked_projects(["b", "a", "b"]) == ("b", "a")


def test_a_session_goes_to_a_project_of_its_owner() -> None:
    assert session_project(None, owner=FRANK, viewer=FRANK) == "ml"
    assert session_project("web", owner=FRANK, viewer=FRANK) == "web"
    assert session_project("web", owner=FRANK, viewer=ROOT) == "web"
    with pytest.raises(Forbidden):
        session_project("cv", owner=FRANK, viewer=FRANK)
    with pytest.raises(InvalidInput):
        session_project("cv", owner=FRANK, viewer=ROOT)
