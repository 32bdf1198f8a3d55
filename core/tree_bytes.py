"""Bytes held under a path in a folder, counted as the file API counts them (regular files' sizes, symlinks not
followed), reached from the folder's directory descriptor (:mod:`core.beneath`), never by a path a session could
swap meanwhile."""

from __future__ import annotations

import os
import stat

from core import beneath


def tree_bytes(dir_fd: int, parts: beneath.Parts = ()) -> int:
    """Bytes of the regular files at or under ``parts`` beneath the directory ``dir_fd``: a walk that follows no
    symlink (a link is not counted, nor what it points to) and stays on ``dir_fd``'s file system
    (:func:`core.beneath.walk`); what is missing, vanishes meanwhile or cannot be read counts 0. Blocking: run it
    in a thread from async code."""
    try:
        info = beneath.lstat(dir_fd, parts)
        if not stat.S_ISDIR(info.st_mode):
            return info.st_size if stat.S_ISREG(info.st_mode) else 0
        with beneath.held(beneath.open_dir(dir_fd, parts)) as top:
            return sum(found.st_size for _, _, found in beneath.walk(top) if stat.S_ISREG(found.st_mode))
    except OSError:
        return 0


def folder_bytes(path: str | os.PathLike[str]) -> int:
    """:func:`tree_bytes` of a whole folder, its directory at ``path`` (0 if it cannot be opened)."""
    try:
        root = beneath.open_root(path)
    except OSError:
        return 0
    with beneath.held(root):
        return tree_bytes(root)
