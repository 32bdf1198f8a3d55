"""A hostile session's loop, run as a process of its own beside the gateway: in a folder's directory, ``f`` keeps
turning from a decoy file into a symlink to a secret file outside the folder and back, and ``d`` from a real directory
(holding a decoy ``x``) into a symlink to a directory outside and back, each turn one atomic ``renameat2(...,
RENAME_EXCHANGE)`` with a spare entry (``.swap-f``, ``.swap-d``). What the file API did to either meanwhile (replaced,
moved, deleted) is put back before the next turn. It runs until it is killed.

    python tests/e2e/path_swapper.py <folder dir> <outside secret file> <outside dir>
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import sys
from collections.abc import Callable

RENAME_EXCHANGE = 2
SYS_RENAMEAT2 = 316  # x86_64
AT_FDCWD = -100
DECOY = b"decoy: not the secret, and not as long as it either\n"
DECOY_X = b"a decoy x inside the folder\n"

_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: str, b: str) -> None:
    if _libc.syscall(SYS_RENAMEAT2, AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), a)


def kind(path: str) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file"


def remove(path: str) -> None:
    if kind(path) == "dir":
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def make_decoy_file(path: str) -> None:
    with open(path, "wb") as f:
        f.write(DECOY)


def make_decoy_dir(path: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    if not os.path.lexists(os.path.join(path, "x")):
        with open(os.path.join(path, "x"), "wb") as f:
            f.write(DECOY_X)


def keep_pair(name: str, spare: str, real: str, make_real: Callable[[str], None], link_to: str) -> None:
    """One of ``name`` and ``spare`` a link to ``link_to``, the other a real ``real`` ("file"/"dir"); then swap."""
    links = [p for p in (name, spare) if kind(p) == "link"]
    if len(links) != 1:
        remove(spare)
        os.symlink(link_to, spare)
        links = [spare]
    other = name if links[0] == spare else spare
    if kind(other) != real:
        remove(other)
    if real == "dir" or kind(other) is None:  # a directory gets its decoy x back
        make_real(other)
    exchange(name, spare)


def main(folder: str, secret: str, outside_dir: str) -> None:
    os.chdir(folder)
    while True:
        for name, spare, real, make_real, link_to in (
            ("f", ".swap-f", "file", make_decoy_file, secret),
            ("d", ".swap-d", "dir", make_decoy_dir, outside_dir),
        ):
            with contextlib.suppress(OSError):  # the file API got in between: put right next turn
                keep_pair(name, spare, real, make_real, link_to)


if __name__ == "__main__":
    main(*sys.argv[1:4])
