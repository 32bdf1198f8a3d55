"""Queries the gateway has already seen pass every check, executed without Strawberry's per-request machinery.

An operation goes through Strawberry's ``Schema.execute``: an execution context, eight schema extensions' hooks
(parse and validation, both cached per document; the operation-name, depth, alias, token and cost limits; error
codes; the request metrics' note) around graphql-core's ``execute``. For a document it has seen before, all of that
but the cost limit and the error codes answers the same every time: parsing and validation are pure functions of the
document's text (and the schema, the token limit and the rules, fixed per worker).

So once Strawberry has taken an operation through parsing and validation without an error and found a query
(:class:`NoteKnown`, an extension, notes it: text and operation name as sent), the next request for the same text and
operation name is executed here (:meth:`KnownOperations.execute`): the cost limit checked as :class:`CostLimit` checks
it (over it, Strawberry's path answers, with its refusal), graphql-core's ``execute`` called as Strawberry calls it
(same execution context class, middleware, arguments), errors logged and coded as :class:`ErrorCodes` does. Anything
else (a new document, a mutation or subscription, an operation with ``extensions``, an extension that resolves through
middleware) goes Strawberry's way. ``tests/gateway/test_known_operations.py`` compares both ways' answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from graphql import DocumentNode
from strawberry.execution import optimized_is_awaitable
from strawberry.extensions import SchemaExtension
from strawberry.schema._graphql_core import execution_context_class_kwargs
from strawberry.schema.schema import _coerce_error
from strawberry.types import ExecutionResult
from strawberry.types.execution import PreExecutionError
from strawberry.types.graphql import OperationType
from strawberry.utils.await_maybe import await_maybe

from gateway.graphql.cost import known_cost
from gateway.graphql.document_cache import parsed_document
from gateway.graphql.errors import coded

if TYPE_CHECKING:
    from strawberry import Schema
    from strawberry.http import GraphQLRequestData

KNOWN = 1024
"""Documents (text and operation name) kept per worker; past it, all are forgotten (and noted again as they come)."""


class KnownOperations:
    """The queries of a schema that parsed and validated without an error, by text and operation name as sent."""

    def __init__(self, schema: Schema, max_cost: int, max_page: int, max_tokens: int | None) -> None:
        self.schema = schema
        self.max_cost = max_cost
        self.max_page = max_page
        self.max_tokens = max_tokens
        self._known: dict[tuple[str, str | None], DocumentNode] = {}
        self.enabled = not schema.config.enable_experimental_incremental_execution and not any(
            extension._implements_resolve() for extension in schema.get_extensions()
        )
        """Off when an extension resolves fields (middleware, which this path would leave out), or when graphql-core's
        incremental delivery is on (its results are streamed by Strawberry's view)."""

    def note(self, query: str, operation_name: str | None) -> None:
        """``query`` (its cached parse) passed parsing and validation; its operation ``operation_name`` is a query."""
        document = parsed_document(query, self.max_tokens)
        if document is None or not self.enabled:
            return
        if len(self._known) >= KNOWN:
            self._known.clear()
        self._known[query, operation_name] = document

    def document(self, data: GraphQLRequestData) -> DocumentNode | None:
        """The document of a known query that this path may execute with these variables, else None."""
        if data.query is None or data.extensions is not None:
            return None
        document = self._known.get((data.query, data.operation_name))
        if document is None:
            return None
        cost = known_cost(self.schema._schema, data.query, document, data.operation_name, data.variables, self.max_page)
        return document if cost <= self.max_cost else None  # refused by CostLimit on Strawberry's path

    async def execute(self, document: DocumentNode, data: GraphQLRequestData, context: Any) -> ExecutionResult:
        """What ``Schema.execute`` answers for this known query (its error codes, its request-metrics note)."""
        schema = self.schema
        try:
            result = await await_maybe(
                schema._get_execute_function()(
                    schema._schema,
                    document,
                    root_value=None,
                    middleware=schema._get_middleware_manager([]),
                    variable_values=data.variables,
                    operation_name=data.operation_name,
                    context_value=context,
                    is_awaitable=optimized_is_awaitable,
                    **execution_context_class_kwargs(schema.execution_context_class),
                    **schema._get_custom_context_kwargs(None),
                )
            )
        except Exception as exc:  # as Schema.execute answers one
            result = PreExecutionError(data=None, errors=[_coerce_error(exc)])
        errors = result.errors
        if errors:
            schema._process_errors(errors)
            request_id = getattr(context, "request_id", "-")
            errors = [coded(error, request_id) for error in errors]
        request = getattr(context, "request", None)
        if request is not None:
            request.state.operation = OperationType.QUERY.value
        if isinstance(result, PreExecutionError):
            return PreExecutionError(data=None, errors=errors)
        return ExecutionResult(data=result.data, errors=errors)


class NoteKnown(SchemaExtension):
    """Notes a query that passed parsing and validation in its schema's :class:`KnownOperations`. List it after
    every extension that may refuse the document before execution."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        known: KnownOperations | None = getattr(context.schema, "known_operations", None)
        if (
            known is not None
            and context.query is not None
            and not context.pre_execution_errors
            and context.graphql_document is not None
            and context.operation_type is OperationType.QUERY
        ):
            known.note(context.query, context._provided_operation_name)
        yield
