"""A document with several operations needs ``operationName`` (GraphQL spec, GetOperation): a request error.

Strawberry picks the document's first operation when none is named (``ExecutionContext.operation_name`` falls back
to it), so such a request used to run whichever operation came first. This extension refuses it before validation,
over HTTP and WebSocket alike, with ``INVALID_INPUT`` on ``operationName``: over HTTP a request error (no ``data``;
400 with ``application/graphql-response+json``).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphql import GraphQLError, OperationDefinitionNode
from strawberry.extensions import SchemaExtension


class OperationNameRequired(SchemaExtension):
    """List it before the validating extensions: its error stands in for validation (there is nothing to run)."""

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document = context.graphql_document
        if document is not None and context._provided_operation_name is None:  # Strawberry keeps the given name here
            count = sum(isinstance(d, OperationDefinitionNode) for d in document.definitions)
            if count > 1 and not context.pre_execution_errors:
                context.pre_execution_errors = [
                    GraphQLError(
                        f"the document has {count} operations: name the one to run in operationName",
                        extensions={"code": "INVALID_INPUT", "field": "operationName"},
                    )
                ]
        yield
