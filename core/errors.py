"""Caravan's error families.

Expected failures carry a machine-readable ``code`` that the GraphQL layer puts in
``extensions.code``; anything else is a bug or an outage and is masked as INTERNAL.
"""

from __future__ import annotations


class CaravanError(Exception):
    """An expected failure a user can act on."""

    code = "INTERNAL"

    def __init__(self, message: str, *, field: str | None = None, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details


class InvalidInput(CaravanError):
    code = "INVALID_INPUT"


class Unauthenticated(CaravanError):
    code = "UNAUTHENTICATED"


class Forbidden(CaravanError):
    code = "FORBIDDEN"


class NotFound(CaravanError):
    code = "NOT_FOUND"


class Conflict(CaravanError):
    code = "CONFLICT"


class QuotaExceeded(CaravanError):
    code = "QUOTA_EXCEEDED"


class UnsupportedResource(CaravanError):
    code = "UNSUPPORTED_RESOURCE"


class Unavailable(CaravanError):
    """A dependency (Redis, Nomad) cannot be reached; retrying later may succeed."""

    code = "UNAVAILABLE"


class TransientError(Exception):
    """Inside services: a failure worth retrying with backoff."""


class PermanentError(Exception):
    """Inside services: retrying will not help."""
