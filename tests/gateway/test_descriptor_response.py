"""A download is sent from the descriptor the file API opened (``gateway.files.DescriptorResponse``), as long as the
Content-Length it announced: a session that appends to the file meanwhile (it may mount the folder) does not make the
answer longer than announced, which would break the connection; a Range is cut from the same descriptor."""

from __future__ import annotations

import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.files import DescriptorResponse


def _app(path: Path, appended: bytes) -> Starlette:
    async def download(request: Request) -> Response:
        response = DescriptorResponse(os.open(path, os.O_RDONLY), path.name)  # the size is taken here
        with path.open("ab") as more:  # the session writes on while the answer is on its way
            more.write(appended)
        return response

    return Starlette(routes=[Route("/f", download)])


def test_a_file_growing_while_it_is_sent_is_sent_as_long_as_announced(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * (3 * 1024 * 1024 + 5))
    with TestClient(_app(path, b"b" * 4096)) as client:
        whole = client.get("/f")
        assert whole.headers["content-length"] == str(3 * 1024 * 1024 + 5)
        assert whole.content == b"a" * (3 * 1024 * 1024 + 5)
        ranged = client.get("/f", headers={"Range": "bytes=10-19"})
        assert (ranged.status_code, ranged.content) == (206, b"a" * 10)
