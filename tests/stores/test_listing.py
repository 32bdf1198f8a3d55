"""Listing plans (pure): which indexes answer which listing, so that common listings need no scan and no scratch set."""

from __future__ import annotations

from datetime import UTC, datetime

from core.keys import Keys
from domain.access import listing_scope
from domain.listing import ListingFilter, ListingOrder, Position, plan_listing
from domain.model import SessionStatus
from domain.users import Role, User
from stores.session_listing import merge

K = Keys("p")
SUPER = User(id="root", name="root", role=Role.SUPERADMIN)
ADMIN = User(id="ann", name="ann", role=Role.ADMIN, projects=("p1", "p2"))
USER = User(id="bob", name="bob", role=Role.USER)
NEWEST = ListingOrder.CREATED_AT_DESC


def plan(viewer: User, order: ListingOrder = NEWEST, **wanted: object):  # type: ignore[no-untyped-def]
    return plan_listing(K, listing_scope(viewer), ListingFilter(**wanted), order)  # type: ignore[arg-type]


def test_unfiltered_listings_read_one_index_or_merge_a_few() -> None:
    assert plan(SUPER).direct and plan(SUPER).sources == (K.sessions_by_created,)
    assert plan(USER).direct and plan(USER).sources == (K.sessions_of_owner("bob"),)
    admin = plan(ADMIN)
    assert admin.merged and set(admin.sources) == {
        K.sessions_of_owner("ann"),
        K.sessions_of_project("p1"),
        K.sessions_of_project("p2"),
    }


def test_a_superadmin_filtering_by_owner_or_project_reads_that_index() -> None:
    assert plan(SUPER, owner="bob").sources == (K.sessions_of_owner("bob"),) and plan(SUPER, owner="bob").direct
    assert plan(SUPER, project="p9").sources == (K.sessions_of_project("p9"),)
    both = plan(SUPER, owner="bob", project="p9")
    assert both.sources == (K.sessions_of_owner("bob"),) and both.filters == ((K.sessions_of_project("p9"),),)


def test_filters_within_a_narrower_scope_intersect_it() -> None:
    narrowed = plan(USER, owner="carol", statuses=frozenset({SessionStatus.RUNNING, SessionStatus.PENDING}))
    assert narrowed.sources == (K.sessions_of_owner("bob"),)
    assert narrowed.filters == (
        (K.sessions_of_owner("carol"),),
        (K.sessions_with_status("PENDING"), K.sessions_with_status("RUNNING")),
    )


def test_time_ranges_bound_the_ordered_index_or_become_a_range_of_the_other() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    created = plan(SUPER, created_after=at)
    assert (
        created.direct
        and created.scores.redis_low() == f"({at.timestamp()!r}"
        and created.scores.redis_high() == "+inf"
    )
    ended = plan(SUPER, terminated_before=at)
    assert ended.other_range is not None and ended.other_range[0] == K.sessions_by_terminated and not ended.direct


def test_the_terminated_order_reads_the_terminated_index_scoped_unless_everything_is_visible() -> None:
    assert plan(SUPER, ListingOrder.TERMINATED_AT_ASC).direct
    assert plan(SUPER, ListingOrder.TERMINATED_AT_ASC).sources == (K.sessions_by_terminated,)
    user = plan(USER, ListingOrder.TERMINATED_AT_DESC)
    assert user.sources == (K.sessions_by_terminated,) and user.filters == ((K.sessions_of_owner("bob"),),)


def test_merging_keeps_order_drops_repeats_and_stops_where_a_full_batch_ends() -> None:
    a = [Position(1, "a"), Position(3, "c"), Position(5, "e")]  # full (read with a limit of 3)
    b = [Position(1, "a"), Position(2, "b"), Position(6, "f")]  # full too: 6 may hide entries of a after 5
    merged, complete = merge([a, b], 3, descending=False)
    assert [p.id for p in merged] == ["a", "b", "c", "e"] and not complete
    merged, complete = merge([a[:2], b[:2]], 3, descending=False)
    assert [p.id for p in merged] == ["a", "b", "c"] and complete
