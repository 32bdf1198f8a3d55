"""Decoding Nomad's streamed log frames: split and packed reads, heartbeats, positions across rotated files."""

from __future__ import annotations

import base64
import json

import pytest

from nomad_jobs.log_frames import HEARTBEAT, FrameSplitter, LogFrame, absolute_offset, file_index


def frame(data: bytes, offset: int, file: str = "alloc/logs/main.stdout.0") -> str:
    return json.dumps({"Offset": offset, "Data": base64.b64encode(data).decode(), "File": file})


def test_frames_split_across_reads_and_packed_into_one() -> None:
    wire = (frame(b"line 1\n", 7) + "\n{}" + frame("é\n".encode(), 10)).encode()
    splitter = FrameSplitter()
    frames = [f for i in range(0, len(wire), 5) for f in splitter.feed(wire[i : i + 5])]
    assert frames == [
        LogFrame(b"line 1\n", "alloc/logs/main.stdout.0", 7),
        HEARTBEAT,
        LogFrame("é\n".encode(), "alloc/logs/main.stdout.0", 10),
    ]
    assert frames[1].is_heartbeat and not frames[0].is_heartbeat
    assert splitter.feed(b"") == []


def test_a_file_event_without_data_is_not_a_heartbeat() -> None:
    wire = json.dumps({"File": "alloc/logs/main.stdout.0", "FileEvent": "file truncated"}).encode()
    [truncated] = FrameSplitter().feed(wire)
    assert truncated.event == "file truncated" and not truncated.is_heartbeat and truncated.data == b""


def test_a_stream_that_is_not_json_frames_is_refused() -> None:
    splitter = FrameSplitter()
    with pytest.raises(ValueError):
        for _ in range(5):
            splitter.feed(b"{" + b"x" * (1 << 20))


def test_positions_count_the_rotated_files_still_there() -> None:
    files = [("main.stdout.1", 100), ("main.stdout.2", 50), ("main.stderr.1", 999), ("main.stdout.3", 7)]
    last = LogFrame(b"x", "alloc/logs/main.stdout.3", 5)
    assert absolute_offset(files, "main", "stdout", last) == 155
    assert absolute_offset(files, "main", "stdout", LogFrame(b"x", "alloc/logs/main.stdout.1", 20)) == 20
    assert file_index("alloc/logs/main.stderr.12") == 12 and file_index("alloc/logs/other") is None
