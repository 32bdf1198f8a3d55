"""The file API against a session that swaps a path component between the gateway's check and its use (issue 23):
a process of its own (``path_swapper.py``, as a session mounting the folder or an SFTP session would) keeps turning
``f`` into a symlink to a root-only file outside every folder and back, and ``d`` into a symlink to a directory
outside and back, while every operation of the file API (list, download, HEAD, Range, download links, upload,
uploads in pieces, mkdir, move, delete) and the usage recount run against them, a bounded number of times each.
Nothing outside may ever be read, created, changed or deleted, nor counted."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from core.settings import Settings, StorageSettings
from scheduler.folder_usage import UsageRecounter
from stores.folders import FolderStore
from tests.e2e.test_folder_files import Files, folder_for
from tests.harness import Caravan, running_caravan

ROUNDS = 150
"""Times each operation is tried while the paths swap (the first leaks showed within 20)."""
SECRET = b"TOPSECRET root-only bytes outside every folder\n"
OUTSIDE_X = b"OUTSIDE-X: a file outside the folder\n"
MARKER = "outside-marker"
BIG = 1 << 30
"""A sparse file's size outside: a usage count or a delete's "freed" that reaches it walked out of the folder."""


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    quiet = dataclasses.replace(settings, storage=StorageSettings(recount_interval=3600.0))  # the test recounts
    async with running_caravan(quiet) as running:
        yield running


def leaked(body: bytes) -> bool:
    return b"TOPSECRET" in body or b"OUTSIDE-X" in body or MARKER.encode() in body


class Outside:
    """What lies next to the folder: a 0600 secret file and a directory (``x``, a marker, a big sparse file)."""

    def __init__(self, host: Path) -> None:
        self.root = host.parent / f"outside-{host.name}"
        self.secret = self.root / "secret"
        self.dir = self.root / "dir"
        self.build()

    def build(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.secret.write_bytes(SECRET)
        self.secret.chmod(0o600)
        (self.dir / "x").write_bytes(OUTSIDE_X)
        (self.dir / MARKER).write_bytes(b"m")
        with (self.dir / "big.bin").open("wb") as big:
            big.truncate(BIG)
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple[int, int, str, int]]:
        found = {}
        for where, dirs, names in os.walk(self.root):
            for name in dirs + names:
                path = Path(where) / name
                info = path.lstat()
                digest = hashlib.sha256(head(path)).hexdigest() if stat.S_ISREG(info.st_mode) else ""
                found[str(path.relative_to(self.root))] = (info.st_mode, info.st_size, digest, info.st_mtime_ns)
        return found

    def changes(self) -> str | None:
        """What changed outside since it was built (then built again), or None."""
        now = self.snapshot()
        if now == self.before:
            return None
        changed = sorted(k for k in now.keys() | self.before.keys() if now.get(k) != self.before.get(k))
        self.build()
        return f"changed outside the folder: {changed}"


class Watched(Files):
    """The file API's client, noting every answer that is a server error."""

    def __init__(self, caravan: Caravan, folder_id: str, token: str) -> None:
        super().__init__(caravan, folder_id, token)
        self.failures: list[str | None] = []
        self.seen: set[int] = set()
        """The statuses GET f answered: both the decoy's (200) and the link's (404) show the swap was live."""

    async def call(self, method: str, suffix: str = "", **kwargs: Any) -> httpx2.Response:
        answer = await super().call(method, suffix, **kwargs)
        if answer.status_code >= 500:
            self.failures.append(f"{method} {suffix} {kwargs.get('params')} answered {answer.status_code}")
        return answer


def head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(4096)


Operation = Callable[[Watched, int], Awaitable[str | None]]


async def get_f(files: Watched, i: int) -> str | None:
    got = await files.get("f")
    files.seen.add(got.status_code)
    return f"GET f answered {got.content[:60]!r}" if leaked(got.content) else None


async def head_f(files: Watched, i: int) -> str | None:
    got = await files.call("HEAD", params={"path": "f"})
    size = got.headers.get("content-length")
    return f"HEAD f said the secret's size {size}" if got.status_code == 200 and size == str(len(SECRET)) else None


async def range_f(files: Watched, i: int) -> str | None:
    got = await files.call("GET", params={"path": "f"}, headers={"range": "bytes=0-8"})
    return f"a Range of f answered {got.content!r}" if got.content == SECRET[:9] else None


async def get_d_x(files: Watched, i: int) -> str | None:
    got = await files.get("d/x")
    return f"GET d/x answered {got.content[:60]!r}" if leaked(got.content) else None


async def list_d(files: Watched, i: int) -> str | None:
    got = await files.get("d")
    return f"listing d answered {got.text[:200]}" if leaked(got.content) else None


def download_of(path: str) -> Operation:
    async def download(files: Watched, i: int) -> str | None:
        made = await files.call("POST", "/link", params={"path": path})
        if made.status_code != 201:
            return None
        got = await files.http.get(files.base.split("/folders/")[0] + made.json()["url"])
        if got.status_code >= 500:
            files.failures.append(f"a download link to {path} answered {got.status_code}")
        return f"a download link to {path} answered {got.content[:60]!r}" if leaked(got.content) else None

    return download


async def put_f(files: Watched, i: int) -> str | None:
    await files.put("f", b"replaced by an upload")
    return None


async def append_f(files: Watched, i: int) -> str | None:
    await files.call("PUT", params={"path": "f", "offset": str(len(SECRET))}, content=b"appended")
    return None


async def put_in_d(files: Watched, i: int) -> str | None:
    await files.put(f"d/new-{i}", b"uploaded")
    return None


async def append_in_d(files: Watched, i: int) -> str | None:
    await files.call("PUT", params={"path": f"d/piece-{i}", "offset": "0"}, content=b"a piece")
    return None


async def mkdir_in_d(files: Watched, i: int) -> str | None:
    await files.call("POST", "/mkdir", params={"path": f"d/sub-{i}/deeper"})
    return None


async def move_out_of_d(files: Watched, i: int) -> str | None:
    await files.call("POST", "/move", params={"from": "d/x", "to": f"got-{i}"})
    return None


async def move_into_d(files: Watched, i: int) -> str | None:
    await files.put(f"mine-{i}", b"mine")
    await files.call("POST", "/move", params={"from": f"mine-{i}", "to": f"d/mine-{i}"})
    return None


async def move_f(files: Watched, i: int) -> str | None:
    await files.call("POST", "/move", params={"from": "f", "to": f"moved-{i}"})
    return None


async def delete_in_d(files: Watched, i: int) -> str | None:
    await files.call("DELETE", params={"path": "d/x"})
    return None


async def delete_f(files: Watched, i: int) -> str | None:
    await files.call("DELETE", params={"path": "f"})
    return None


async def delete_d(files: Watched, i: int) -> str | None:
    got = await files.call("DELETE", params={"path": "d"})
    freed = got.json().get("freed", 0) if got.status_code == 200 else 0
    return f"deleting d freed {freed} bytes" if freed >= BIG else None


OPERATIONS: list[tuple[str, Operation]] = [
    ("GET f", get_f),
    ("HEAD f", head_f),
    ("Range f", range_f),
    ("GET d/x", get_d_x),
    ("list d", list_d),
    ("download link f", download_of("f")),
    ("download link d/x", download_of("d/x")),
    ("PUT f", put_f),
    ("PUT f offset", append_f),
    ("PUT d/new", put_in_d),
    ("PUT d/piece offset 0", append_in_d),
    ("mkdir d/sub/deeper", mkdir_in_d),
    ("move d/x out", move_out_of_d),
    ("move into d", move_into_d),
    ("move f", move_f),
    ("DELETE d/x", delete_in_d),
    ("DELETE f", delete_f),
    ("DELETE d", delete_d),
]


async def test_no_operation_leaves_the_folder_while_a_session_swaps_its_paths(caravan: Caravan) -> None:
    token, folder_id, host = await folder_for(caravan)
    files = Watched(caravan, folder_id, token)
    outside = Outside(host)
    store = FolderStore(caravan.store.redis, caravan.store.keys)
    recounter = UsageRecounter(store, StorageSettings(recount_interval=0.0))

    async def recount(files: Watched, i: int) -> str | None:
        await recounter.recount_due()  # the scheduler's walk, as it runs on the storage node
        counted = (await store.usage([folder_id]))[folder_id]
        return f"the recount counted {counted} bytes" if counted >= BIG else None

    swapper = subprocess.Popen(  # noqa: ASYNC220 (starts it and returns; asyncio's would tie it to this loop)
        [
            sys.executable,
            str(Path(__file__).with_name("path_swapper.py")),
            str(host),
            str(outside.secret),
            str(outside.dir),
        ]
    )
    leaks: dict[str, list[str]] = {}
    try:
        for name, operation in [*OPERATIONS, ("usage recount", recount)]:
            for i in range(ROUNDS):
                try:
                    found = [await operation(files, i), outside.changes()]
                    found += files.failures
                    files.failures.clear()
                except httpx2.HTTPError as exc:  # a broken answer: what it read was not what it had looked at
                    found = [f"the answer broke: {exc!r}"[:200], outside.changes()]
                leaks.setdefault(name, []).extend(f for f in found if f)
                assert swapper.poll() is None, "the swapping loop stopped"
    finally:
        swapper.kill()
        swapper.wait()
    leaks = {name: found for name, found in leaks.items() if found}
    assert not leaks, "\n".join(f"{name}: {len(found)} times, first: {found[0]}" for name, found in leaks.items())
    assert outside.secret.read_bytes() == SECRET
    assert files.seen == {200, 404}, files.seen
