"""A kernel's network I/O, from the counters of its own network namespace. Pure.

Nomad's allocation stats carry no network counters. A kernel on the session network (``nomad_jobs.kernel_network``:
a namespace of its own) has its bootstrap copy ``/proc/uptime`` and ``/proc/net/dev``, as its namespace sees them,
into :data:`NET_STATS_FILE` in its allocation directory every :data:`NET_STATS_INTERVAL` seconds
(``nomad_jobs.session_job.BOOTSTRAP``); the idle checker reads that file through Nomad's file system API, which the
servers forward to the allocation's client, so it works whichever node runs the kernel. Two readings make a rate:
the bytes the kernel's interfaces (every one but ``lo``) received and sent between them, over the node's uptime
between them (so neither clock of the checker nor a late read skews it). The checker keeps the last reading of
each kernel between sweeps (``idle.sweeper``).
"""

from __future__ import annotations

from typing import NamedTuple

NET_RX = "net_rx"
"""Bytes per second the kernel received."""
NET_TX = "net_tx"
"""Bytes per second the kernel sent."""
NETWORK_METRICS = frozenset({NET_RX, NET_TX})
"""Metrics in bytes per second, not percent: charted on an axis of their own, never judged by a threshold (the idle
policy's network check is the time since the session's last traffic through the gateway, ``network_idle_timeout``)."""

NET_STATS_FILE = "alloc/caravan-net"
"""Where a kernel's counters are, relative to its allocation's directory (``/alloc/caravan-net`` in the kernel)."""
NET_STATS_INTERVAL = 2
"""Seconds between two copies of the counters."""


class NetReading(NamedTuple):
    uptime: float
    """The node's uptime (seconds) when the counters were copied."""
    rx: int
    """Bytes received, every interface but ``lo``, since the namespace was made."""
    tx: int
    """Bytes sent, likewise."""


def parse_net_stats(text: str) -> NetReading | None:
    """The reading in the file's ``text`` (``/proc/uptime``'s line, then ``/proc/net/dev``), or None when it is not
    one (empty, cut short, written by something else)."""
    lines = text.splitlines()
    if len(lines) < 3:
        return None
    try:
        uptime = float(lines[0].split()[0])
        rx = tx = 0
        interfaces = 0
        for line in lines[1:]:
            name, sep, counters = line.partition(":")
            if not sep or "|" in line:
                continue
            fields = counters.split()
            if len(fields) < 16:
                return None
            interfaces += 1
            if name.strip() != "lo":
                rx += int(fields[0])
                tx += int(fields[8])
    except (IndexError, ValueError):
        return None
    return NetReading(uptime, rx, tx) if interfaces else None


def net_rates(before: NetReading | None, now: NetReading) -> dict[str, float]:
    """Bytes per second received and sent between two readings of one kernel; none without an earlier reading, when
    the file was not copied again since, or when a counter went back (another namespace, a reset)."""
    if before is None:
        return {}
    elapsed = now.uptime - before.uptime
    if elapsed <= 0 or now.rx < before.rx or now.tx < before.tx:
        return {}
    return {NET_RX: (now.rx - before.rx) / elapsed, NET_TX: (now.tx - before.tx) / elapsed}
