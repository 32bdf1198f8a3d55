"""Parse and validate each distinct document once, not on every request.

Clients send the same few documents over and over; parsing and validating one (with the depth and
alias rules of :mod:`gateway.graphql.document_limits`) cost about as much as executing a page of results.
Both are pure functions of the document text, the token limit, the schema and the rules, so their
results are kept in bounded LRU caches keyed by exactly those: the limits still apply to every
request, since a document over the token limit never parses (nothing is cached for it) and a cached
validation carries the same errors every time.

A document that does not parse is left to Strawberry's own parse, which reports the error as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache

from graphql import DocumentNode, GraphQLError, GraphQLSchema, parse
from graphql.validation import ASTValidationRule
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import validate_document

CACHED_DOCUMENTS = 256
"""Distinct documents kept (per worker process); unseen ones are parsed and validated as usual."""


@lru_cache(maxsize=CACHED_DOCUMENTS)
def _parsed(query: str, max_tokens: int | None) -> DocumentNode:
    return parse(query, max_tokens=max_tokens)


def parsed_document(query: str, max_tokens: int | None) -> DocumentNode | None:
    """The cached parse of ``query``, or None if it does not parse (``gateway.graphql.result_cache`` reads it)."""
    try:
        return _parsed(query, max_tokens)
    except GraphQLError:
        return None


@lru_cache(maxsize=CACHED_DOCUMENTS)
def _validated(
    schema: GraphQLSchema, query: str, max_tokens: int | None, rules: tuple[type[ASTValidationRule], ...]
) -> list[GraphQLError]:
    return validate_document(schema, _parsed(query, max_tokens), rules)


class DocumentCache(SchemaExtension):
    """List it after the limit extensions: it reads the token limit and rules they set on the operation."""

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        if context.query and context.graphql_document is None:
            with contextlib.suppress(GraphQLError):  # Strawberry parses it again and reports the error
                context.graphql_document = _parsed(context.query, context.parse_options.get("max_tokens"))
        yield

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        max_tokens = context.parse_options.get("max_tokens")
        if context.query and context.graphql_document is not None and context.pre_execution_errors is None:
            with contextlib.suppress(GraphQLError):
                if context.graphql_document is _parsed(context.query, max_tokens):
                    context.pre_execution_errors = list(
                        _validated(context.schema._schema, context.query, max_tokens, context.validation_rules)
                    )
        yield
