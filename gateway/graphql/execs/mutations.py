"""``execInKernel``: a command run in a kernel to its end, its output returned."""

from __future__ import annotations

import strawberry

from domain.kernel_exec import ActivityClock, command_of, stdin_of, timeout_of
from gateway.graphql.context import Info
from gateway.graphql.execs.types import ExecInput, ExecResult, exec_result_of, stdin_bytes
from gateway.kernel_exec import ActivityMeter, ConnectionExecs, find_target, run_command


def execs_of(info: Info) -> ConnectionExecs:
    execs = info.context.execs
    assert execs is not None, "the gateway's context has them"
    return execs


@strawberry.type
class ExecMutations:
    @strawberry.mutation(
        description="Run a command in a RUNNING session's kernel (docker or exec driver) through Nomad's exec, and "
        "return its exit code and output (each stream capped, `stdoutTruncated`/`stderrTruncated` say so). Errors: "
        "NOT_FOUND (no such session or kernel of yours), SESSION_NOT_RUNNING, EXEC_NOT_SUPPORTED (QEMU; raw_exec but "
        "for a SUPERADMIN), EXEC_TIMEOUT, TOO_MANY_EXECS (with `limit` and `per`), INVALID_INPUT (the command, stdin "
        "over its cap, the timeout), EXEC_FAILED (Nomad refused it)."
    )
    async def exec_in_kernel(self, info: Info, input: ExecInput) -> ExecResult:
        ctx = info.context
        viewer = ctx.viewer
        execs = execs_of(info)
        limits = execs.slots.limits
        command = command_of(input.argv, input.shell)
        stdin = stdin_of(stdin_bytes(input.stdin, input.stdin_base64), limits)
        timeout = timeout_of(input.timeout_seconds, limits)
        target = await find_target(ctx.sessions, viewer, str(input.session_id), input.kernel)
        meter = ActivityMeter(ctx.sessions, target.session_id, ActivityClock(limits.activity_interval))
        with execs.slots.claimed(viewer.id, execs):
            done = await run_command(
                ctx.nomad.settings, target, command, stdin=stdin, timeout=timeout, limits=limits, meter=meter
            )
        return exec_result_of(done.exit_code, done.stdout, done.stderr)
