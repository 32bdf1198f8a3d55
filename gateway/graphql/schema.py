"""The GraphQL schema, composed from per-domain queries and mutations."""

from __future__ import annotations

import logging

import strawberry
from graphql import GraphQLError
from strawberry.schema.config import StrawberryConfig
from strawberry.types import ExecutionContext

from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.document_limits import schema_extensions
from gateway.graphql.environments import EnvironmentMutations, EnvironmentQueries
from gateway.graphql.errors import ErrorCodes
from gateway.graphql.execs.mutations import ExecMutations
from gateway.graphql.execs.subscriptions import ExecSubscriptions
from gateway.graphql.execution import execution_for
from gateway.graphql.folders.mutations import FolderMutations
from gateway.graphql.folders.queries import FolderQueries
from gateway.graphql.folders.sftp import SftpMutations
from gateway.graphql.folders.types import BYTES_SCALAR, Bytes
from gateway.graphql.http import RecordOperation
from gateway.graphql.idle.queries import IdleQueries
from gateway.graphql.images.schema_part import ImageMutations, ImageQueries
from gateway.graphql.known_operations import KnownOperations, NoteKnown
from gateway.graphql.limits import Limits
from gateway.graphql.operation_name import OperationNameRequired
from gateway.graphql.policies.mutations import PolicyMutations
from gateway.graphql.policies.queries import PolicyQueries
from gateway.graphql.schedules.mutations import ScheduleMutations
from gateway.graphql.schedules.queries import ScheduleQueries
from gateway.graphql.sessions.app_mutations import AppMutations
from gateway.graphql.sessions.endpoints import EndpointMutations
from gateway.graphql.sessions.mutations import SessionMutations
from gateway.graphql.sessions.queries import SessionQueries
from gateway.graphql.sessions.scaling import ScalingMutations
from gateway.graphql.sessions.subscriptions import SessionSubscriptions
from gateway.graphql.templates.mutations import TemplateMutations
from gateway.graphql.templates.queries import TemplateQueries
from gateway.graphql.usage.queries import UsageQueries
from gateway.graphql.users.mutations import UserMutations
from gateway.graphql.users.queries import UserQueries
from gateway.graphql.websocket import SubscriptionsOverWebSocket

log = logging.getLogger(__name__)


@strawberry.type
class Viewer:
    id: str
    name: str
    role: str
    projects: list[str] = strawberry.field(description="Your projects; a session's default is the first.")


@strawberry.type
class Query(
    SessionQueries,
    IdleQueries,
    UserQueries,
    TemplateQueries,
    PolicyQueries,
    ScheduleQueries,
    FolderQueries,
    ImageQueries,
    EnvironmentQueries,
    UsageQueries,
):
    @fields.field(description="Who you are, by your API token.")
    def viewer(self, info: Info) -> Viewer:
        user = info.context.viewer
        return Viewer(id=user.id, name=user.name, role=user.role.value, projects=list(user.projects))


@strawberry.type
class Mutation(
    SessionMutations,
    ScalingMutations,
    AppMutations,
    EndpointMutations,
    UserMutations,
    TemplateMutations,
    PolicyMutations,
    ExecMutations,
    FolderMutations,
    SftpMutations,
    ImageMutations,
    EnvironmentMutations,
    ScheduleMutations,
):
    pass


@strawberry.type
class Subscription(SessionSubscriptions, ExecSubscriptions):
    pass


class CaravanSchema(strawberry.Schema):
    known_operations: KnownOperations
    """Queries seen to pass parsing and validation, executed without Strawberry's per-request machinery."""

    def process_errors(self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None) -> None:
        """Strawberry logs every error at ERROR; most are the client's (bad input, NOT_FOUND…). Unexpected ones are
        logged by ``ErrorCodes`` with their request id, so here they are only traced."""
        for error in errors:
            log.debug("graphql error at %s: %s", error.path, error.message)


def build_schema(limits: Limits | None = None) -> CaravanSchema:
    """The schema with ``limits``' document limits (default: ``Limits()``; the SDL is the same for any limits)."""
    if limits is None:
        limits = Limits()
    built = CaravanSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=[
            OperationNameRequired,
            *schema_extensions(limits),
            ErrorCodes,
            RecordOperation,
            SubscriptionsOverWebSocket,
            NoteKnown,  # last: after every extension that may refuse the document
        ],
        config=StrawberryConfig(relay_max_results=limits.max_page, scalar_map={Bytes: BYTES_SCALAR}),
    )
    built.execution_context_class = execution_for(built._schema)  # plain data fields read directly
    built.known_operations = KnownOperations(built, limits.max_cost, limits.max_page, limits.max_tokens)
    return built


schema = build_schema()
"""The schema with default limits; ``gateway.graphql.export`` writes its SDL to ``schema.graphql``."""
