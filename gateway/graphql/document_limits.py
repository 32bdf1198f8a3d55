"""The limits of a GraphQL document's size and shape: depth, tokens and aliases (and the cost limit of
:mod:`gateway.graphql.cost`), as schema extensions, each refusal with an ``extensions.code`` of its own and the limit.
They apply to every transport alike (HTTP and WebSocket).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from graphql import ASTValidationRule, GraphQLError, ValidationContext, ValidationRule
from strawberry.extensions import MaxTokensLimiter, SchemaExtension
from strawberry.extensions.add_validation_rules import AddValidationRules
from strawberry.extensions.max_aliases import create_validator as alias_validator
from strawberry.extensions.query_depth_limiter import create_validator as depth_validator

from gateway.graphql.cost import CostLimit
from gateway.graphql.document_cache import DocumentCache
from gateway.graphql.limits import Limits


class _CodedContext:
    """A validation context whose reported errors carry ``extensions.code`` (and the limit)."""

    def __init__(self, context: ValidationContext, extensions: dict[str, Any]) -> None:
        self._context = context
        self._extensions = extensions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def report_error(self, error: GraphQLError) -> None:
        error.extensions = {**(error.extensions or {}), **self._extensions}
        self._context.report_error(error)


def _coded(rule: type[ValidationRule], code: str, limit: int) -> type[ValidationRule]:
    # mypy cannot check a class whose base is a value (strawberry's validator factories make the rule classes)
    class Coded(rule):  # type: ignore[valid-type,misc]
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(_CodedContext(context, {"code": code, "limit": limit}))

    return Coded


TOO_MANY_TOKENS = "TOO_MANY_TOKENS"


class _MaxTokens(MaxTokensLimiter):
    """Strawberry's token limit, with the parser's refusal coded TOO_MANY_TOKENS."""

    def on_parse(self) -> Iterator[None]:
        yield
        for error in self.execution_context.pre_execution_errors or ():
            if f"contains more than {self.max_token_count} tokens" in error.message:
                error.extensions = {**(error.extensions or {}), "code": TOO_MANY_TOKENS, "limit": self.max_token_count}


def schema_extensions(limits: Limits) -> list[Callable[[], SchemaExtension]]:
    """Factories of the document-limit extensions (Strawberry builds them afresh for each operation)."""
    rules: list[type[ASTValidationRule]] = [
        _coded(depth_validator(limits.max_depth, None), "QUERY_TOO_DEEP", limits.max_depth),
        _coded(alias_validator(limits.max_aliases), "TOO_MANY_ALIASES", limits.max_aliases),
    ]
    # DocumentCache last: it parses with the token limit and validates with the rules the others set
    return [
        functools.partial(_MaxTokens, limits.max_tokens),
        functools.partial(AddValidationRules, rules),
        DocumentCache,
        functools.partial(CostLimit, limits.max_cost, limits.max_page),
    ]
