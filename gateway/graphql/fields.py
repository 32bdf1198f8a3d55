"""Typed forms of strawberry's resolver decorators called with arguments: field, mutation, subscription.

Called with keyword arguments and no resolver, ``strawberry.field`` (and ``mutation``, ``subscription``) is typed
as returning Any (strawberry issue #1929), so under mypy --strict every resolver it decorates would become untyped.
These take the arguments the schema uses and say what the decorator returns: the StrawberryField wrapping the
resolver, which ``@strawberry.type`` turns into a GraphQL field. The resolver body is still checked as written.
"""

from __future__ import annotations

from collections.abc import Callable

import strawberry
from strawberry.types.field import StrawberryField

ResolverDecorator = Callable[[Callable[..., object]], StrawberryField]
"""What each decorator here returns: it takes a resolver (a method) and gives the field that wraps it."""


def field(*, description: str) -> ResolverDecorator:
    """``@strawberry.field(description=...)`` on a resolver, typed."""
    decorator: ResolverDecorator = strawberry.field(description=description)
    return decorator


def mutation(*, description: str) -> ResolverDecorator:
    """``@strawberry.mutation(description=...)`` on a resolver, typed."""
    decorator: ResolverDecorator = strawberry.mutation(description=description)
    return decorator


def subscription(*, description: str) -> ResolverDecorator:
    """``@strawberry.subscription(description=...)`` on an async-generator resolver, typed."""
    decorator: ResolverDecorator = strawberry.subscription(description=description)
    return decorator
