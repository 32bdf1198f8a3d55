"""Nomad's streamed log frames, decoded (pure: no I/O).

``GET /v1/client/fs/logs/<alloc>?plain=false`` answers with a sequence of JSON objects
(``api/fs.go StreamFrame``): ``{"Offset", "Data" (base64), "File", "FileEvent"}``, and ``{}`` as a
heartbeat. Objects may be split across (or packed into) network reads, so a :class:`FrameSplitter`
keeps the unparsed rest between reads.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass

MAX_PENDING = 4 << 20
"""A frame carries at most 64 KiB of data; an unparsed rest this large is not Nomad's stream."""

_LOG_FILE = re.compile(r"(?:^|/)(?P<task>[^/]+)\.(?P<stream>stdout|stderr)\.(?P<index>\d+)$")


@dataclass(frozen=True)
class LogFrame:
    data: bytes
    file: str
    """The log file the data came from, e.g. ``alloc/logs/main.stdout.0`` (rotation bumps the index)."""
    offset: int
    """Position in ``file`` just after ``data``."""
    event: str = ""
    """``file truncated`` or ``file deleted``, when Nomad reports one."""

    @property
    def is_heartbeat(self) -> bool:
        return not self.data and not self.file and not self.event


HEARTBEAT = LogFrame(b"", "", 0)


class FrameSplitter:
    """Feed it the bytes as they arrive; it returns the frames they complete."""

    def __init__(self) -> None:
        self._pending = ""
        self._decoder = json.JSONDecoder()

    def feed(self, chunk: bytes) -> list[LogFrame]:
        # the JSON is ASCII (the data is base64), so a read cannot split a character
        self._pending += chunk.decode("ascii", errors="replace")
        frames: list[LogFrame] = []
        while True:
            text = self._pending.lstrip()
            if not text:
                self._pending = ""
                return frames
            try:
                doc, end = self._decoder.raw_decode(text)
            except json.JSONDecodeError:
                if len(text) > MAX_PENDING:
                    raise ValueError("Nomad's log stream is not a sequence of JSON frames") from None
                self._pending = text
                return frames  # the rest of this frame is still on its way
            self._pending = text[end:]
            frames.append(frame_of(doc))


def frame_of(doc: object) -> LogFrame:
    if not isinstance(doc, dict) or not doc:
        return HEARTBEAT
    return LogFrame(
        data=base64.b64decode(doc.get("Data") or ""),
        file=str(doc.get("File") or ""),
        offset=int(doc.get("Offset") or 0),
        event=str(doc.get("FileEvent") or ""),
    )


def file_index(path: str) -> int | None:
    """The rotation index of a log file (``main.stdout.3`` → 3), None if it is not a task log."""
    found = _LOG_FILE.search(path)
    return int(found["index"]) if found else None


def absolute_offset(files: list[tuple[str, int]], task: str, stream: str, frame: LogFrame) -> int:
    """Where ``frame`` ends counted from the start of the oldest log file still there: the ``offset`` to give
    Nomad with ``origin=start`` to carry on right after it. ``files`` are the log directory's (name, size)."""
    current = file_index(frame.file)
    if current is None:
        return frame.offset
    earlier = 0
    for name, size in files:
        found = _LOG_FILE.search(name)
        if found and found["task"] == task and found["stream"] == stream and int(found["index"]) < current:
            earlier += size
    return earlier + frame.offset
