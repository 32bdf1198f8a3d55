"""Bytes held under a path, counted as the file API counts them (regular files' sizes, symlinks not followed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def tree_bytes(path: Path | str) -> int:
    """Bytes of the regular files at or under ``path``: an ``os.scandir`` walk that follows no symlink (a link is
    not counted, nor what it points to) and stays on ``path``'s file system; entries that vanish meanwhile, or that
    cannot be read, count 0. Blocking: run it in a thread from async code."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    if not stat.S_ISDIR(info.st_mode):
        return 0
    total, stack = 0, [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                        elif entry.is_dir(follow_symlinks=False) and entry.stat().st_dev == info.st_dev:
                            stack.append(entry.path)  # a directory on the same file system (no other mount)
                    except OSError:
                        continue
        except OSError:
            continue
    return total
