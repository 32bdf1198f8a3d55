"""``effectiveIdlePolicy``: for admins, the idle policy a session is judged by.

Visibility follows the session queries: a session you may not see is NOT_FOUND; one you may see but
do not administer (your own, as a user) is FORBIDDEN.
"""

from __future__ import annotations

import strawberry

from core.errors import Forbidden, NotFound
from domain.access import administers
from domain.idle.arbiter import LIFETIME_EXEMPT, NETWORK_EXEMPT
from domain.idle.config import CheckName, IdlePolicyConfig
from domain.idle.facts import checked_metrics, policy_for
from domain.model import Session
from domain.resource_policies import SessionLimits
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.idle.types import (
    EffectiveIdlePolicy,
    UtilizationPolicy,
    UtilizationThreshold,
)
from gateway.graphql.sessions.queries import session_visible
from stores.idle import IdleStore
from stores.resource_policies import PolicyStore


@strawberry.type
class IdleQueries:
    @fields.field(
        description="Admins only: the idle policy the idle checker applies to a session; null while no idle "
        "checker has started."
    )
    async def effective_idle_policy(self, info: Info, session_id: strawberry.ID) -> EffectiveIdlePolicy | None:
        viewer = info.context.viewer
        store = info.context.sessions
        session = await store.get(str(session_id))
        if session is None or not session_visible(session, viewer):
            raise NotFound(f"no session {session_id}", field="sessionId")
        if not administers(viewer, session.project):
            raise Forbidden("only administrators can read idle policies", field="sessionId")
        published = await IdleStore(store.redis, store.keys).published_policy()
        if published is None:
            return None
        source, config = published
        limits = (await PolicyStore(store.redis, store.keys).limits_of([session])).get(session.id)
        return effective_policy_type(source.source, config, session, limits)


def effective_policy_type(
    source: str, config: IdlePolicyConfig, session: Session, limits: SessionLimits | None = None
) -> EffectiveIdlePolicy:
    """``limits``: the owner's and project's resource-policy limits, which the idle checker applies too."""
    policy = policy_for(config, session, limits)
    utilization = policy.utilization
    exempt = [CheckName.SESSION_LIFETIME] if session.type in LIFETIME_EXEMPT else []
    exempt += [CheckName.NETWORK_TIMEOUT] if session.type in NETWORK_EXEMPT else []
    return EffectiveIdlePolicy(
        source=source,
        check_interval=policy.check_interval,
        max_session_lifetime=policy.max_session_lifetime,
        network_idle_timeout=policy.network_idle_timeout,
        utilization=UtilizationPolicy(
            grace_period=utilization.grace_period,
            window=utilization.window,
            operator=utilization.operator,
            thresholds=[
                UtilizationThreshold(metric=m, threshold=t) for m, t in checked_metrics(session, policy).items()
            ],
        )
        if utilization is not None
        else None,
        exempt_from=exempt,
    )
