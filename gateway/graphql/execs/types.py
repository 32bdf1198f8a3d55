"""GraphQL types of commands run in kernels."""

from __future__ import annotations

import base64
import binascii
from enum import Enum

import strawberry

from core.errors import InvalidInput
from domain.kernel_exec import CappedOutput


@strawberry.input(description="A command to run in a kernel: `argv` or `shell`, exactly one.")
class ExecInput:
    session_id: strawberry.ID
    kernel: str = strawberry.field(default="main1", description="The kernel's hostname (main1, sub1, …).")
    argv: list[str] | None = strawberry.field(
        default=None, description="The program and its arguments, run as they are (no shell)."
    )
    shell: str | None = strawberry.field(default=None, description="Shell text, run as `/bin/sh -c <shell>`.")
    stdin: str | None = strawberry.field(default=None, description="Stdin as text (sent as UTF-8), then end-of-file.")
    stdin_base64: str | None = strawberry.field(
        default=None, description="Stdin as base64 of exact bytes (instead of `stdin`), then end-of-file."
    )
    timeout_seconds: float | None = strawberry.field(
        default=None,
        description="Seconds the command may run: default CARAVAN_EXEC_DEFAULT_TIMEOUT (30), at most "
        "CARAVAN_EXEC_MAX_TIMEOUT (600); past it the command is stopped and the field fails with EXEC_TIMEOUT.",
    )


def stdin_bytes(text: str | None, encoded: str | None) -> bytes | None:
    """The stdin of an :class:`ExecInput`, as bytes."""
    if text is not None and encoded is not None:
        raise InvalidInput("give stdin as text or as base64, not both", field="stdinBase64")
    if encoded is not None:
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("stdinBase64 is not base64", field="stdinBase64") from None
    return text.encode() if text is not None else None


@strawberry.type(description="What a command in a kernel did.")
class ExecResult:
    exit_code: int = strawberry.field(description="The command's exit code (the shell's 127 for an unknown program).")
    stdout: str = strawberry.field(description="Stdout as UTF-8 text; bytes that are not UTF-8 become U+FFFD.")
    stdout_base64: str = strawberry.field(description="Stdout's exact bytes, base64.")
    stdout_truncated: bool = strawberry.field(
        description="Stdout went past CARAVAN_EXEC_MAX_OUTPUT_BYTES (1 MiB): only its first bytes are here."
    )
    stderr: str = strawberry.field(description="Stderr as UTF-8 text; bytes that are not UTF-8 become U+FFFD.")
    stderr_base64: str = strawberry.field(description="Stderr's exact bytes, base64.")
    stderr_truncated: bool = strawberry.field(
        description="Stderr went past CARAVAN_EXEC_MAX_OUTPUT_BYTES (1 MiB): only its first bytes are here."
    )


def exec_result_of(exit_code: int, stdout: CappedOutput, stderr: CappedOutput) -> ExecResult:
    return ExecResult(
        exit_code=exit_code,
        stdout=bytes(stdout.data).decode(errors="replace"),
        stdout_base64=base64.b64encode(stdout.data).decode("ascii"),
        stdout_truncated=stdout.truncated,
        stderr=bytes(stderr.data).decode(errors="replace"),
        stderr_base64=base64.b64encode(stderr.data).decode("ascii"),
        stderr_truncated=stderr.truncated,
    )


@strawberry.enum(name="ExecStream")
class ExecStream(Enum):
    STDOUT = "stdout"
    STDERR = "stderr"
    EXIT = "exit"


@strawberry.type(description="A piece of a streamed command's output, or (last) its exit code.")
class ExecChunk:
    stream: ExecStream = strawberry.field(description="STDOUT or STDERR; EXIT for the last chunk.")
    text: str = strawberry.field(
        description="This chunk as UTF-8 text (a character split between chunks is completed in the next one; bytes "
        "that are not UTF-8 become U+FFFD). Empty for EXIT."
    )
    data_base64: str = strawberry.field(description="This chunk's exact bytes, base64. Empty for EXIT.")
    exit_code: int | None = strawberry.field(description="The command's exit code, on the EXIT chunk only.")
