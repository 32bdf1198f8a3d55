"""An allocation's resource usage as Nomad's ``GET /v1/client/allocation/:id/stats`` answers it, read by msgspec.

The idle sweep reads one such body per kernel, every sweep: 10,000 of them took a quarter of a second with ``json``.
:class:`AllocStats` decodes only the allocation's total (``ResourceUsage``, as plain JSON: ``idle.samples`` reads it
leniently, a reading of the wrong type being a gap rather than an error) and keeps its tasks' usage undecoded
(``Tasks``: half the body), read only when an older or partial answer lacks the total.
"""

from __future__ import annotations

from typing import Any

import msgspec

Json = dict[str, Any]


class AllocStats(msgspec.Struct, frozen=True, rename={"resource_usage": "ResourceUsage", "tasks": "Tasks"}):
    resource_usage: Json | None = None
    """The allocation's total (``CpuStats``, ``MemoryStats``, ``DeviceStats``); None when Nomad sent none."""
    tasks: msgspec.Raw = msgspec.Raw(b"{}")
    """Task name -> ``{"ResourceUsage": ...}``, as JSON (:meth:`task_usages` reads it)."""

    def task_usages(self) -> Json:
        """Task name -> its stats (``{}`` when there are none or they are not an object)."""
        tasks = _ANY.decode(self.tasks)
        return tasks if isinstance(tasks, dict) else {}


_ANY = msgspec.json.Decoder()
_STATS = msgspec.json.Decoder(AllocStats)


def parse_alloc_stats(body: bytes) -> AllocStats:
    """``body`` as :class:`AllocStats`; ``ValueError`` when it is not a JSON object with an object (or null) as its
    ``ResourceUsage``."""
    try:
        return _STATS.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"malformed allocation stats: {exc}") from exc
