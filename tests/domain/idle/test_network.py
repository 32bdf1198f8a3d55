"""A kernel's network counters as its bootstrap copies them (``/proc/uptime``, ``/proc/net/dev``), read into rates."""

from __future__ import annotations

from domain.idle.network import NET_RX, NET_TX, NetReading, net_rates, parse_net_stats

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compres
    lo: 5000      50    0    0    0     0          0         0     5000      50    0    0    0     0       0          0
  eth0: {rx}    10    0    0    0     0          0         0 {tx}    20    0    0    0     0       0          0
"""


def copied(uptime: float, rx: int, tx: int) -> str:
    return f"{uptime} 1234.50\n" + NET_DEV.format(rx=rx, tx=tx)


def test_every_interface_but_loopback_counts() -> None:
    assert parse_net_stats(copied(100.5, 2000, 3000)) == NetReading(100.5, 2000, 3000)


def test_what_is_not_a_copy_reads_as_none() -> None:
    assert parse_net_stats("") is None
    assert parse_net_stats("100.5 1\n") is None
    assert parse_net_stats(copied(100.5, 1, 2).rsplit("\n", 2)[0][:-40]) is None  # cut short mid-line
    assert parse_net_stats("not a number\n" + NET_DEV.format(rx=1, tx=2)) is None


def test_rates_are_bytes_over_the_nodes_uptime_between_two_copies() -> None:
    before, after = NetReading(100.0, 1000, 500), NetReading(104.0, 9000, 4500)
    assert net_rates(None, after) == {}
    assert net_rates(before, after) == {NET_RX: 2000.0, NET_TX: 1000.0}
    assert net_rates(after, after) == {}  # not copied again since
    assert net_rates(after, NetReading(105.0, 10, 10)) == {}  # counters went back: another namespace
