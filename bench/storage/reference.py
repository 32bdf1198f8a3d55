"""The ceilings of bench/storage's paths on this machine, with no Caravan in them: ``curl`` against a trivial HTTP
server (a thread per connection; downloads by ``os.sendfile``, uploads by ``recv_into`` and ``os.write``), and
against a bare ASGI app on uvicorn (the gateway's server, loop and HTTP parser) that moves the bytes in 1 MiB
chunks; each vs ``shutil.copyfile`` of the same file on the same disk. What no HTTP path here can beat.

Usage: .venv/bin/python -m bench.storage.reference [--mib 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from caravan.stack.processes import free_port

MIB = 1 << 20


def best_rate(mib: int, repeat: int, argv: list[str] | None = None, run: Any = None) -> float:
    best = 0.0
    for _ in range(repeat):
        began = time.perf_counter()
        if argv is not None:
            subprocess.run(argv, check=True)
        else:
            run()
        best = max(best, mib / (time.perf_counter() - began))
    return best


def raw_server(root: Path) -> int:
    """A trivial HTTP/1.1 server on a free port: GET sends ``root/<name>`` by sendfile, PUT writes the body."""
    listener = socket.create_server(("127.0.0.1", 0))
    port: int = listener.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, target, _ = lines[0].split(" ")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            path = root / target.lstrip("/")
            if method == "GET":
                size = path.stat().st_size
                conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\nconnection: close\r\n\r\n".encode())
                with path.open("rb") as f:
                    sent = 0
                    while sent < size:
                        sent += os.sendfile(conn.fileno(), f.fileno(), sent, size - sent)
                return
            if headers.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            left = int(headers["content-length"])
            buffer = bytearray(4 * MIB)
            view = memoryview(buffer)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, rest)
                left -= len(rest)
                while left > 0:
                    n = conn.recv_into(view, min(left, len(buffer)))
                    if not n:
                        break
                    os.write(fd, view[:n])
                    left -= n
            finally:
                os.close(fd)
            conn.sendall(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return port


def asgi_app(root: Path) -> Any:
    """A bare ASGI app: GET sends the file in 1 MiB ``os.pread`` chunks, PUT writes each body chunk with os.write."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = root / scope["path"].lstrip("/")
        if scope["method"] == "GET":
            size = path.stat().st_size
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % size)]})
            fd = os.open(path, os.O_RDONLY)
            try:
                offset = 0
                while offset < size:
                    chunk = os.pread(fd, MIB, offset)
                    offset += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": offset < size})
            finally:
                os.close(fd)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            more = True
            while more:
                message = await receive()
                os.write(fd, message.get("body", b""))
                more = message.get("more_body", False)
        finally:
            os.close(fd)
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    return app


def uvicorn_server(root: Path) -> int:
    port = free_port()
    config = uvicorn.Config(asgi_app(root), host="127.0.0.1", port=port, log_level="warning", http="httptools")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()  # loop "auto": uvloop, as the gateway's
    while not server.started:
        time.sleep(0.02)
    return port


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-storage-ref-") as tmp:
        work = Path(tmp)
        source, served, back = work / "source.bin", work / "served", work / "back.bin"
        served.mkdir()
        with source.open("wb") as out:
            for _ in range(args.mib):
                out.write(os.urandom(MIB))
        rates = {"local_copy": best_rate(args.mib, args.repeat, run=lambda: shutil.copyfile(source, served / "l"))}
        for name, port in (("raw", raw_server(served)), ("uvicorn", uvicorn_server(served))):
            url = f"http://127.0.0.1:{port}/f.bin"
            rates[f"{name}_upload"] = best_rate(
                args.mib, args.repeat, ["curl", "-sSf", "-o", "/dev/null", "-T", str(source), url]
            )
            rates[f"{name}_download"] = best_rate(args.mib, args.repeat, ["curl", "-sSf", "-o", str(back), url])
            assert back.read_bytes() == source.read_bytes()
        local = rates["local_copy"]
        print(
            json.dumps(
                {
                    "mib": args.mib,
                    "mib_per_s": {k: round(v, 1) for k, v in rates.items()},
                    "ratio_vs_local_copy": {k: round(v / local, 3) for k, v in rates.items() if k != "local_copy"},
                    "load_average": os.getloadavg()[0],
                    "goal": "reference only: the ceiling of an HTTP path (curl) on this machine",
                    "meets_goal": True,
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(asyncio.to_thread(main))
