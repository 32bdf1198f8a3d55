"""Paths inside a storage folder, as the file API takes them (pure): relative, NFC-normalised, no NUL, no ``.`` or
``..`` part, bounded. What the file system adds (a symlink, swapped in at any moment) is handled where the files are
(``core.beneath``, ``gateway.files``): parts are opened one beneath the other from the folder's directory descriptor,
and no symlink on a path is followed."""

from __future__ import annotations

import unicodedata

from core.errors import InvalidInput

MAX_PATH = 1024
"""Characters of a path in a folder."""
MAX_PART = 255
"""Bytes of one name (the file systems' limit)."""
RESERVED_PREFIX = ".caravan-upload-"
"""Names of uploads in progress (hidden, removed if the upload fails): users may not name files so."""


def folder_path(raw: str, *, field: str = "path", root_ok: bool = True) -> tuple[str, ...]:
    """The parts of ``raw`` (``""`` or ``"/"``: the folder itself, when ``root_ok``). INVALID_INPUT, naming
    ``field``, for what could leave the folder or is not a name."""
    if "\x00" in raw:
        raise InvalidInput("a path may not contain NUL", field=field)
    if len(raw) > MAX_PATH:
        raise InvalidInput(f"a path is at most {MAX_PATH} characters", field=field)
    if raw.startswith("/") and raw.strip("/"):
        raise InvalidInput("a path in a folder is relative to it (no leading '/')", field=field)
    text = unicodedata.normalize("NFC", raw).strip("/")
    parts = tuple(text.split("/")) if text else ()
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidInput("a path may not have empty, '.' or '..' parts", field=field)
        if len(part.encode()) > MAX_PART or part.startswith(RESERVED_PREFIX):
            raise InvalidInput(f"{part[:40]!r} is not a name a folder may hold", field=field)
        if any(ord(c) < 32 for c in part):
            raise InvalidInput("a path may not contain control characters", field=field)
    if not parts and not root_ok:
        raise InvalidInput("give a path to a file or directory in the folder, not the folder itself", field=field)
    return parts
