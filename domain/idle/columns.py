"""Every session's utilization window as arrays: one sweep's samples recorded, and the windows read, as vector
operations over all sessions at once. Pure: the caller passes the sweep's moment.

:class:`~domain.idle.window.UtilizationWindow` is one session's window as immutable Python objects, the reference
implementation of the rules (:mod:`domain.idle.window`). Recording many of them one by one every sweep was a large part
of ``bench/idle``'s sweep (bench/README.md); :class:`WindowColumns` holds the same series and follows the same rules,
sample by sample, as numpy arrays:

* one :class:`SeriesTable` per window shape (``window_seconds``, ``interval``) and metric: a row per session whose
  window of that shape keeps that metric, each row a ring of stamps and values (fixed point, as the window's) with its
  start, count and running total;
* :meth:`WindowColumns.record` appends one sweep's sample of every session with one vector write per table, restarts
  the series after a gap, forgets a metric the session stopped reporting long ago, and trims each series to the
  window, all as the window's :meth:`~domain.idle.window.UtilizationWindow.add` does (``record_sample`` in a loop);
  it returns each checked metric's average and the seconds until its window is full, the two numbers the utilization
  check reads.

A session's window moves to fresh rows when the policy changes its shape (as ``record_sample`` starts a fresh window),
and its rows are freed when a sweep no longer records it (not RUNNING any more, or its utilization not checked).
The columns are a :class:`~collections.abc.Mapping` of session id -> :class:`UtilizationWindow`, built on access
(the tests). :meth:`WindowColumns.stored` writes the stored form, one :class:`WindowTableDoc` per table
(its numbers straight from the arrays), and :meth:`WindowColumns.from_stored` reads it back into arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from domain.idle.window import MAX_GAP_INTERVALS, SCALE, MetricSeries, UtilizationWindow, check_shape

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Shape = tuple[float, float]
"""(window seconds, interval seconds) of a window."""


class SeriesTable:
    """One metric's series of every session whose window has one shape: a ring of samples per row."""

    def __init__(self, window_seconds: float, interval: float, *, rows: int = 64) -> None:
        self.window_seconds, self.interval = window_seconds, interval
        self.max_gap_ms = round(interval * MAX_GAP_INTERVALS * SCALE)
        """A newer sample further than this (milliseconds) from the last one restarts the series."""
        self.span_needed_ms = round(max(window_seconds - interval, 0.0) * SCALE)
        """How far apart (milliseconds) the first and last sample of a full series are."""
        self.forget_ms = round(window_seconds * SCALE) + self.max_gap_ms
        """A series not sampled for longer than this (milliseconds) is forgotten when a sample lacks its metric."""
        capacity = math.ceil(window_seconds / interval) + 2
        self.stamps: Ints = np.zeros((rows, capacity), np.int64)
        """Unix milliseconds; row r's samples are at columns ``start[r]``, ``start[r] + 1``, ... (mod capacity)."""
        self.values: Ints = np.zeros((rows, capacity), np.int64)
        """Thousandths of a percent, one per stamp."""
        self.start: Ints = np.zeros(rows, np.int64)
        self.count: Ints = np.zeros(rows, np.int64)
        """Samples kept per row; 0: no series (yet, or any more)."""
        self.total: Ints = np.zeros(rows, np.int64)
        """The sum of each row's kept values (thousandths of a percent)."""
        self._free = list(range(rows - 1, -1, -1))

    def take_row(self) -> int:
        """A row with no samples, for a new session."""
        if not self._free:
            rows = len(self.count)
            self.stamps = np.concatenate([self.stamps, np.zeros_like(self.stamps)])
            self.values = np.concatenate([self.values, np.zeros_like(self.values)])
            self.start = np.concatenate([self.start, np.zeros_like(self.start)])
            self.count = np.concatenate([self.count, np.zeros_like(self.count)])
            self.total = np.concatenate([self.total, np.zeros_like(self.total)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        row = self._free.pop()
        self.start[row] = self.count[row] = self.total[row] = 0
        return row

    def free_row(self, row: int) -> None:
        self.count[row] = 0
        self._free.append(row)

    def _widen(self) -> None:
        """Double the ring (samples closer together than the interval, a sweep asked for early): each row unrolled."""
        capacity = self.stamps.shape[1]
        order = (self.start[:, None] + np.arange(capacity)) % capacity
        pad = np.zeros_like(self.stamps)
        self.stamps = np.concatenate([np.take_along_axis(self.stamps, order, 1), pad], 1)
        self.values = np.concatenate([np.take_along_axis(self.values, order, 1), pad], 1)
        self.start[:] = 0

    def record(self, rows: Ints, values: Floats, keyed: npt.NDArray[np.bool_], stamp: int) -> Ints:
        """One sample at ``stamp`` (unix milliseconds) for each of ``rows``: ``values`` in percent, ``keyed`` whether
        the sample named the metric at all (a non-finite value named is skipped, yet keeps the series from being
        forgotten). Returns the rows whose series was forgotten (now empty)."""
        count = self.count[rows]
        capacity = self.stamps.shape[1]
        has = count > 0
        last = np.where(has, self.stamps[rows, (self.start[rows] + count - 1) % capacity], 0)
        finite = keyed & np.isfinite(values)
        fixed = np.rint(np.where(finite, values, 0.0) * SCALE).astype(np.int64)
        since = stamp - last
        gap = since > self.max_gap_ms
        restart = finite & (~has | gap)
        append = finite & has & ~gap & (since > 0)
        forgotten = rows[~keyed & has & (since > self.forget_ms)]
        self.count[forgotten] = 0
        if restart.any():
            at = rows[restart]
            self.start[at], self.count[at], self.total[at] = 0, 1, fixed[restart]
            self.stamps[at, 0], self.values[at, 0] = stamp, fixed[restart]
        if append.any():
            at = rows[append]
            if (self.count[at] >= capacity).any():
                self._widen()
                capacity = self.stamps.shape[1]
            added = fixed[append]
            position = (self.start[at] + self.count[at]) % capacity
            self.stamps[at, position], self.values[at, position] = stamp, added
            self.count[at] += 1
            self.total[at] += added
            # keep the newest sample at or before the window's start, and everything after it
            oldest_kept = stamp - self.span_needed_ms
            while at.size:
                second = (self.start[at] + 1) % capacity
                drop = (self.count[at] >= 2) & (self.stamps[at, second] <= oldest_kept)
                at, second = at[drop], second[drop]
                self.total[at] -= self.values[at, self.start[at]]
                self.start[at], self.count[at] = second, self.count[at] - 1
        return forgotten

    def readings(self, rows: Ints, now_ms: float) -> tuple[Floats, Floats]:
        """(each row's average in percent, NaN without samples; the seconds until its window is full)."""
        count = self.count[rows]
        capacity = self.stamps.shape[1]
        start = self.start[rows]
        first = self.stamps[rows, start]
        last = self.stamps[rows, (start + count - 1) % capacity]
        has = count > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            average = np.where(has, self.total[rows] / (count * SCALE), np.nan)
        stale = ~has | (now_ms - last > self.max_gap_ms)
        to_fill = np.where(stale, self.window_seconds, np.maximum(self.span_needed_ms - (last - first), 0) / SCALE)
        return average, to_fill

    def series(self, row: int) -> MetricSeries | None:
        count = int(self.count[row])
        if not count:
            return None
        order = (int(self.start[row]) + np.arange(count)) % self.stamps.shape[1]
        return MetricSeries(tuple(self.stamps[row, order].tolist()), tuple(self.values[row, order].tolist()))

    def stored(self, metric: str, sessions: Sequence[str], rows: Ints) -> WindowTableDoc:
        """``rows``' series of ``metric`` as stored (``sessions``: the session of each row, in order; every row with
        samples). Rows sampled at the same sweeps share one stamp list (in the steady state nearly all of them), found
        by array operations; the values go out as the bytes of one array."""
        capacity = self.stamps.shape[1]
        counts = self.count[rows]
        order = (self.start[rows][:, None] + np.arange(capacity)) % capacity
        stamps = np.take_along_axis(self.stamps[rows], order, 1)
        stamps[:, 1:] = np.diff(stamps, axis=1)
        kept = np.arange(capacity) < counts[:, None]
        stamps[~kept] = 0  # past the count: equal series give equal rows
        values = np.take_along_axis(self.values[rows], order, 1)[kept]
        first, index = _distinct_rows(stamps)
        lists = [row[:count].tolist() for row, count in zip(stamps[first], counts[first].tolist(), strict=True)]
        return WindowTableDoc(
            TABLE_VERSION,
            self.window_seconds,
            self.interval,
            metric,
            list(sessions),
            lists,
            index.tolist(),
            values.astype(VALUE_TYPE).tobytes(),
        )

    def load(self, doc: WindowTableDoc) -> None:
        """Write ``doc``'s series into rows 0, 1, ... (one per session, in order) of this table, made empty with at
        least that many rows. Raises ``ValueError`` on anything malformed, before writing."""
        lists, rows = doc.stamps, len(doc.sessions)
        lengths = np.array([len(stamps) for stamps in lists], np.int64)
        if (lengths == 0).any():
            raise ValueError("an empty stamp list")
        width = int(lengths.max()) if lists else 0
        listed = np.arange(width) < lengths[:, None]
        try:
            padded = np.zeros((len(lists), width), np.int64)
            padded[listed] = [stamp for stamps in lists for stamp in stamps]
        except OverflowError as exc:
            raise ValueError("a number out of range") from exc
        if len(doc.values) % VALUE_TYPE.itemsize:
            raise ValueError("values of a partial number of bytes")
        values = np.frombuffer(doc.values, VALUE_TYPE).astype(np.int64)
        padded = np.cumsum(padded, axis=1)
        if (padded[:, :1] < 0).any() or (np.diff(padded, axis=1)[listed[:, 1:]] <= 0).any():
            raise ValueError("stamps that do not increase")
        index = np.array(doc.stamp_list, np.int64)
        if len(index) != rows or len(set(doc.sessions)) != rows:
            raise ValueError("one stamp list per row, one row per session")
        if ((index < 0) | (index >= len(lists))).any():
            raise ValueError("a row names no stamp list")
        counts = lengths[index]
        if int(counts.sum()) != len(values):
            raise ValueError("as many values as stamps")
        if len(self.count) < rows or (self.count > 0).any():
            raise ValueError("an empty table with enough rows is needed")
        while self.stamps.shape[1] < width:
            self._widen()
        if rows:
            ends = np.cumsum(counts)
            flat_row = np.repeat(np.arange(rows), counts)
            column = np.arange(len(values)) - np.repeat(ends - counts, counts)
            self.stamps[flat_row, column] = padded[index[flat_row], column]
            self.values[flat_row, column] = values
            self.count[:rows], self.start[:rows] = counts, 0
            self.total[:rows] = np.add.reduceat(values, ends - counts)
        self._free = list(range(len(self.count) - 1, rows - 1, -1))


class Recorded(NamedTuple):
    """One sweep's readings of the sessions recorded, in the order of the entries."""

    averages: list[float | None]
    """Each entry's checked metrics' averages in percent, one after the other (in the order of its metrics); None
    without samples."""
    to_fill: list[float]
    """Per entry, the seconds until every one of its checked metrics' window is full (0: all full and fresh)."""


class Entry(NamedTuple):
    """What :meth:`WindowColumns.record` records for one session."""

    session_id: str
    shape: Shape
    metrics: Sequence[str]
    """The checked metrics, in the order readings are wanted."""
    sample: Mapping[str, float]
    """Metric -> percent, this sweep's (metrics not checked are ignored)."""


class Placed(NamedTuple):
    """Where one table's samples of a sweep go."""

    rows: Ints
    """The table's rows recorded, each once."""
    entries: list[int]
    """For each of ``rows``, the index of the key (and sample) it records; -1: a series kept of a metric no longer
    checked (recorded as not sampled)."""
    rows_read: Ints
    """The rows whose readings are wanted (those of checked metrics)."""
    positions: Ints
    """Where each of ``rows_read``'s readings go among the sweep's :attr:`Recorded.averages`."""


class Layout(NamedTuple):
    """Where one sweep's samples go, for the keys it was worked out for (:meth:`WindowColumns.record_keyed`)."""

    keys: list[tuple[str, Shape, Sequence[str]]]
    tables: dict[tuple[Shape, str], Placed]
    flat: int
    """How many readings: every key's metrics."""
    starts: Ints
    """Where each key's readings start among them."""


class WindowColumns(Mapping[str, UtilizationWindow]):
    """The windows of every session whose utilization the sweep checks (session id -> window, built on access)."""

    def __init__(self) -> None:
        self.tables: dict[tuple[Shape, str], SeriesTable] = {}
        """(window shape, metric) -> its table."""
        self.rows: dict[str, tuple[Shape, dict[str, int]]] = {}
        """Session id -> its window's shape and metric -> row (in that shape's table of the metric)."""
        self._layout: Layout | None = None
        """Where the last sweep's samples went (:meth:`record_keyed`); rows change only there."""

    # -- the Mapping of windows --

    def __getitem__(self, session_id: str) -> UtilizationWindow:
        shape, rows = self.rows[session_id]
        series = {}
        for metric, row in rows.items():
            found = self.tables[(shape, metric)].series(row)
            if found is not None:
                series[metric] = found
        return UtilizationWindow(window_seconds=shape[0], interval=shape[1], series=series)

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.rows

    @classmethod
    def of(cls, windows: Mapping[str, UtilizationWindow]) -> WindowColumns:
        """Columns holding ``windows`` (the saved ones, when a leader takes over), written table by table."""
        if isinstance(windows, WindowColumns):
            return windows
        columns = cls()
        loading: dict[tuple[Shape, str], list[tuple[int, MetricSeries]]] = {}
        for session_id, window in windows.items():
            shape = (window.window_seconds, window.interval)
            rows = columns._rows_of(session_id, shape)
            for metric, series in window.series.items():
                row = rows[metric] = columns._table(shape, metric).take_row()
                loading.setdefault((shape, metric), []).append((row, series))
        for key, loaded in loading.items():
            table = columns.tables[key]
            by_count: dict[int, list[tuple[int, MetricSeries]]] = {}
            for row, series in loaded:
                by_count.setdefault(len(series.stamps), []).append((row, series))
            while max(by_count) > table.stamps.shape[1]:
                table._widen()
            for count, group in by_count.items():  # a full window's count for most: one 2-D write each
                rows_array = np.array([row for row, _ in group], np.int64)
                table.stamps[rows_array, :count] = np.array([series.stamps for _, series in group], np.int64)
                table.values[rows_array, :count] = np.array([series.values for _, series in group], np.int64)
                table.count[rows_array] = count
                table.total[rows_array] = [series.total for _, series in group]
        return columns

    def _table(self, shape: Shape, metric: str) -> SeriesTable:
        table = self.tables.get((shape, metric))
        if table is None:
            table = self.tables[(shape, metric)] = SeriesTable(*shape)
        return table

    def _rows_of(self, session_id: str, shape: Shape) -> dict[str, int]:
        known = self.rows.get(session_id)
        if known is not None and known[0] == shape:
            return known[1]
        if known is not None:  # the policy changed the window's shape: a fresh window
            self._free(session_id)
        rows: dict[str, int] = {}
        self.rows[session_id] = (shape, rows)
        return rows

    def _free(self, session_id: str) -> None:
        shape, rows = self.rows.pop(session_id)
        for metric, row in rows.items():
            self.tables[(shape, metric)].free_row(row)

    # -- one sweep --

    def record(self, ts: float, entries: Sequence[tuple[str, Shape, Sequence[str], Mapping[str, float]]]) -> Recorded:
        """Record one sweep's samples, taken at ``ts`` (unix seconds), for the sessions of ``entries`` (:class:`Entry`
        or plain tuples of its fields; each with at least one metric; the other sessions' windows are dropped), and
        read back what the utilization check needs."""
        return self.record_keyed(ts, [entry[:3] for entry in entries], [entry[3] for entry in entries])

    def record_keyed(
        self, ts: float, keys: Sequence[tuple[str, Shape, Sequence[str]]], samples: Sequence[Mapping[str, float]]
    ) -> Recorded:
        """:meth:`record` of the entries ``zip(keys, samples)``. Which row of which table each sample goes to (the
        sweep's :class:`Layout`) is worked out when ``keys`` differ from the last sweep's, and reused while they are
        the same (the steady state: the same sessions, checked the same way); the idle sweep keeps each session's key
        with its plan, so the comparison is one of identical objects."""
        if len(keys) != len(samples):
            raise ValueError("one sample per key")
        layout = self._layout
        if layout is None or layout.keys != keys:
            layout = self._layout = self._lay_out(keys)
        stamp, now_ms = round(ts * SCALE), ts * SCALE
        averages = np.full(layout.flat, np.nan)
        to_fill = np.zeros(layout.flat)
        for key, placed in layout.tables.items():
            metric = key[1]
            found = [samples[i].get(metric) if i >= 0 else None for i in placed.entries]
            keyed = np.array([value is not None for value in found])
            table = self.tables[key]
            table.record(placed.rows, np.array(found, np.float64), keyed, stamp)
            average, fill = table.readings(placed.rows_read, now_ms)
            averages[placed.positions], to_fill[placed.positions] = average, fill
        if not keys:
            return Recorded([], [])
        return Recorded(
            [None if a != a else a for a in averages.tolist()], np.maximum.reduceat(to_fill, layout.starts).tolist()
        )

    def _lay_out(self, keys: Sequence[tuple[str, Shape, Sequence[str]]]) -> Layout:
        """Rows for every key's metrics (taken where missing, moved when a session's shape changed; the windows of
        sessions not among ``keys`` freed), and where each sample goes."""
        placing: dict[tuple[Shape, str], tuple[list[int], list[int], list[int]]] = {}
        flat = 0
        known_rows = self.rows
        for index, (session_id, shape, metrics) in enumerate(keys):
            known = known_rows.get(session_id)
            rows = known[1] if known is not None and known[0] == shape else self._rows_of(session_id, shape)
            for metric in metrics:
                row = rows.get(metric)
                if row is None:
                    row = rows[metric] = self._table(shape, metric).take_row()
                batch = placing.setdefault((shape, metric), ([], [], []))
                batch[0].append(row)
                batch[1].append(index)
                batch[2].append(flat)
                flat += 1
            if len(rows) > len(metrics):  # kept series of metrics no longer checked: never sampled
                for metric, row in rows.items():
                    if metric not in metrics:
                        batch = placing.setdefault((shape, metric), ([], [], []))
                        batch[0].append(row)
                        batch[1].append(-1)
                        batch[2].append(-1)
        if len(known_rows) > len(keys) or flat > len(keys):  # some sessions may not be recorded any more
            recorded = {key[0] for key in keys}
            for session_id in [s for s in known_rows if s not in recorded]:
                self._free(session_id)
        tables = {}
        for key, (rows_list, entries, positions) in placing.items():
            rows_array, at = np.array(rows_list, np.int64), np.array(positions, np.int64)
            wanted = at >= 0
            tables[key] = Placed(rows_array, entries, rows_array[wanted], at[wanted])
        starts = np.cumsum([0] + [len(key[2]) for key in keys[:-1]]) if keys else np.zeros(0, np.int64)
        return Layout(list(keys), tables, flat, starts)

    # -- the stored form --

    def stored(self) -> dict[str, WindowTableDoc]:
        """Every table with samples as stored (:class:`WindowTableDoc`), under its name (:func:`table_name`)."""
        sessions: dict[tuple[Shape, str], dict[int, str]] = {}
        for session_id, (shape, rows) in self.rows.items():
            for metric, row in rows.items():
                sessions.setdefault((shape, metric), {})[row] = session_id
        stored: dict[str, WindowTableDoc] = {}
        for (shape, metric), table in self.tables.items():
            live = np.flatnonzero(table.count > 0)
            if not live.size:
                continue
            owners = sessions[(shape, metric)]
            stored[table_name(shape, metric)] = table.stored(metric, [owners[row] for row in live.tolist()], live)
        return stored

    @classmethod
    def from_stored(cls, tables: Iterable[WindowTableDoc]) -> tuple[WindowColumns, list[str]]:
        """Columns holding the stored tables (a new leader's), and why any table was left out (malformed: its
        sessions start that metric's series afresh)."""
        columns, problems = cls(), []
        for doc in tables:
            shape = (doc.window_seconds, doc.interval)
            try:
                if doc.v != TABLE_VERSION:
                    raise ValueError(f"unsupported version {doc.v!r}")
                check_shape(*shape)
                if not doc.metric or (shape, doc.metric) in columns.tables:
                    raise ValueError("no metric, or a table given twice")
                clash = [s for s in doc.sessions if s in columns.rows and columns.rows[s][0] != shape]
                if clash:
                    raise ValueError(f"session {clash[0]} has windows of two shapes")
                table = SeriesTable(*shape, rows=max(len(doc.sessions), 64))
                table.load(doc)
            except ValueError as exc:
                problems.append(f"{table_name(shape, doc.metric)}: {exc}")
                continue
            columns.tables[(shape, doc.metric)] = table
            for row, session_id in enumerate(doc.sessions):
                known = columns.rows.get(session_id)
                if known is None:
                    known = columns.rows[session_id] = (shape, {})
                known[1][doc.metric] = row
        return columns, problems


TABLE_VERSION = 1


@dataclass(frozen=True, slots=True)
class WindowTableDoc:
    """One table as Redis keeps it (``Keys.idle_window_tables``; version 1 of its JSON, written by ``core.codec``):
    one metric's series of every session whose window has one shape."""

    v: int
    """The version: 1."""
    window_seconds: float
    interval: float
    """Seconds: the windows' shape."""
    metric: str
    sessions: list[str]
    """One session per row."""
    stamps: list[list[int]]
    """The distinct stamp lists: each the unix milliseconds of its first sample, then the milliseconds since the one
    before (strictly positive)."""
    stamp_list: list[int]
    """Per row, the index of its stamp list."""
    values: bytes
    """The rows' values in thousandths of a percent, row after row, oldest first, as many per row as its stamp list
    has stamps: signed 64-bit little-endian integers, one after the other (base64 in the JSON)."""


VALUE_TYPE = np.dtype("<i8")
"""How :attr:`WindowTableDoc.values` holds each number."""

_ROW_WEIGHTS = np.random.default_rng(20261124).integers(1, 2**62, 4096)
"""Multipliers that fold a row of stamps into one number (wrapping), to find equal rows without comparing each pair."""


def _distinct_rows(table: Ints) -> tuple[Ints, Ints]:
    """(the first row of each distinct row of ``table``, in order of first appearance; for each row, the index of its
    distinct row among those)."""
    if not len(table):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    width = table.shape[1]
    if width <= len(_ROW_WEIGHTS):
        folded = table @ _ROW_WEIGHTS[:width]
        _, first, inverse = np.unique(folded, return_index=True, return_inverse=True)
        if not (table == table[first[inverse]]).all():  # two different rows folded alike: compare them whole
            _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    appearance = np.argsort(first, kind="stable")
    rank = np.empty_like(appearance)
    rank[appearance] = np.arange(len(appearance))
    return first[appearance], rank[inverse.reshape(-1)]


def table_name(shape: Shape, metric: str) -> str:
    """The field a table is stored under: its shape and metric, for the operator reading Redis."""
    return f"{shape[0]:g}s/{shape[1]:g}s/{metric}"
