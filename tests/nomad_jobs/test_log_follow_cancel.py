"""A log follow (``NomadClient.follow_logs``) ends when its task is cancelled, against the real Nomad agent, even when
the cancellation lands as a frame of the stream arrives.

Python 3.11's ``asyncio.wait_for`` returns the awaited result instead of raising when the cancellation comes in the
turn of the loop its result does; a follow waiting for frames that way went on after a ``kernelLogs`` subscription
was completed, for as long as the kernel wrote, keeping its user's place (CI: ``test_live_events``'s
``test_one_user_follows_at_most_their_share_of_a_gateways_log_follows``, a place not freed within 30 s).
"""

from __future__ import annotations

import asyncio
from typing import Any

from core.settings import NomadSettings
from nomad_jobs.client import NomadClient
from nomad_jobs.log_frames import LogFrame
from nomad_jobs.meta import TASK_NAME
from tests.harness import ADMIN_TOKEN, CREATE, Caravan

TICKING = "while true; do echo tick; sleep 0.2; done"


class CancelledAsDataArrives(NomadClient):
    """Fault injection (a timing the real stream gives only now and then): ``follower`` is cancelled in the very turn
    of the loop in which the stream's first data frame is queued for it."""

    def __init__(self, settings: NomadSettings) -> None:
        super().__init__(settings)
        self.follower: asyncio.Task[None] | None = None

    async def _read_log_frames(self, *request: Any) -> None:
        frames: asyncio.Queue[LogFrame | BaseException | None] = request[-1]  # (alloc_id, task, stream, start, frames)
        put = frames.put_nowait

        def put_then_cancel(frame: LogFrame | BaseException | None) -> None:
            put(frame)
            if isinstance(frame, LogFrame) and frame.data and self.follower is not None:
                self.follower.cancel()
                self.follower = None

        frames.put_nowait = put_then_cancel  # type: ignore[method-assign]
        await super()._read_log_frames(*request)


async def test_a_follow_cancelled_as_its_data_arrives_ends(caravan: Caravan) -> None:
    data = await caravan.gql(
        CREATE,
        {"input": {"name": "ticking", "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": TICKING}},
        token=ADMIN_TOKEN,
    )
    session_id = data["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING")
    session = await caravan.store.get(session_id)
    assert session is not None and session.kernels[0].alloc_id
    nomad = CancelledAsDataArrives(caravan.settings.for_role("gateway").nomad)
    chunks: list[str] = []

    async def follow() -> None:
        async for chunk in nomad.follow_logs(session.kernels[0].alloc_id, TASK_NAME, tail_bytes=4096):
            chunks.append(chunk)

    follower = asyncio.create_task(follow())
    nomad.follower = follower
    try:
        await asyncio.wait([follower], timeout=5)  # the kernel ticks five times a second: a follow going on gets more
        assert follower.cancelled(), f"the follow went on after its cancellation: {len(chunks)} chunks since"
    finally:
        follower.cancel()
        await asyncio.wait([follower])
        await nomad.aclose()
