"""The GraphQL schema, composed from per-domain queries and mutations."""

from __future__ import annotations

import strawberry

from gateway.graphql.context import Info
from gateway.graphql.errors import ErrorCodes
from gateway.graphql.sessions.mutations import SessionMutations
from gateway.graphql.sessions.queries import SessionQueries


@strawberry.type
class Viewer:
    id: str
    name: str
    role: str


@strawberry.type
class Query(SessionQueries):
    @strawberry.field(description="Who you are, by your API token.")
    def viewer(self, info: Info) -> Viewer:
        user = info.context.viewer
        return Viewer(id=user.id, name=user.name, role=user.role.value)


@strawberry.type
class Mutation(SessionMutations):
    pass


schema = strawberry.Schema(query=Query, mutation=Mutation, extensions=[ErrorCodes])
