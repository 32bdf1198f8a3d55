"""How much of a kernel's log to read back: ``tailBytes`` of ``Kernel.logs`` and of the ``kernelLogs`` subscription,
one rule for both."""

from __future__ import annotations

from core.errors import InvalidInput

MAX_TAIL_BYTES = 4 * 1024 * 1024
"""Bytes: the most of a log's end one answer (or a subscription's start) carries."""


def checked_tail_bytes(tail_bytes: int) -> int:
    """``tail_bytes`` if it is 0 to :data:`MAX_TAIL_BYTES`; INVALID_INPUT on ``tailBytes`` otherwise."""
    if not 0 <= tail_bytes <= MAX_TAIL_BYTES:
        raise InvalidInput(f"tailBytes must be between 0 and {MAX_TAIL_BYTES} (4 MiB)", field="tailBytes")
    return tail_bytes
