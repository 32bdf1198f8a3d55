"""WindowColumns (every session's window as arrays) against the reference, one UtilizationWindow per session fed by
``record_sample``: the same windows, averages and fullness after every sweep, whatever the sweeps hold."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.codec import decode, encode
from domain.idle.columns import Entry, WindowColumns, WindowTableDoc
from domain.idle.window import UtilizationWindow, record_sample

Sweep = tuple[float, list[Entry]]
"""(unix seconds, what each session recorded): a session not listed is no longer swept."""


def plain(
    windows: Mapping[str, UtilizationWindow], ts: float, entries: Sequence[Entry]
) -> dict[str, UtilizationWindow]:
    """The reference: each session's window, one by one (what the sweep did before the columns)."""
    return {
        e.session_id: record_sample(
            windows.get(e.session_id),
            ts=ts,
            sample=e.sample,
            window_seconds=e.shape[0],
            interval=e.shape[1],
            metrics=set(e.metrics),
        )
        for e in entries
    }


def reloaded(columns: WindowColumns) -> WindowColumns:
    """``columns`` saved and loaded back (as a new leader does), through their JSON."""
    stored = [decode(encode(table), WindowTableDoc) for table in columns.stored().values()]
    loaded, problems = WindowColumns.from_stored(stored)
    assert problems == []
    return loaded


def check_same(sweeps: Sequence[Sweep], columns: WindowColumns | None = None) -> WindowColumns:
    columns = columns if columns is not None else WindowColumns()
    reference: dict[str, UtilizationWindow] = dict(columns)
    for ts, entries in sweeps:
        recorded = columns.record(ts, entries)
        reference = plain(reference, ts, entries)
        assert dict(columns) == reference
        averages = [reference[e.session_id].average(m) for e in entries for m in e.metrics]
        assert recorded.averages == averages
        for i, entry in enumerate(entries):
            window = reference[entry.session_id]
            assert recorded.to_fill[i] == max(window.seconds_until_full(m, now=ts) for m in entry.metrics)
        assert {i: w for i, w in reloaded(columns).items() if w.series} == {
            i: w for i, w in reference.items() if w.series
        }
        assert dict(WindowColumns.of(reference)) == reference  # as a new leader loads them
    return columns


CPU = ("cpu_util",)
SHAPE = (60.0, 15.0)


def regular(samples: Sequence[Mapping[str, float]], *, metrics: Sequence[str] = CPU, shape: tuple[float, float] = SHAPE,
            start: float = 1000.0, session: str = "s1") -> list[Sweep]:  # fmt: skip
    return [(start + i * shape[1], [Entry(session, shape, metrics, sample)]) for i, sample in enumerate(samples)]


CASES: dict[str, list[Sweep]] = {
    "empty window: no sample yet, then one": regular([{}, {}, {"cpu_util": 3.0}]),
    "a window filling up and sliding": regular([{"cpu_util": float(v)} for v in range(12)]),
    "a gap restarts the series": [
        *regular([{"cpu_util": 1.0}] * 5),
        (1000.0 + 5 * 15 + 30, [Entry("s1", SHAPE, CPU, {"cpu_util": 9.0})]),
    ],
    "jitter just inside the gap": [
        (1000.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 1.0})]),
        (1022.5, [Entry("s1", SHAPE, CPU, {"cpu_util": 2.0})]),
        (1045.001, [Entry("s1", SHAPE, CPU, {"cpu_util": 3.0})]),
    ],
    "unmeasured sweeps (no sample) keep the series until it is stale": regular(
        [{"cpu_util": 1.0}, {}, {}, {}, {}, {}, {}, {"cpu_util": 2.0}]
    ),
    "a non-finite reading is skipped": regular([{"cpu_util": 1.0}, {"cpu_util": math.nan}, {"cpu_util": math.inf}]),
    "a sweep no newer than the last is ignored": [
        (1000.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 1.0})]),
        (1000.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 5.0})]),
        (999.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 5.0})]),
    ],
    "sweeps closer than the interval (the ring widens)": [
        (1000.0 + i, [Entry("s1", SHAPE, CPU, {"cpu_util": float(i)})]) for i in range(40)
    ],
    "a session appearing, disappearing, coming back": [
        (1000.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 1.0})]),
        (1015.0, [Entry("s1", SHAPE, CPU, {"cpu_util": 1.0}), Entry("s2", SHAPE, CPU, {"cpu_util": 4.0})]),
        (1030.0, [Entry("s2", SHAPE, CPU, {"cpu_util": 4.0})]),
        (1045.0, [Entry("s2", SHAPE, CPU, {"cpu_util": 4.0}), Entry("s1", SHAPE, CPU, {"cpu_util": 7.0})]),
    ],
    "a kernel added: a device metric appears": [
        *regular([{"cpu_util": 1.0}] * 3),
        *regular(
            [{"cpu_util": 1.0, "sim_util": 50.0, "sim_mem": 3.0}] * 3,
            metrics=("cpu_util", "sim_util"),
            start=1045.0,
        ),
    ],
    "policy change mid-window: the shape (a fresh window), then back": [
        *regular([{"cpu_util": 1.0}] * 3),
        *regular([{"cpu_util": 2.0}] * 3, shape=(120.0, 15.0), start=1045.0),
        *regular([{"cpu_util": 3.0}] * 2, start=1090.0),
    ],
    "policy change mid-window: a metric no longer checked, kept until stale": [
        *regular([{"cpu_util": 1.0, "mem": 40.0}] * 3, metrics=("cpu_util", "mem")),
        *regular([{"cpu_util": 1.0, "mem": 40.0}] * 8, start=1045.0),
        *regular([{"cpu_util": 1.0, "mem": 40.0}] * 2, metrics=("cpu_util", "mem"), start=1165.0),
    ],
    "a metric missing from the samples is forgotten just after window + gap, not at it": [
        (1000.0, [Entry("s1", SHAPE, ("cpu_util", "mem"), {"cpu_util": 1.0, "mem": 5.0})]),
        *[(1000.0 + t, [Entry("s1", SHAPE, ("cpu_util", "mem"), {"cpu_util": 1.0})]) for t in (15.0, 30.0, 82.5)],
        (1000.0, [Entry("s2", SHAPE, ("cpu_util", "mem"), {"cpu_util": 1.0, "mem": 5.0})]),
        *[(1000.0 + t, [Entry("s2", SHAPE, ("cpu_util", "mem"), {"cpu_util": 1.0})]) for t in (15.0, 30.0, 82.501)],
    ],
    "window of one interval": regular([{"cpu_util": float(v)} for v in range(4)], shape=(15.0, 15.0)),
    "values that round to the same fixed point, and halves": regular(
        [{"cpu_util": 0.0005}, {"cpu_util": 0.0015}, {"cpu_util": 2.0004999}, {"cpu_util": 1e6}]
    ),
}


@pytest.mark.parametrize("sweeps", CASES.values(), ids=list(CASES))
def test_columns_record_as_record_sample_does(sweeps: list[Sweep]) -> None:
    check_same(sweeps)


def test_columns_go_on_from_loaded_windows() -> None:
    """A new leader loads the saved windows into columns and records on from there."""
    first = regular([{"cpu_util": float(v), "mem": 2.0} for v in range(6)], metrics=("cpu_util", "mem"))
    saved = dict(check_same(first))
    check_same(regular([{"cpu_util": 1.0}] * 6, start=1090.0), WindowColumns.of(saved))


METRICS = ("cpu_util", "mem", "sim_util")
samples = st.dictionaries(
    st.sampled_from(METRICS), st.one_of(st.floats(0, 200, allow_nan=False), st.just(math.nan)), max_size=3
)
entry = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([(60.0, 15.0), (45.0, 15.0), (30.0, 10.0)]),
    st.lists(st.sampled_from(METRICS), min_size=1, max_size=3, unique=True),
    samples,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 1.0, 7.5, 10.0, 15.0, 22.0, 23.0, 40.0, 90.0]), st.lists(entry)), max_size=14
    )
)
def test_columns_record_as_record_sample_does_whatever_the_sweeps(steps: list[tuple[float, list[tuple]]]) -> None:  # type: ignore[type-arg]
    ts, sweeps = 1000.0, []
    for step, entries in steps:
        ts += step
        unique = {e[0]: Entry(e[0], e[1], tuple(e[2]), e[3]) for e in entries}
        sweeps.append((ts, list(unique.values())))
    check_same(sweeps)


keys = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.tuples(
        st.sampled_from([(60.0, 15.0), (45.0, 15.0)]),
        st.lists(st.sampled_from(METRICS), min_size=1, max_size=3, unique=True),
    ),
    min_size=1,
)
steady = st.lists(st.tuples(st.sampled_from([7.5, 15.0, 15.0, 15.0, 40.0]), st.lists(samples, min_size=4, max_size=4)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(keys, steady), max_size=5))
def test_columns_record_sweeps_of_the_same_sessions_as_record_sample_does(
    phases: list[tuple[dict[str, tuple[tuple[float, float], list[str]]], list[tuple[float, list[dict[str, float]]]]]],
) -> None:
    """The steady state: sweep after sweep of the same sessions checked the same way (where each sample goes is
    worked out once and reused), then another set of sessions or shapes or metrics."""
    ts, sweeps = 1000.0, []
    for sessions, steps in phases:
        for step, sampled in steps:
            ts += step
            entries = [
                Entry(s, shape, tuple(m), sample)
                for (s, (shape, m)), sample in zip(sessions.items(), sampled, strict=False)
            ]
            sweeps.append((ts, entries))
    check_same(sweeps)


def test_record_keyed_wants_one_sample_per_key() -> None:
    with pytest.raises(ValueError, match="one sample per key"):
        WindowColumns().record_keyed(1000.0, [("a", (60.0, 15.0), ("cpu_util",))], [])
