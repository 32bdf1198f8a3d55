"""One slot's amount in an input (createSession's ``resources``, a policy's, an endpoint update's): its own module, so
that both ``inputs`` and ``scaling`` use the one GraphQL type."""

from __future__ import annotations

import strawberry


@strawberry.input
class ResourceInput:
    slot: str = strawberry.field(description="Slot name: cpu (cores), mem (bytes), cuda.device, …")
    amount: str = strawberry.field(description="Amount, with units for bytes: '1.5', '512m', '2g'.")
