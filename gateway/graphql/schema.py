"""The GraphQL schema, composed from per-domain queries and mutations."""

from __future__ import annotations

import strawberry
from strawberry.schema.config import StrawberryConfig

from gateway.graphql.context import Info
from gateway.graphql.errors import ErrorCodes
from gateway.graphql.http import RecordOperation
from gateway.graphql.idle.queries import IdleQueries
from gateway.graphql.protection import Limits, schema_extensions
from gateway.graphql.sessions.mutations import SessionMutations
from gateway.graphql.sessions.queries import SessionQueries


@strawberry.type
class Viewer:
    id: str
    name: str
    role: str


@strawberry.type
class Query(SessionQueries, IdleQueries):
    @strawberry.field(description="Who you are, by your API token.")
    def viewer(self, info: Info) -> Viewer:
        user = info.context.viewer
        return Viewer(id=user.id, name=user.name, role=user.role.value)


@strawberry.type
class Mutation(SessionMutations):
    pass


def build_schema(limits: Limits = Limits()) -> strawberry.Schema:
    """The schema with ``limits``' document limits (the SDL is the same for any limits)."""
    return strawberry.Schema(
        query=Query, mutation=Mutation,
        extensions=[*schema_extensions(limits), ErrorCodes, RecordOperation],
        config=StrawberryConfig(relay_max_results=limits.max_page),
    )


schema = build_schema()
"""The schema with default limits; ``gateway.graphql.export`` writes its SDL to ``schema.graphql``."""
