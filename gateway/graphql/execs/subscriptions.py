"""``kernelExec``: a long command's output streamed as it comes, then its exit code."""

from __future__ import annotations

import base64
import codecs
from collections.abc import AsyncGenerator

import strawberry

from domain.kernel_exec import ActivityClock, command_of, stdin_of, timeout_of
from gateway.graphql.context import Info
from gateway.graphql.execs.mutations import execs_of
from gateway.graphql.execs.types import ExecChunk, ExecInput, ExecStream, stdin_bytes
from gateway.kernel_exec import ActivityMeter, find_target, stream_command
from nomad_jobs.alloc_exec import Exited


@strawberry.type
class ExecSubscriptions:
    @strawberry.subscription(
        description="Run a command as execInKernel does and stream its output as it is written: chunks of STDOUT and "
        "STDERR, then one EXIT chunk with the exit code, then the subscription completes. Nothing is capped but the "
        "time (`timeoutSeconds`, then EXEC_TIMEOUT); a connection runs at most CARAVAN_EXEC_MAX_CONNECTION_EXECS (4) "
        "at once. Same errors as execInKernel."
    )
    async def kernel_exec(self, info: Info, input: ExecInput) -> AsyncGenerator[ExecChunk, None]:
        ctx = info.context
        viewer = ctx.viewer
        execs = execs_of(info)
        limits = execs.slots.limits
        command = command_of(input.argv, input.shell)
        stdin = stdin_of(stdin_bytes(input.stdin, input.stdin_base64), limits)
        timeout = timeout_of(input.timeout_seconds, limits)
        target = await find_target(ctx.sessions, viewer, str(input.session_id), input.kernel)
        meter = ActivityMeter(ctx.sessions, target.session_id, ActivityClock(limits.activity_interval))
        texts = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
        with execs.slots.claimed(viewer.id, execs):
            async for frame in stream_command(
                ctx.nomad.settings, target, command, stdin=stdin, timeout=timeout, meter=meter
            ):
                if isinstance(frame, Exited):
                    yield ExecChunk(stream=ExecStream.EXIT, text="", data_base64="", exit_code=frame.exit_code)
                    return
                yield ExecChunk(
                    stream=ExecStream(frame.stream),
                    text=texts[frame.stream].decode(frame.data),
                    data_base64=base64.b64encode(frame.data).decode("ascii"),
                    exit_code=None,
                )
