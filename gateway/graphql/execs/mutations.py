"""``execInKernel``: a command run in a kernel to its end, its output returned."""

from __future__ import annotations

from dataclasses import dataclass

import strawberry

from domain.kernel_exec import ActivityClock, ExecTarget, command_of, stdin_of, timeout_of
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.execs.types import ExecInput, ExecResult, exec_result_of, stdin_bytes
from gateway.kernel_exec import ActivityMeter, ConnectionExecs, find_target, run_command


@dataclass(frozen=True)
class Prepared:
    """An :class:`ExecInput` checked: what runs where, and the connection's execs it counts against."""

    execs: ConnectionExecs
    command: list[str]
    stdin: bytes | None
    timeout: float
    """Seconds."""
    target: ExecTarget
    meter: ActivityMeter


async def prepared(info: Info, input: ExecInput) -> Prepared:
    """``input`` checked (INVALID_INPUT), then its kernel found for the viewer (NOT_FOUND, SESSION_NOT_RUNNING...)."""
    ctx = info.context
    execs = ctx.execs
    assert execs is not None, "the gateway's context has them"
    limits = execs.slots.limits
    command = command_of(input.argv, input.shell)
    stdin = stdin_of(stdin_bytes(input.stdin, input.stdin_base64), limits)
    timeout = timeout_of(input.timeout_seconds, limits)
    target = await find_target(ctx.sessions, ctx.viewer, str(input.session_id), input.kernel)
    meter = ActivityMeter(ctx.sessions, target.session_id, ActivityClock(limits.activity_interval))
    return Prepared(execs, command, stdin, timeout, target, meter)


@strawberry.type
class ExecMutations:
    @fields.mutation(
        description="Run a command in a RUNNING session's kernel (docker or exec driver) through Nomad's exec, and "
        "return its exit code and output (each stream capped, `stdoutTruncated`/`stderrTruncated` say so). Errors: "
        "NOT_FOUND (no such session or kernel of yours), SESSION_NOT_RUNNING, EXEC_NOT_SUPPORTED (QEMU; raw_exec but "
        "for a SUPERADMIN), EXEC_TIMEOUT, TOO_MANY_EXECS (with `limit` and `per`), INVALID_INPUT (the command, stdin "
        "over its cap, the timeout), EXEC_FAILED (Nomad refused it)."
    )
    async def exec_in_kernel(self, info: Info, input: ExecInput) -> ExecResult:
        run = await prepared(info, input)
        slots = run.execs.slots
        with slots.claimed(info.context.viewer.id, run.execs):
            done = await run_command(
                info.context.nomad.settings,
                run.target,
                run.command,
                stdin=run.stdin,
                timeout=run.timeout,
                limits=slots.limits,
                meter=run.meter,
            )
        return exec_result_of(done.exit_code, done.stdout, done.stderr)
