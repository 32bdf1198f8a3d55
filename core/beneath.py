"""Files beneath a directory descriptor, never reached by a path again: how the file API and the usage recount touch
what is inside a storage folder while a session that mounts it may swap any part of a path for a symlink at any
moment (between a check and a use, a path names something else; a descriptor does not).

A folder's directory is opened once (:func:`open_root`); everything in it is then reached from that descriptor with
``openat2(2)`` and ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`` (Linux 5.6+):
the kernel resolves the relative path in one call and refuses a symlink anywhere on it (``ELOOP``), a mount crossed
or a way out (``EXDEV``). Where openat2 is missing (an older kernel; a seccomp filter answering ENOSYS or EPERM) the
same is done a component at a time with ``O_NOFOLLOW | O_DIRECTORY`` and a device check. Then only ``*at`` calls
on descriptors already opened, which never follow a symlink in their last component (``unlinkat``, ``renameat``,
``mkdirat``, ``fstatat`` with ``AT_SYMLINK_NOFOLLOW``, ``O_CREAT | O_EXCL``). A file to be read or written is first
opened ``O_PATH`` (no open of a device or a FIFO a session made) and checked regular, then reopened through
``/proc/self/fd``, which names that very file. Parts are names (no ``/``, ``.``, ``..``, empty), as
:mod:`domain.folder_paths` checks them; anything else is refused here too (``EXDEV``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator, Sequence

SYS_OPENAT2 = 437
"""openat2's number: the same on every architecture Linux added it to at once (x86_64, arm64, ...)."""
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
MAX_DEPTH = 1000
"""Directory levels :func:`walk` descends (one descriptor open per level); deeper ones are not entered."""

Parts = Sequence[str]


class NotAFile(OSError):
    """The path names something that is neither a regular file nor a directory (a FIFO, a device, a socket)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: bool | None = None
"""Whether this kernel (and any seccomp filter around it) takes openat2: found on first use."""


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE) -> int:
    """The raw system call (OSError with its errno)."""
    creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
    how = _OpenHow(flags | os.O_CLOEXEC, mode if creates else 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def openat2_supported() -> bool:
    global _openat2_works
    if _openat2_works is None:
        try:
            os.close(openat2(AT_FDCWD, "/", os.O_PATH, resolve=0))
            _openat2_works = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            _openat2_works = False
    return _openat2_works


def open_root(path: str | os.PathLike[str]) -> int:
    """A folder's directory, opened (its last component not a symlink): the descriptor everything else is reached
    from. The path itself is the platform's (Nomad's volume), not a user's."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_at(dir_fd: int, parts: Parts, flags: int, mode: int = 0o644) -> int:
    """``parts`` beneath the directory ``dir_fd`` opened with ``flags`` (``O_CLOEXEC`` added; no parts: ``dir_fd``'s
    directory again). ELOOP for a symlink anywhere on the way or at the end, EXDEV for a mount crossed or a part
    that is not a name; what ``open`` raises otherwise."""
    _names(parts)
    if openat2_supported():
        return openat2(dir_fd, "/".join(parts) or ".", flags, mode)
    return _open_walking(dir_fd, parts, flags, mode)


def _names(parts: Parts) -> None:
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise OSError(errno.EXDEV, "not a name in the directory", part)


def _open_walking(dir_fd: int, parts: Parts, flags: int, mode: int) -> int:
    """:func:`open_at` without openat2: one ``O_NOFOLLOW`` component at a time, each on ``dir_fd``'s device."""
    device = os.fstat(dir_fd).st_dev
    here = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            step = _step(here, part, os.O_RDONLY | os.O_DIRECTORY, 0)
            os.close(here)
            here = step
            _same_device(here, device)
        last = parts[-1] if parts else "."
        fd = _step(here, last, flags, mode)
    finally:
        os.close(here)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH | O_NOFOLLOW opens a link itself: refused as openat2 would
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), last)
        _same_device(fd, device)
    except OSError:
        os.close(fd)
        raise
    return fd


def _step(here: int, part: str, flags: int, mode: int) -> int:
    """``part`` in ``here``, not followed if a link (ELOOP then, as openat2 says it; O_DIRECTORY says ENOTDIR)."""
    try:
        return os.open(part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=here)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(part, dir_fd=here, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part) from exc
        raise


def _same_device(fd: int, device: int) -> None:
    if os.fstat(fd).st_dev != device:
        raise OSError(errno.EXDEV, "another file system is mounted there")


def open_dir(dir_fd: int, parts: Parts) -> int:
    """The directory ``parts`` beneath ``dir_fd``, opened for listing and as the ``dir_fd`` of ``*at`` calls."""
    return open_at(dir_fd, parts, os.O_RDONLY | os.O_DIRECTORY)


def open_file(dir_fd: int, parts: Parts, flags: int = os.O_RDONLY) -> int:
    """The regular file ``parts`` beneath ``dir_fd`` opened with ``flags`` (no ``O_CREAT``): first ``O_PATH`` and
    checked (IsADirectoryError, :class:`NotAFile` otherwise; no device or FIFO is ever opened), then reopened
    through ``/proc/self/fd``, which is that same file whatever happened to its path meanwhile."""
    found = open_at(dir_fd, parts, os.O_PATH)
    try:
        info = os.fstat(found)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/".join(parts))
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(errno.EINVAL, "not a regular file", "/".join(parts))
        fd = os.open(f"/proc/self/fd/{found}", (flags & ~os.O_CREAT) | os.O_CLOEXEC)
    finally:
        os.close(found)
    return fd


def lstat(dir_fd: int, parts: Parts) -> os.stat_result:
    """What ``parts`` beneath ``dir_fd`` is, a symlink at the end not followed (one on the way: ELOOP)."""
    if not parts:
        return os.fstat(dir_fd)
    with parent(dir_fd, parts) as (at, name):
        return os.stat(name, dir_fd=at, follow_symlinks=False)


@contextlib.contextmanager
def held(fd: int) -> Iterator[int]:
    """``fd``, closed after."""
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def parent(dir_fd: int, parts: Parts) -> Iterator[tuple[int, str]]:
    """The directory holding ``parts`` (opened beneath ``dir_fd``) and the last part's name: what ``*at`` calls take
    to act on the entry itself (never following it)."""
    if not parts:
        raise OSError(errno.EINVAL, "the directory itself has no parent here")
    _names(parts)
    with held(open_dir(dir_fd, parts[:-1])) as at:
        yield at, parts[-1]


def make_dirs(dir_fd: int, parts: Parts) -> None:
    """``mkdir -p parts`` beneath ``dir_fd``: each level made if missing, then entered as a directory (a symlink
    there: ELOOP)."""
    _names(parts)
    here = os.dup(dir_fd)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=here)
            step = open_dir(here, (part,))
            os.close(here)
            here = step
    finally:
        os.close(here)


def walk(dir_fd: int) -> Iterator[tuple[int, str, os.stat_result]]:
    """Every entry beneath the directory ``dir_fd`` (not itself), depth first, a directory after what it holds:
    (the descriptor of the directory holding it, valid while the entry is handled; its name; its ``lstat``). No
    symlink is followed and no mount crossed: a directory that cannot be entered so (it became a link, another
    file system is mounted there, it vanished) or lies :data:`MAX_DEPTH` levels down is given but not entered; an
    entry that vanished is skipped. Raises only if ``dir_fd`` itself cannot be listed."""
    levels: list[tuple[int, Iterator[str], tuple[int, str, os.stat_result] | None]] = []
    levels.append((os.dup(dir_fd), iter(os.listdir(dir_fd)), None))
    try:
        while levels:
            at, names, entered_as = levels[-1]
            for name in names:
                try:
                    info = os.stat(name, dir_fd=at, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode) and len(levels) < MAX_DEPTH:
                    try:
                        inner = open_dir(at, (name,))
                    except OSError:
                        yield at, name, info
                        continue
                    try:
                        listed = os.listdir(inner)
                    except OSError:
                        os.close(inner)
                        yield at, name, info
                        continue
                    levels.append((inner, iter(listed), (at, name, os.fstat(inner))))
                    break
                yield at, name, info
            else:
                levels.pop()
                os.close(at)
                if entered_as is not None:
                    yield entered_as
    finally:
        for at, _, _ in levels:
            os.close(at)


def remove_tree(dir_fd: int, name: str) -> int:
    """Remove the directory ``name`` in ``dir_fd`` and all it holds (:func:`walk`: no symlink followed, a symlink
    removed itself); the bytes of the regular files removed. An entry gone meanwhile is no error; what a session
    adds meanwhile may leave the directory not empty (ENOTEMPTY)."""
    freed = 0
    with held(open_dir(dir_fd, (name,))) as top:
        for at, entry, info in walk(top):
            try:
                if stat.S_ISDIR(info.st_mode):
                    os.rmdir(entry, dir_fd=at)
                else:
                    os.unlink(entry, dir_fd=at)
                    freed += info.st_size if stat.S_ISREG(info.st_mode) else 0
            except FileNotFoundError:
                continue
    os.rmdir(name, dir_fd=dir_fd)
    return freed
