"""``kernelExec``: a long command's output streamed as it comes, then its exit code."""

from __future__ import annotations

import base64
import codecs
import contextlib
from collections.abc import AsyncGenerator

import strawberry

from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.execs.mutations import prepared
from gateway.graphql.execs.types import ExecChunk, ExecInput, ExecStream
from gateway.kernel_exec import stream_command
from nomad_jobs.alloc_exec import Exited


@strawberry.type
class ExecSubscriptions:
    @fields.subscription(
        description="Run a command as execInKernel does and stream its output as it is written: chunks of STDOUT and "
        "STDERR, then one EXIT chunk with the exit code, then the subscription completes. Nothing is capped but the "
        "time (`timeoutSeconds`, then EXEC_TIMEOUT); a connection runs at most CARAVAN_EXEC_MAX_CONNECTION_EXECS (4) "
        "at once. Same errors as execInKernel."
    )
    async def kernel_exec(self, info: Info, input: ExecInput) -> AsyncGenerator[ExecChunk, None]:
        run = await prepared(info, input)
        texts = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
        with run.execs.slots.claimed(info.context.viewer.id, run.execs):
            # Closed here, in this task, however the subscription ends (the client may stop reading at EXIT): left
            # to the event loop's finalizer, the exec socket and its deadline would outlive the operation.
            async with contextlib.aclosing(
                stream_command(
                    info.context.nomad.settings,
                    run.target,
                    run.command,
                    stdin=run.stdin,
                    timeout=run.timeout,
                    meter=run.meter,
                )
            ) as frames:
                async for frame in frames:
                    if isinstance(frame, Exited):
                        yield ExecChunk(stream=ExecStream.EXIT, text="", data_base64="", exit_code=frame.exit_code)
                        return
                    yield ExecChunk(
                        stream=ExecStream(frame.stream),
                        text=texts[frame.stream].decode(frame.data),
                        data_base64=base64.b64encode(frame.data).decode("ascii"),
                        exit_code=None,
                    )
