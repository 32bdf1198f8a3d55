"""Files of storage folders through the gateway: ``/folders/{id}/files`` (list, download, upload, mkdir, move,
delete), for the folder's owner and those it is shared with (writes need RW), with an API token (``Authorization:
Bearer``). Answers are JSON; errors are ``{"error": {"code", "message", "field"}}`` with 400/401/403/404/409/413.

Paths (``?path=``) are checked by ``domain.folder_paths`` (relative, no ``..``, no NUL, NFC); then every operation
works from a descriptor of the folder's directory and never resolves a path again (:mod:`core.beneath`): a symlink
anywhere on a path is refused (404; DELETE removes a symlink itself, never what it points to), and a session that
swaps a part of a path between a check and a use (it mounts the folder) gets nothing outside the folder. A download
is sent from the descriptor that was opened. Uploads stream to a hidden file in the target directory, each write's
bytes reserved first against the owner's and the project's bytes quotas (so concurrent uploads never pass them
together); past a quota (413 QUOTA_EXCEEDED) or on any failure the partial file is removed and its reservation given
back, and only a complete upload is renamed into place. ``PUT ...&offset=N`` appends to a file of exactly N bytes
instead: uploads in pieces, or resumed after a broken connection (409 CONFLICT names the size to resume at).
``POST .../files/link?path=`` makes a single-use download link valid a minute (``{"url", "expiresIn"}``): opened
without the token, it streams the file as an attachment, access checked again (:mod:`stores.file_links`); that is
how the web UI downloads, with no file held in the page and no token in a URL.
The gateway reaches the folder's directory where the storage node put it (the dev stack: the same machine; see
README "Storage folders" for other layouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any, cast

import anyio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from core import beneath
from core.errors import CaravanError, Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded, Unauthenticated
from core.settings import StorageSettings
from domain.folder_paths import RESERVED_PREFIX, folder_path
from domain.storage import Folder, FolderMode, FolderStatus, mode_for
from domain.users import User
from gateway.auth import authenticate, header_token
from stores.file_links import LINK_TTL, FileLinkStore
from stores.folders import FolderStore

PREFIX = "/folders/{folder_id}/files"
STATUS = {"INVALID_INPUT": 400, "UNAUTHENTICATED": 401, "FORBIDDEN": 403, "NOT_FOUND": 404, "QUOTA_EXCEEDED": 413}
CHUNK = 1 << 20
"""Bytes per write of an upload (reserved against the quotas before each: one ``os.writev`` into the page cache, on
the event loop, well under a millisecond) and per read of a download (Starlette's, through a thread)."""
RESERVE_AHEAD = 8 * CHUNK
"""Bytes an upload reserves beyond what it has written: a quota check (two Redis round trips) per 8 MiB,
not per MiB, where it cost a noticeable share of an upload's throughput (bench/README.md)."""
IOV_MAX = 1024
"""Buffers one ``os.writev`` takes (Linux's limit)."""


DOWNLOAD = "/folders/download/{secret}"
"""Where a download link (``POST .../files/link``, :mod:`stores.file_links`) is opened, with no token."""


def routes(state: dict[str, Any]) -> list[Route]:
    files = FolderFiles(state)
    return [
        Route(PREFIX, files.entries, methods=["GET", "PUT", "DELETE"]),
        Route(PREFIX + "/mkdir", files.mkdir, methods=["POST"]),
        Route(PREFIX + "/move", files.move, methods=["POST"]),
        Route(PREFIX + "/link", files.link, methods=["POST"]),
        Route(DOWNLOAD, files.download, methods=["GET"]),
    ]


def error_response(exc: CaravanError) -> JSONResponse:
    body = {"error": {"code": exc.code, "message": exc.message, "field": exc.field}}
    return JSONResponse(body, status_code=STATUS.get(exc.code, 409))


class FolderFiles:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    async def entries(self, request: Request) -> Response:
        """GET (and HEAD): a directory's entries (JSON) or a file's bytes; PUT: upload the body; DELETE: remove."""
        verbs = {"GET": self._get, "HEAD": self._get, "PUT": self._put, "DELETE": self._delete}
        return await answered(verbs[request.method], request)

    async def mkdir(self, request: Request) -> Response:
        return await answered(self._mkdir, request)

    async def move(self, request: Request) -> Response:
        return await answered(self._move, request)

    async def link(self, request: Request) -> Response:
        return await answered(self._link, request)

    async def download(self, request: Request) -> Response:
        return await answered(self._download, request)

    # -- the verbs: each works from the folder's directory descriptor (core.beneath), never a path again --

    async def _mkdir(self, request: Request) -> Response:
        folder, where = await self._folder_of(request, FolderMode.RW)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        with beneath.held(beneath.open_root(where)) as root:
            beneath.make_dirs(root, parts)
        return JSONResponse({"path": "/".join(parts), "type": "dir"}, status_code=201)

    async def _move(self, request: Request) -> Response:
        folder, where = await self._folder_of(request, FolderMode.RW)
        source = folder_path(request.query_params.get("from", ""), field="from", root_ok=False)
        parts = folder_path(request.query_params.get("to", ""), field="to", root_ok=False)
        if parts[: len(source)] == source:
            raise InvalidInput("a directory cannot move into itself", field="to")
        with (
            beneath.held(beneath.open_root(where)) as root,
            beneath.parent(root, source) as (source_at, source_name),
            beneath.parent(root, parts) as (target_at, target_name),
        ):
            os.stat(source_name, dir_fd=source_at, follow_symlinks=False)  # FileNotFoundError: 404
            if _entry(target_at, target_name) is not None:
                raise InvalidInput("something is there already", field="to")
            os.rename(source_name, target_name, src_dir_fd=source_at, dst_dir_fd=target_at)  # the entries themselves
        return JSONResponse({"path": "/".join(parts)})

    async def _get(self, request: Request) -> Response:
        folder, where = await self._folder_of(request, FolderMode.RO)
        parts = folder_path(request.query_params.get("path", ""))
        with beneath.held(beneath.open_root(where)) as root:
            try:
                fd = beneath.open_file(root, parts)
            except IsADirectoryError:
                return JSONResponse({"path": "/".join(parts), "entries": _listing(root, parts)})
        return DescriptorResponse(fd, parts[-1])  # HEAD, Range and If-Range too

    async def _link(self, request: Request) -> Response:
        """A single-use link that downloads one file without the token (:mod:`stores.file_links`)."""
        token, viewer = await self._viewer(request)
        folder, where = await self._folder(viewer, request.path_params["folder_id"], FolderMode.RO)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        with beneath.held(beneath.open_root(where)) as root:
            info = beneath.lstat(root, parts)
        if stat.S_ISLNK(info.st_mode):
            raise NotFound(LINK_THERE, field="path")
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput("only a file has a download link", field="path")
        secret = await self._links().new_link(token, folder.id, "/".join(parts))
        url = DOWNLOAD.replace("{secret}", secret)
        return JSONResponse({"url": url, "expiresIn": LINK_TTL}, status_code=201)

    async def _download(self, request: Request) -> Response:
        """The file a link names, once, as an attachment; access checked again as the link's token now stands."""
        link = await self._links().take(request.path_params["secret"])
        found = await self.state["users"].authenticate_hash(link.token_hash) if link is not None else None
        if link is None or found is None:
            raise NotFound("this download link was used, has expired, or its token was revoked", field="link")
        _, where = await self._folder(found.user, link.folder_id, FolderMode.RO)
        parts = folder_path(link.path, root_ok=False)
        try:
            with beneath.held(beneath.open_root(where)) as root:
                fd = beneath.open_file(root, parts)
        except (IsADirectoryError, beneath.NotAFile) as exc:
            raise NotFound("no such file in the folder any more", field="path") from exc
        return DescriptorResponse(fd, parts[-1])

    async def _put(self, request: Request) -> Response:
        folder, where = await self._folder_of(request, FolderMode.RW)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        with contextlib.ExitStack() as held:
            root = held.enter_context(beneath.held(beneath.open_root(where)))
            try:
                at, name = held.enter_context(beneath.parent(root, parts))
            except FileNotFoundError as exc:
                raise NotFound("no such directory in the folder (make it first: mkdir)", field="path") from exc
            there = _entry(at, name)
            if there is not None and stat.S_ISDIR(there.st_mode):
                raise InvalidInput("a directory is there", field="path")
            if there is not None and stat.S_ISLNK(there.st_mode):
                raise NotFound(LINK_THERE, field="path")
            if "offset" in request.query_params:
                return await self._resume(request, folder, parts, at, name)
            replaced = there.st_size if there is not None and stat.S_ISREG(there.st_mode) else 0
            upload = self._upload(request, folder, credit=replaced)
            partial = f"{RESERVED_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(
                    partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=at
                )
                with beneath.held(fd):
                    written = await _receive(request, fd, upload)
                await upload.settle(written)
                now = _entry(at, name)  # what the rename replaces (a concurrent upload's file, perhaps)
                os.rename(partial, name, src_dir_fd=at, dst_dir_fd=at)
            except BaseException:
                await upload.settle(0)
                raise
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial, dir_fd=at)
        await self._store().add_usage(folder.id, -(now.st_size if now is not None and stat.S_ISREG(now.st_mode) else 0))
        return JSONResponse({"path": "/".join(parts), "size": written}, status_code=201)

    async def _resume(self, request: Request, folder: Folder, parts: tuple[str, ...], at: int, name: str) -> Response:
        """``PUT ?path=&offset=N``: append the body to a file that has exactly N bytes (0: a new file), for uploads
        in pieces or resumed after a broken connection (what arrived stays: list the directory for the size to
        resume at). Past a quota, the file is cut back to N bytes."""
        raw = request.query_params["offset"]
        if not raw.isdigit():
            raise InvalidInput("offset is the file's current size in bytes", field="offset")
        offset = int(raw)
        try:
            fd = beneath.open_file(at, (name,), os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            if offset != 0:
                raise Conflict("the file has 0 bytes: resume at offset 0", field="offset", size=0) from None
            fd = os.open(
                name,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=at,
            )
        with beneath.held(fd):
            size = os.fstat(fd).st_size
            if offset != size:
                raise Conflict(f"the file has {size} bytes: resume at offset {size}", field="offset", size=size)
            upload = self._upload(request, folder, credit=0)
            try:
                written = await _receive(request, fd, upload)
            except QuotaExceeded:
                os.ftruncate(fd, offset)
                await upload.settle(0)
                raise
            except BaseException:  # what arrived is kept, to resume from
                await upload.settle(os.fstat(fd).st_size - offset)
                raise
            await upload.settle(written)
        return JSONResponse({"path": "/".join(parts), "size": offset + written}, status_code=200)

    async def _delete(self, request: Request) -> Response:
        """A file, a symlink (itself, never what it points to), or a directory and all it holds (no link followed)."""
        folder, where = await self._folder_of(request, FolderMode.RW)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        with beneath.held(beneath.open_root(where)) as root, beneath.parent(root, parts) as (at, name):
            info = os.stat(name, dir_fd=at, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                freed = await asyncio.to_thread(beneath.remove_tree, at, name)
            else:
                os.unlink(name, dir_fd=at)
                freed = info.st_size if stat.S_ISREG(info.st_mode) else 0
        await self._store().add_usage(folder.id, -freed)
        return JSONResponse({"deleted": True, "freed": freed})

    # -- who, which folder, where --

    def _upload(self, request: Request, folder: Folder, *, credit: int) -> Upload:
        length = request.headers.get("content-length", "")
        declared = int(length) if length.isdigit() else None
        return Upload(self._store(), folder, self.state["settings"].storage, credit=credit, declared=declared)

    def _store(self) -> FolderStore:
        sessions = self.state["sessions"]
        return FolderStore(sessions.redis, sessions.keys)

    def _links(self) -> FileLinkStore:
        sessions = self.state["sessions"]
        return FileLinkStore(sessions.redis, sessions.keys)

    async def _viewer(self, request: Request) -> tuple[str, User]:
        """The request's API token and its user."""
        token = header_token(request.headers)
        found = await authenticate(self.state["users"], token)
        if found is None:
            raise Unauthenticated("send a valid API token as 'Authorization: Bearer <token>'")
        user: User = found.user
        return token, user

    async def _folder_of(self, request: Request, need: FolderMode) -> tuple[Folder, Path]:
        """The request's folder (``{folder_id}``) as its token's user may use it."""
        _, viewer = await self._viewer(request)
        return await self._folder(viewer, request.path_params["folder_id"], need)

    async def _folder(self, viewer: User, folder_id: str, need: FolderMode) -> tuple[Folder, Path]:
        folder = await self._store().get(folder_id)
        mode = mode_for(viewer, folder) if folder is not None else None
        if folder is None or mode is None:
            raise NotFound(f"no folder {folder_id[:80]}", field="folder")
        if folder.status is not FolderStatus.READY or folder.host_path is None:
            raise InvalidInput(f"folder {folder.name} is {folder.status.value}, not READY", field="folder")
        if not mode.allows(need):
            raise Forbidden(f"folder {folder.name} is shared with you read-only", field="folder")
        return folder, await asyncio.to_thread(Path(folder.host_path).resolve)  # resolving reads the disk


async def _receive(request: Request, fd: int, upload: Upload) -> int:
    """Write the request's body to the file ``fd`` about a CHUNK at a time, each write's bytes reserved first
    against the quotas (:meth:`Upload.cover`); the bytes written."""
    await upload.begin()
    pending: list[bytes] = []
    written = buffered = 0
    async for chunk in request.stream():
        pending.append(chunk)
        buffered += len(chunk)
        if buffered >= CHUNK:
            await upload.cover(written + buffered)
            written = _flush(fd, pending, written, buffered)
            buffered = 0
    if buffered:
        await upload.cover(written + buffered)
    return _flush(fd, pending, written, buffered)


def _flush(fd: int, pending: list[bytes], written: int, buffered: int) -> int:
    """Write the buffered chunks in one ``os.writev`` (no joined copy); the new total."""
    views = [memoryview(chunk) for chunk in pending]
    while views:  # a regular file takes it whole; a short write (full disk, a signal) goes on where it stopped
        done = os.writev(fd, views[:IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if views:
            views[0] = views[0][done:]
    pending.clear()
    return written + buffered


class Upload:
    """The bytes one upload has counted in its folder's usage: reserved before they are written (so that
    concurrent uploads never pass a quota together, :meth:`stores.folders.FolderStore.reserve`), up to
    :data:`RESERVE_AHEAD` beyond them (one Redis check per that many bytes, not per write); settled to what it
    kept. Near a quota, a body of unknown length reserves exactly what it writes; one of declared length that
    cannot fit is refused before a byte of it is read."""

    def __init__(
        self, store: FolderStore, folder: Folder, quota: StorageSettings, *, credit: int, declared: int | None
    ) -> None:
        self.store = store
        self.folder = folder
        self.quota = quota
        self.credit = credit
        """Bytes of the file the upload replaces (they go when it lands)."""
        self.declared = declared
        """The body's ``Content-Length``, if sent (uvicorn holds the client to it)."""
        self.reserved = 0

    async def begin(self) -> None:
        """Before the body is read: the first bytes of a declared length reserved, so that a body that cannot fit
        is refused before it is sent (a client that waits for ``100 Continue``, as curl does, sends nothing)."""
        if self.declared:
            await self._reserve(min(self.declared, RESERVE_AHEAD))

    async def cover(self, total: int) -> None:
        """Reserve so that ``total`` bytes written are counted (QUOTA_EXCEEDED if they cannot be)."""
        if total <= self.reserved:
            return
        declared = self.declared if self.declared is not None and self.declared >= total else None
        ahead = total + RESERVE_AHEAD if declared is None else min(declared, total + RESERVE_AHEAD)
        try:
            await self._reserve(ahead)
        except QuotaExceeded:
            if declared is not None or ahead == total:  # a declared body that cannot fit; or exactly this
                raise
            await self._reserve(total)

    async def _reserve(self, upto: int) -> None:
        await self.store.reserve(self.folder, upto - self.reserved, credit=self.credit, quota=self.quota)
        self.reserved = upto

    async def settle(self, kept: int) -> None:
        """The upload ended with ``kept`` of its bytes on disk (0: none, its file removed): its usage says so."""
        if kept != self.reserved:
            await self.store.add_usage(self.folder.id, kept - self.reserved)
        self.reserved = kept


class DescriptorResponse(FileResponse):
    """Starlette's FileResponse (HEAD, Range, If-Range, ETag, Content-Disposition: attachment) over a file already
    opened beneath the folder (:func:`core.beneath.open_file`), never a path: what was opened is what is sent,
    whatever the path names meanwhile. It owns ``fd`` and closes it once the answer is sent or has failed. (Its
    ``path``, which Starlette would open were :meth:`_open_file` no longer its hook, names that same open file.)"""

    chunk_size = CHUNK  # Starlette's 64 KiB chunks each cost a thread hop: 16x fewer

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        info = os.fstat(fd)
        self.size = info.st_size  # what Content-Length announces: no more is ever sent
        super().__init__(f"/proc/self/fd/{fd}", filename=name, stat_result=info)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
        try:
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            os.close(self.fd)

    @contextlib.asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        yield anyio.wrap_file(cast(IO[bytes], SizedReader(self.fd, self.size)))


class SizedReader:
    """The file ``fd`` read with ``pread`` up to the ``size`` its Content-Length announced, never beyond: a session
    that appends to the file while it is sent does not make the answer longer than it said (which breaks the
    connection); one that cuts it short ends the body early."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size, self.position = fd, size, 0

    def read(self, count: int = -1) -> bytes:
        left = self.size - self.position
        data = os.pread(self.fd, left if count < 0 else min(count, left), self.position) if left > 0 else b""
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = offset if whence == os.SEEK_SET else self.position + offset
        return self.position

    def close(self) -> None:
        """The descriptor is the response's to close."""


LINK_THERE = "a symbolic link is there (the file API follows none)"


def _entry(at: int, name: str) -> os.stat_result | None:
    """What ``name`` in the directory ``at`` is (a symlink itself), or None."""
    try:
        return os.stat(name, dir_fd=at, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _listing(root: int, parts: tuple[str, ...]) -> list[dict[str, Any]]:
    """The entries of the directory ``parts`` (uploads in progress left out), each as ``lstat`` has it."""
    listed = []
    with beneath.held(beneath.open_dir(root, parts)) as at, os.scandir(at) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(RESERVED_PREFIX):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode) else "file"
            listed.append({"name": entry.name, "type": kind, "size": info.st_size, "modified": info.st_mtime})
    return listed


async def answered(verb: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
    """``verb``'s answer; an expected failure (or the file system's refusal) as a JSON error, never a 500."""
    try:
        return await verb(request)
    except CaravanError as exc:
        return error_response(exc)
    except FileNotFoundError:
        return error_response(NotFound("no such file or directory in the folder", field="path"))
    except (FileExistsError, NotADirectoryError, IsADirectoryError, beneath.NotAFile) as exc:
        return error_response(InvalidInput(f"a file or directory is in the way: {exc.strerror}", field="path"))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):  # a symlink on the way, or a mount: never followed
            return error_response(NotFound(f"no such file or directory in the folder; {LINK_THERE}", field="path"))
        return error_response(Conflict(f"the storage refused: {exc.strerror}", field="path"))
