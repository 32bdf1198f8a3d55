"""The end of the one creation path (``createSession`` and ``createSessionFromTemplate`` both go through
``gateway.graphql.sessions.mutations.create_from_input``): the owner's and the project's resource policies
enforced, then the sessions stored atomically with the pending-sessions limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from domain.model import Session as SessionModel
from domain.resource_policies import check_allowed, check_priority
from domain.session_requests import CreationRules
from gateway.graphql.context import Context
from gateway.scheduling_config import scheduling_config
from stores.creation_rules import read_creation_rules
from stores.resource_policies import PolicyStore, pending_admission


async def creation_rules(
    ctx: Context,
    *,
    resource_group: str,
    preset: str | None,
    folders: Sequence[str] = (),
    images: Sequence[str] = (),
    users: Sequence[str] = (),
) -> CreationRules:
    """The configuration a new session (or a template's spec) is checked against, read for this request (with the
    storage ``folders`` it mounts and the committed ``images`` it names, for the ``users`` it is checked for)."""
    config = scheduling_config(ctx.settings.scheduler.config_path)
    return await read_creation_rules(
        ctx.sessions.redis,
        ctx.sessions.keys,
        ctx.settings,
        config,
        resource_group=resource_group,
        preset=preset,
        folders=folders,
        images=images,
        users=users,
    )


async def admit_and_store(
    ctx: Context, sessions: Sequence[SessionModel], client_token: str | None
) -> list[SessionModel]:
    """Refuse a resource group or driver the policies leave out or a USER's priority above theirs (``FORBIDDEN``), or
    sessions past the owner's pending limit (``QUOTA_EXCEEDED``, exact under racing creations); else store them."""
    first = sessions[0]
    policies = PolicyStore(ctx.sessions.redis, ctx.sessions.keys)
    user_policy, project_policy = await asyncio.gather(policies.user(first.owner_id), policies.project(first.project))
    check_allowed(
        resource_group=first.resource_group,
        driver=first.driver.value,
        user=user_policy,
        project=project_policy,
        project_name=first.project,
    )
    check_priority(first.priority, viewer=ctx.viewer, policy=user_policy)
    admit = pending_admission(
        first.owner_id, user_policy.max_pending_sessions if user_policy else None, adding=len(sessions)
    )
    return await ctx.sessions.create(sessions, client_token=client_token, admit=admit)
