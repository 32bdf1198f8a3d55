"""Committed images (``domain.images``): references are injective and valid Docker references; an image is usable
by those ``domain.access`` lets act on it, and anyone else is told NOT_FOUND, as for one that does not exist, at every
creation that names it (``domain.session_requests``)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import CaravanError
from domain.docker_images import check_docker_image
from domain.images import (
    IMAGE_NAME_RULE,
    PATH_COMPONENT,
    TAG_RULE,
    CommittedImage,
    ImageStatus,
    check_image_use,
    committed_key,
    image_ref,
)
from domain.model import Driver, RoleSpec, SessionType
from domain.session_requests import CreationRules, SessionRequest, build_sessions, check_request
from domain.user_requests import NAME_RULE as USER_ID_RULE
from domain.users import Role, User

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = User("alice", "alice", Role.USER, ("lab",))
BOB = User("bob", "bob", Role.USER, ("lab",))
LAB_ADMIN = User("carol", "carol", Role.ADMIN, ("lab",))
OTHER_ADMIN = User("dave", "dave", Role.ADMIN, ("elsewhere",))
ROOT = User("root", "root", Role.SUPERADMIN, ("ops",))


def image_of(owner: User, name: str = "secret", status: ImageStatus = ImageStatus.READY) -> CommittedImage:
    return CommittedImage(
        id=f"img-{owner.id}-{name}",
        ref=image_ref(owner.id, name, "v1"),
        owner_id=owner.id,
        project=owner.projects[0],
        session_id="s-1",
        node_id="node-a",
        container="main-alloc",
        created_at=NOW,
        status=status,
    )


def refusal(call: object) -> tuple[str, str | None, str]:
    with pytest.raises(CaravanError) as refused:
        call()  # type: ignore[operator]
    return refused.value.code, refused.value.field, refused.value.message


def test_the_reported_colliding_pairs_get_distinct_references() -> None:
    refs = {image_ref(owner, name, "v1") for owner, name in (("t3", "bob-secret"), ("t3-bob", "secret"))}
    refs |= {image_ref("t3.bob", "secret", "v1"), image_ref("T3.bob", "secret", "v1")}
    assert len(refs) == 4, refs
    assert image_ref("t3", "bob-secret", "v1") == "caravan/u/t3/bob-secret:v1"
    assert image_ref("t3-bob", "secret", "v1") == "caravan/u/t3-bob/secret:v1"
    assert image_ref("t3.bob", "secret", "v1") == "caravan/u/t3.bob/secret:v1"
    assert image_ref("T3.bob", "secret", "v1").startswith("caravan/x/")  # upper case: the id base32-encoded


def test_names_and_tags_are_docker_path_components_and_pinned_tags() -> None:
    for name in ("Snap", "a..b", "a._b", "-a", "a-", "a" * 41, "a/b", ""):
        assert refusal(lambda name=name: image_ref("alice", name, "v1"))[:2] == ("INVALID_INPUT", "name")
    for tag in ("latest", "a b", "", ".v1", "v" * 65):
        assert refusal(lambda tag=tag: image_ref("alice", "snap", tag))[:2] == ("INVALID_INPUT", "tag")


owners = st.from_regex(USER_ID_RULE, fullmatch=True)
names = st.from_regex(f"^{PATH_COMPONENT}$", fullmatch=True).filter(lambda n: IMAGE_NAME_RULE.match(n) is not None)
tags = st.from_regex(TAG_RULE, fullmatch=True).filter(lambda t: t != "latest")


def decoded(ref: str) -> tuple[str, str, str]:
    """The (owner, name, tag) a reference was made of: a left inverse of ``image_ref``, so it is injective."""
    kind, owner, rest = ref.removeprefix("caravan/").split("/")
    name, tag = rest.split(":")
    if kind == "x":
        owner = base64.b32decode(owner.upper() + "=" * (-len(owner) % 8)).decode()
    return owner, name, tag


pieces = st.lists(st.from_regex(r"^[a-z0-9]{1,6}$", fullmatch=True), min_size=2, max_size=6)
separators = st.sampled_from([".", "-", "_", "__", "--"])


@given(st.tuples(owners, names, tags), st.tuples(owners, names, tags))
def test_references_are_injective_and_valid_docker_references(
    one: tuple[str, str, str], other: tuple[str, str, str]
) -> None:
    first, second = image_ref(*one), image_ref(*other)
    assert decoded(first) == one and decoded(second) == other
    assert (first == second) == (one == other), (one, other, first)
    for ref in (first, second):
        check_docker_image(ref, ("caravan/*",))  # Docker's grammar, at most 255 characters, in the allowlist
        assert committed_key(ref) == ref


@given(pieces, separators, st.data())
def test_an_owner_and_a_name_cut_from_the_same_words_never_share_a_reference(
    words: list[str], separator: str, data: st.DataObject
) -> None:
    """The reported collision's shape: ``t3`` + ``bob-secret`` and ``t3-bob`` + ``secret``, any cut, any case."""
    made = []
    for cut in range(1, len(words)):
        owner, name = separator.join(words[:cut]), separator.join(words[cut:])
        if data.draw(st.booleans()):
            owner = owner.upper()
        if IMAGE_NAME_RULE.match(name) and USER_ID_RULE.match(owner):
            made.append(image_ref(owner, name, "v1"))
    assert len(set(made)) == len(made), made


def test_only_its_owner_its_projects_admins_and_superadmins_may_use_an_image() -> None:
    bobs = image_of(BOB)
    found = {bobs.ref: [bobs]}
    for user in (BOB, LAB_ADMIN, ROOT):
        check_image_use(bobs.ref, found, user)
    for user in (ALICE, OTHER_ADMIN):
        refused = refusal(lambda user=user: check_image_use(bobs.ref, found, user))
        missing = refusal(lambda user=user: check_image_use("caravan/u/bob/nothing:v1", found, user))
        assert refused[:2] == missing[:2] == ("NOT_FOUND", "image")  # no telling whether it exists
        assert refused[2].replace(bobs.ref, "X") == missing[2].replace("caravan/u/bob/nothing:v1", "X")
    for written in ("docker.io/caravan/u/bob/secret:v1", "index.docker.io/caravan/u/bob/secret:v1"):
        assert refusal(lambda written=written: check_image_use(written, found, ALICE))[0] == "NOT_FOUND"
    digest = "caravan/u/bob/secret:v1@sha256:" + "a" * 64  # never how an image is stored: nobody's
    assert refusal(lambda: check_image_use(digest, found, BOB))[0] == "NOT_FOUND"
    check_image_use("caravan/busybox:1.35", found, ALICE)  # not a committed image: the allowlist's business


def test_an_image_not_ready_is_refused_to_its_owner_as_such() -> None:
    committing = image_of(BOB, status=ImageStatus.COMMITTING)
    assert refusal(lambda: check_image_use(committing.ref, {committing.ref: [committing]}, BOB))[:2] == (
        "INVALID_INPUT",
        "image",
    )


def test_images_from_before_injective_references_are_their_records_owners() -> None:
    legacy = CommittedImage("old", "caravan/u-bob-tools:1", "bob", "lab", "s", "n", "c", NOW, ImageStatus.READY)
    assert committed_key(legacy.ref) == legacy.ref
    check_image_use(legacy.ref, {legacy.ref: [legacy]}, BOB)
    assert refusal(lambda: check_image_use(legacy.ref, {legacy.ref: [legacy]}, ALICE))[0] == "NOT_FOUND"


def test_a_creation_naming_anothers_image_is_not_found_whoever_creates_it() -> None:
    bobs = image_of(BOB)
    rules = CreationRules(committed_images={bobs.ref: [bobs]})

    def request(**options: object) -> SessionRequest:
        return SessionRequest(name="from-image", type=SessionType.INTERACTIVE, driver=Driver.DOCKER, **options)  # type: ignore[arg-type]

    assert build_sessions(request(image=bobs.ref), viewer=BOB, now=NOW, rules=rules)[0].image == bobs.ref
    assert refusal(lambda: build_sessions(request(image=bobs.ref), viewer=ALICE, now=NOW, rules=rules))[:2] == (
        "NOT_FOUND",
        "image",
    )
    assert refusal(lambda: check_request(request(image=bobs.ref), viewer=ALICE, now=NOW, rules=rules))[0] == (
        "NOT_FOUND"
    )  # a template's or a schedule's spec is checked so
    sub = request(image="caravan/busybox:1", cluster_size=2, kernel_roles={"sub": RoleSpec(image=bobs.ref)})
    assert refusal(lambda: build_sessions(sub, viewer=ALICE, now=NOW, rules=rules))[:2] == (
        "NOT_FOUND",
        "kernelRoles.sub.image",
    )
    # a SUPERADMIN may use it, but a session they create for alice runs it as hers: refused
    assert refusal(lambda: build_sessions(request(image=bobs.ref), viewer=ROOT, now=NOW, rules=rules, owner=ALICE))[
        :2
    ] == ("NOT_FOUND", "image")
    assert build_sessions(request(image=bobs.ref), viewer=ROOT, now=NOW, rules=rules, owner=BOB)[0].owner_id == "bob"
