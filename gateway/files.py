"""Files of storage folders through the gateway: ``/folders/{id}/files`` (list, download, upload, mkdir, move,
delete), for the folder's owner and those it is shared with (writes need RW), with an API token (``Authorization:
Bearer``). Answers are JSON; errors are ``{"error": {"code", "message", "field"}}`` with 400/401/403/404/409/413.

Paths (``?path=``) are checked by ``domain.folder_paths`` (relative, no ``..``, no NUL, NFC); then, on disk, a path
is used only if its real location (symlinks followed) is inside the folder's real directory, so a symlink pointing
out is refused (404). Uploads stream to a hidden file in the target directory, counted against the owner's and the
project's bytes quotas as they arrive; past a quota (413 QUOTA_EXCEEDED) or on any failure the partial file is
removed, and only a complete upload is renamed into place. ``PUT ...&offset=N`` appends to a file of exactly N bytes
instead: uploads in pieces, or resumed after a broken connection (409 CONFLICT names the size to resume at).
``POST .../files/link?path=`` makes a single-use download link valid a minute (``{"url", "expiresIn"}``): opened
without the token, it streams the file as an attachment, access checked again (:mod:`stores.file_links`); that is
how the web UI downloads, with no file held in the page and no token in a URL.
The gateway reaches the folder's directory where the storage node put it (the dev stack: the same machine; see
README "Storage folders" for other layouts).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from core.errors import CaravanError, Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded, Unauthenticated
from core.tree_bytes import tree_bytes
from domain.folder_paths import RESERVED_PREFIX, folder_path
from domain.storage import Folder, FolderMode, FolderStatus, check_bytes_quota, mode_for
from domain.users import User
from gateway.auth import authenticate, header_token
from stores.file_links import LINK_TTL, FileLinkStore
from stores.folders import FolderStore

PREFIX = "/folders/{folder_id}/files"
STATUS = {"INVALID_INPUT": 400, "UNAUTHENTICATED": 401, "FORBIDDEN": 403, "NOT_FOUND": 404, "QUOTA_EXCEEDED": 413}
CHUNK = 1 << 20
"""Bytes per write of an upload (the quota checked at each: one ``os.writev`` into the page cache, on the event
loop, well under a millisecond) and per read of a download (Starlette's, through a thread)."""
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
        """GET: a directory's entries (JSON) or a file's bytes; PUT: upload the body; DELETE: remove."""
        verbs = {"GET": self._get, "PUT": self._put, "DELETE": self._delete}
        return await answered(verbs[request.method], request)

    async def mkdir(self, request: Request) -> Response:
        return await answered(self._mkdir, request)

    async def move(self, request: Request) -> Response:
        return await answered(self._move, request)

    async def link(self, request: Request) -> Response:
        return await answered(self._link, request)

    async def download(self, request: Request) -> Response:
        return await answered(self._download, request)

    # -- the verbs --

    async def _mkdir(self, request: Request) -> Response:
        folder, root = await self._folder_of(request, FolderMode.RW)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        inside(root, parts, must_exist=False).mkdir(parents=True, exist_ok=True)
        return JSONResponse({"path": "/".join(parts), "type": "dir"}, status_code=201)

    async def _move(self, request: Request) -> Response:
        folder, root = await self._folder_of(request, FolderMode.RW)
        source = inside(root, folder_path(request.query_params.get("from", ""), field="from", root_ok=False))
        parts = folder_path(request.query_params.get("to", ""), field="to", root_ok=False)
        target = inside(root, parts, must_exist=False)
        if target.exists():
            raise InvalidInput("something is there already", field="to")
        if target.is_relative_to(source):
            raise InvalidInput("a directory cannot move into itself", field="to")
        source.rename(target)
        return JSONResponse({"path": "/".join(parts)})

    async def _get(self, request: Request) -> Response:
        folder, root = await self._folder_of(request, FolderMode.RO)
        parts = folder_path(request.query_params.get("path", ""))
        target = inside(root, parts)
        if target.is_dir():
            listed = []
            for entry in sorted(target.iterdir(), key=lambda p: p.name):
                if entry.name.startswith(RESERVED_PREFIX):
                    continue
                info = entry.lstat()
                kind = "dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode) else "file"
                listed.append({"name": entry.name, "type": kind, "size": info.st_size, "modified": info.st_mtime})
            return JSONResponse({"path": "/".join(parts), "entries": listed})
        response = FileResponse(target, filename=target.name)  # HEAD, Range and If-Range too
        response.chunk_size = CHUNK  # Starlette's 64 KiB chunks each cost a thread hop: 16x fewer
        return response

    async def _link(self, request: Request) -> Response:
        """A single-use link that downloads one file without the token (:mod:`stores.file_links`)."""
        token, viewer = await self._viewer(request)
        folder, root = await self._folder(viewer, request.path_params["folder_id"], FolderMode.RO)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        if not inside(root, parts).is_file():
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
        _, root = await self._folder(found.user, link.folder_id, FolderMode.RO)
        target = inside(root, folder_path(link.path, root_ok=False))
        if not target.is_file():
            raise NotFound("no such file in the folder any more", field="path")
        response = FileResponse(target, filename=target.name, content_disposition_type="attachment")
        response.chunk_size = CHUNK
        return response

    async def _put(self, request: Request) -> Response:
        folder, root = await self._folder_of(request, FolderMode.RW)
        parts = folder_path(request.query_params.get("path", ""), root_ok=False)
        target = inside(root, parts, must_exist=False)
        if target.is_dir():
            raise InvalidInput("a directory is there", field="path")
        if not target.parent.is_dir():
            raise NotFound("no such directory in the folder (make it first: mkdir)", field="path")
        store = self._store()
        quota = self.state["settings"].storage
        user_bytes, project_bytes = await store.bytes_of(folder.owner_id, folder.project)
        replaced = target.stat().st_size if target.is_file() else 0
        partial = target.parent / f"{RESERVED_PREFIX}{uuid.uuid4().hex}"
        written = 0
        if "offset" in request.query_params:
            replaced = 0  # a resumed upload adds to the file

        def within(total: int) -> None:
            check_bytes_quota(
                user_bytes=user_bytes - replaced, project_bytes=project_bytes - replaced, adding=total, quota=quota
            )

        if "offset" in request.query_params:
            return await self._resume(request, folder.id, parts, target, within)
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                written = await _receive(request, fd, within)
            finally:
                os.close(fd)
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        await store.add_usage(folder.id, written - replaced)
        return JSONResponse({"path": "/".join(parts), "size": written}, status_code=201)

    async def _resume(
        self, request: Request, folder_id: str, parts: tuple[str, ...], target: Path, within: Callable[[int], None]
    ) -> Response:
        """``PUT ?path=&offset=N``: append the body to a file that has exactly N bytes (0: a new file), for uploads
        in pieces or resumed after a broken connection (what arrived stays: list the directory for the size to
        resume at). Past a quota, the file is cut back to N bytes."""
        raw = request.query_params["offset"]
        if not raw.isdigit():
            raise InvalidInput("offset is the file's current size in bytes", field="offset")
        offset, size = int(raw), target.stat().st_size if target.is_file() else 0
        if offset != size:
            raise Conflict(f"the file has {size} bytes: resume at offset {size}", field="offset", size=size)
        written = 0
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                written = await _receive(request, fd, within)
            finally:
                os.close(fd)
        except QuotaExceeded:
            os.truncate(target, offset)
            raise
        except ClientDisconnect:  # what arrived is kept, to resume from
            written = target.stat().st_size - offset
            await self._store().add_usage(folder_id, written)
            raise
        await self._store().add_usage(folder_id, written)
        return JSONResponse({"path": "/".join(parts), "size": offset + written}, status_code=200)

    async def _delete(self, request: Request) -> Response:
        folder, root = await self._folder_of(request, FolderMode.RW)
        target = inside(root, folder_path(request.query_params.get("path", ""), root_ok=False))
        freed = tree_bytes(target)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        await self._store().add_usage(folder.id, -freed)
        return JSONResponse({"deleted": True, "freed": freed})

    # -- who, which folder, where --

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
        return folder, Path(folder.host_path).resolve()


async def _receive(request: Request, fd: int, within: Callable[[int], None]) -> int:
    """Write the request's body to the file ``fd`` about a CHUNK at a time, the quota checked before each write;
    the bytes written."""
    pending: list[bytes] = []
    written = buffered = 0
    async for chunk in request.stream():
        pending.append(chunk)
        buffered += len(chunk)
        if buffered >= CHUNK:
            written = _flush(fd, pending, written, buffered, within)
            buffered = 0
    return _flush(fd, pending, written, buffered, within)


def _flush(fd: int, pending: list[bytes], written: int, buffered: int, within: Callable[[int], None]) -> int:
    """Write the buffered chunks if the quota allows them (else QUOTA_EXCEEDED, nothing written), in one
    ``os.writev`` (no joined copy); the new total."""
    within(written + buffered)
    views = [memoryview(chunk) for chunk in pending]
    while views:  # a regular file takes it whole; a short write (full disk, a signal) goes on where it stopped
        done = os.writev(fd, views[:IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if views:
            views[0] = views[0][done:]
    pending.clear()
    return written + buffered


async def answered(verb: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
    """``verb``'s answer; an expected failure (or the file system's refusal) as a JSON error, never a 500."""
    try:
        return await verb(request)
    except CaravanError as exc:
        return error_response(exc)
    except FileNotFoundError:
        return error_response(NotFound("no such file or directory in the folder", field="path"))
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        return error_response(InvalidInput(f"a file or directory is in the way: {exc.strerror}", field="path"))
    except OSError as exc:
        return error_response(Conflict(f"the storage refused: {exc.strerror}", field="path"))


def inside(root: Path, parts: tuple[str, ...], *, must_exist: bool = True) -> Path:
    """``root/parts`` if its real location (symlinks followed) is inside ``root``; NOT_FOUND otherwise, or when it
    does not exist and ``must_exist`` (a new path: its parent's real location must be inside)."""
    path = root.joinpath(*parts)
    real = path.resolve()
    if not real.is_relative_to(root):
        raise NotFound("no such file or directory in the folder", field="path")
    if must_exist and not (path.exists() or path.is_symlink()):
        raise NotFound("no such file or directory in the folder", field="path")
    if not must_exist and path.is_symlink():
        raise NotFound("a symbolic link is there", field="path")
    if parts and not path.parent.resolve().is_relative_to(root):
        raise NotFound("no such directory in the folder", field="path")
    return path
