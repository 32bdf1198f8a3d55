"""Session queries: one session by id, and the ``sessions`` connection (see ``connection.py``).

Visibility is ``domain.access``'s: a USER sees their own sessions, an ADMIN also those of their
projects, a SUPERADMIN all; a session you may not see is NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache

import strawberry
from graphql import FieldNode, FragmentDefinitionNode, FragmentSpreadNode, InlineFragmentNode, SelectionNode
from strawberry.relay import PageInfo

from core.codec import decode
from core.errors import NotFound
from domain.access import can_access, listing_scope
from domain.listing import ListingOrder, plan_listing
from domain.model import Session as SessionModel
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.sessions.connection import (
    SessionConnection,
    SessionEdge,
    SessionFilter,
    SessionOrder,
    encode_cursor,
    listing_filter,
    page_request,
)
from gateway.graphql.sessions.types import Session, session_type_of
from stores.session_listing import SessionListing

DECODED_SESSIONS = 1024
"""Session documents whose GraphQL objects are kept per worker (listings serve the same newest pages again and
again)."""


@lru_cache(maxsize=DECODED_SESSIONS)
def listed_session(document: str) -> Session:
    """The GraphQL object of a stored session document, made once per distinct document.

    Keyed by the whole document, so any change to a session is a new key; the objects are never mutated
    (resolvers only read them), so requests may share them. Decoding and converting cost more than
    executing the page's fields.
    """
    return session_type_of(decode(document, SessionModel))


def session_visible(session: SessionModel | None, viewer: User) -> bool:
    return session is not None and can_access(viewer, session.owner_id, session.project)


def selects(selections: Iterable[SelectionNode], fragments: Mapping[str, FragmentDefinitionNode], name: str) -> bool:
    """Does this selection set ask for field ``name`` (directly or in a fragment)? Read off the document itself
    (Strawberry's ``info.selected_fields`` converts the whole selection, arguments and all, on every request)."""
    for selection in selections:
        if isinstance(selection, FieldNode):
            if selection.name.value == name:
                return True
        elif isinstance(selection, InlineFragmentNode):
            if selects(selection.selection_set.selections, fragments, name):
                return True
        elif isinstance(selection, FragmentSpreadNode):
            fragment = fragments.get(selection.name.value)
            if fragment is not None and selects(fragment.selection_set.selections, fragments, name):
                return True
    return False


@strawberry.type
class SessionQueries:
    @fields.field(description="One session by id; NOT_FOUND when it does not exist or is not yours.")
    async def session(self, info: Info, id: strawberry.ID) -> Session:
        viewer = info.context.viewer
        found = await info.context.sessions.get(str(id))
        if not session_visible(found, viewer):
            raise NotFound(f"no session {id}", field="id")
        assert found is not None
        return session_type_of(found)

    @fields.field(
        description="The sessions you may see (yours; admins also their projects'; superadmins all), a page at a "
        "time: first/after forwards, last/before backwards, at most the server's page limit per page "
        "(CARAVAN_GRAPHQL_MAX_PAGE). Newest first unless orderBy says otherwise."
    )
    async def sessions(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
        filter: SessionFilter | None = None,
        order_by: SessionOrder = ListingOrder.CREATED_AT_DESC,
    ) -> SessionConnection:
        viewer = info.context.viewer
        order = ListingOrder(order_by)
        max_page = info.schema.config.relay_max_results
        request = page_request(order, max_page, first=first, after=after, last=last, before=before)
        wanted = listing_filter(filter)
        store = info.context.sessions
        plan = plan_listing(store.keys, listing_scope(viewer), wanted, order)
        if request.backward:
            plan = replace(plan, descending=not plan.descending)
        raw = info._raw_info
        count = any(
            node.selection_set is not None and selects(node.selection_set.selections, raw.fragments, "totalCount")
            for node in raw.field_nodes
        )
        page = await SessionListing(store, listed_session).page(
            plan, size=request.size, after=request.start, until=request.end, count=count
        )
        entries = page.entries[::-1] if request.backward else page.entries
        edges = [SessionEdge(cursor=encode_cursor(order, p), node=s) for p, s in entries]
        started_from_cursor = request.start is not None
        return SessionConnection(
            edges=edges,
            page_info=PageInfo(
                has_next_page=started_from_cursor if request.backward else page.has_more,
                has_previous_page=page.has_more if request.backward else started_from_cursor,
                start_cursor=edges[0].cursor if edges else None,
                end_cursor=edges[-1].cursor if edges else None,
            ),
            total_count=page.total if page.total is not None else 0,  # 0 only when not selected: never sent
        )
