"""Storage folders: file throughput through the gateway's file API and over an SFTP system session against a plain
local copy on the same disk, and the start time a session's three mounted folders add. One run, one machine.

Starts a private Redis and Nomad dev agent (ACLs and Redis users on) and an in-process gateway and scheduler, makes
folders (Nomad dynamic host volumes), then, for one ``--mib`` MiB file of random bytes:

- ``local``: ``shutil.copyfile`` into the folder's directory (the baseline: the same disk);
- ``gateway``: ``curl -T`` to ``PUT /folders/{id}/files`` and ``curl -o`` from ``GET`` (bearer token);
- ``sftp``: OpenSSH's ``sftp -b`` put and get against a ``requestSftp`` session (docker, dropbear + sftp-server);

each direction ``--repeat`` times (the best kept), MiB/s, every copy checked byte-exact. Then exec sessions are
created with no mount and with three, ``--starts`` of each, and the median seconds from ``createSession`` to RUNNING
are compared. Prints one JSON line per measurement and a last line with the ratios (each vs ``local``), the goal
(>= 0.5x of a local copy) and ``meets_goal``.

Usage: .venv/bin/python -m bench.storage [--mib 256] [--repeat 3] [--starts 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import filecmp
import json
import os
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import uvloop

from caravan.stack.private_stack import private_stack, stack_env
from caravan.stack.processes import free_port
from core.settings import Settings, StorageSettings
from domain.sftp import CHROOT, KEY_VARIABLE, SERVER_COMMAND, SFTP_PORT
from tests.harness import CREATE, Caravan, running_caravan

MIB = 1024 * 1024
GOAL = 0.5
GOAL_PATHS = ("gateway_upload", "gateway_download", "sftp_upload", "sftp_download")
"""The ratios the goal is about: curl through the gateway, OpenSSH's sftp (``*_raw_client``: a lean client's)."""
CREATE_FOLDER = "mutation($name: String!) { createFolder(input: {name: $name}) { id } }"
FOLDER = "query($id: ID!) { folder(id: $id) { status } }"
REQUEST_SFTP = "mutation($f: [ID!]!) { requestSftp(input: {folders: $f}) { privateKey session { id } } }"
ADDRESS = "query($id: ID!) { session(id: $id) { sftpAddress } }"


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def best_rate(mib: int, repeat: int, run: Any) -> float:
    return max(mib / timed(run) for _ in range(repeat))


async def folder(caravan: Caravan, token: str, name: str) -> tuple[str, Path]:
    folder_id = (await caravan.gql(CREATE_FOLDER, {"name": name}, token=token))["createFolder"]["id"]
    while (await caravan.gql(FOLDER, {"id": folder_id}, token=token))["folder"]["status"] != "READY":
        await asyncio.sleep(0.1)
    volumes = await caravan.nomad._json("GET", "/v1/volumes", params={"type": "host"})
    [volume] = [v for v in volumes if v["Name"] == f"caravan-folder-{folder_id}"]
    detail = await caravan.nomad._json("GET", f"/v1/volume/host/{volume['ID']}")
    return folder_id, Path(detail["HostPath"])


def curl(*args: str) -> None:
    subprocess.run(["curl", "-sSf", "-o", "/dev/null", *args], check=True)


def raw_put(url: SplitResult, token: str, source: Path) -> None:
    """A lean HTTP/1.1 client's upload: the file sent by ``socket.sendfile`` (no copy through user space)."""
    size = source.stat().st_size
    with socket.create_connection((url.hostname, url.port)) as conn, source.open("rb") as body:
        head = f"PUT {url.path}?{url.query} HTTP/1.1\r\nhost: {url.netloc}\r\nauthorization: Bearer {token}\r\n"
        conn.sendall(f"{head}content-length: {size}\r\nconnection: close\r\n\r\n".encode())
        conn.sendfile(body)
        answer = conn.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]


def raw_get(url: SplitResult, token: str, target: Path) -> None:
    """A lean HTTP/1.1 client's download: ``recv_into`` a 4 MiB buffer, ``os.write`` to the file."""
    head = f"GET {url.path}?{url.query} HTTP/1.1\r\nhost: {url.netloc}\r\nauthorization: Bearer {token}\r\n"
    with socket.create_connection((url.hostname, url.port)) as conn, target.open("wb") as out:
        conn.sendall(f"{head}connection: close\r\n\r\n".encode())
        buffer = bytearray(4 * MIB)
        view = memoryview(buffer)
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(65536)
        status, _, body = received.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 200"), status[:200]
        out.write(body)
        while n := conn.recv_into(view):
            out.write(view[:n])


def sftp(address: str, key: Path, commands: str) -> None:
    host, port = address.rsplit(":", 1)
    argv = ["sftp", "-q", "-b", "-", "-i", str(key), "-P", port, "-o", "StrictHostKeyChecking=no"]
    argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{host}"]
    subprocess.run(argv, input=commands, text=True, check=True, capture_output=True)


@contextlib.contextmanager
def host_sftp_server(image: str, host: Path, key: Path) -> Iterator[str]:
    """The SFTP image's sshd run by Docker on the host's network (no Nomad, no CNI port mapping), serving the same
    folder directory, for the same key: the reference of the SFTP path. Its address."""
    port = free_port()
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], check=True, capture_output=True, text=True).stdout
    command = SERVER_COMMAND.replace(f"-p {SFTP_PORT}", f"-o ListenAddress=127.0.0.1 -p {port}")
    argv = ["docker", "run", "-d", "--rm", "--network", "host", "-v", f"{host}:{CHROOT}/folders/throughput"]
    argv += ["-e", f"{KEY_VARIABLE}={public.strip()}", image, "sh", "-c", command]
    container = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


async def sftp_session(caravan: Caravan, token: str, folder_id: str, work: Path) -> tuple[str, Path]:
    access = (await caravan.gql(REQUEST_SFTP, {"f": [folder_id]}, token=token))["requestSftp"]
    key = work / "sftp-key"
    key.write_text(access["privateKey"])
    key.chmod(0o600)
    await caravan.wait_for(access["session"]["id"], "RUNNING")
    address = (await caravan.gql(ADDRESS, {"id": access["session"]["id"]}, token=token))["session"]["sftpAddress"]
    for _ in range(60):  # dropbear starts with the task
        try:
            sftp(address, key, "ls /folders\n")
            break
        except subprocess.CalledProcessError:
            await asyncio.sleep(0.5)
    return str(address), key


async def start_seconds(caravan: Caravan, token: str, mounts: list[dict[str, str]], name: str) -> float:
    began = time.perf_counter()
    spec = {"name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": "sleep 600", "mounts": mounts}
    [created] = (await caravan.gql(CREATE, {"input": spec}, token=token))["createSession"]["sessions"]
    await caravan.wait_for(created["id"], "RUNNING", timeout=120)
    seconds = time.perf_counter() - began
    await caravan.gql("mutation($id: ID!) { destroySession(ids: [$id], forced: true) { id } }", {"id": created["id"]})
    return seconds


async def measure(settings: Settings, work: Path, args: argparse.Namespace) -> None:
    async with running_caravan(settings) as caravan:
        token = await caravan.user("bench")
        folder_id, host = await folder(caravan, token, "throughput")
        source = work / "source.bin"
        with source.open("wb") as out:
            for _ in range(args.mib):
                out.write(os.urandom(MIB))
        back = work / "back.bin"
        rates: dict[str, float] = {}

        rates["local_copy"] = best_rate(args.mib, args.repeat, lambda: shutil.copyfile(source, host / "local.bin"))
        base = caravan.url.removesuffix("/graphql") + f"/folders/{folder_id}/files?path="
        auth = f"authorization: Bearer {token}"
        if "gateway" in args.paths:
            rates["gateway_upload"] = await asyncio.to_thread(
                best_rate, args.mib, args.repeat, lambda: curl("-H", auth, "-T", str(source), base + "up.bin")
            )
            rates["gateway_download"] = await asyncio.to_thread(
                best_rate,
                args.mib,
                args.repeat,
                lambda: subprocess.run(["curl", "-sSf", "-H", auth, "-o", str(back), base + "up.bin"], check=True),
            )
            assert filecmp.cmp(source, host / "up.bin", shallow=False) and filecmp.cmp(source, back, shallow=False)
            url = urlsplit(base + "raw.bin")
            rates["gateway_upload_raw_client"] = await asyncio.to_thread(
                best_rate, args.mib, args.repeat, lambda: raw_put(url, token, source)
            )
            rates["gateway_download_raw_client"] = await asyncio.to_thread(
                best_rate, args.mib, args.repeat, lambda: raw_get(url, token, back)
            )
            assert filecmp.cmp(source, host / "raw.bin", shallow=False) and filecmp.cmp(source, back, shallow=False)

        if settings.sftp_image and "sftp" in args.paths:
            address, key = await sftp_session(caravan, token, folder_id, work)
            rates["sftp_upload"] = await asyncio.to_thread(
                best_rate,
                args.mib,
                args.repeat,
                lambda: sftp(address, key, f"put {source} /folders/throughput/s.bin\n"),
            )
            rates["sftp_download"] = await asyncio.to_thread(
                best_rate, args.mib, args.repeat, lambda: sftp(address, key, f"get /folders/throughput/s.bin {back}\n")
            )
            assert filecmp.cmp(source, host / "s.bin", shallow=False) and filecmp.cmp(source, back, shallow=False)
            with host_sftp_server(settings.sftp_image, host, key) as reference:
                for _ in range(60):  # sshd starts with the container
                    try:
                        sftp(reference, key, "ls /folders\n")
                        break
                    except subprocess.CalledProcessError:
                        await asyncio.sleep(0.5)
                rates["sftp_host_network_upload"] = await asyncio.to_thread(
                    best_rate,
                    args.mib,
                    args.repeat,
                    lambda: sftp(reference, key, f"put {source} /folders/throughput/h.bin\n"),
                )
                rates["sftp_host_network_download"] = await asyncio.to_thread(
                    best_rate,
                    args.mib,
                    args.repeat,
                    lambda: sftp(reference, key, f"get /folders/throughput/h.bin {back}\n"),
                )
        for name, rate in rates.items():
            emit({"measure": name, "mib": args.mib, "mib_per_s": round(rate, 1)})

        starts: dict[str, list[float]] = {"none": [], "three": []}
        if args.starts:
            mounted = [
                {"folder": (await folder(caravan, token, f"m{i}"))[0], "path": f"/data/m{i}", "mode": "RW"}
                for i in range(3)
            ]
            for i in range(args.starts):  # interleaved, so that a slower moment of the machine hits both
                starts["none"].append(await start_seconds(caravan, token, [], f"bare-{i}"))
                starts["three"].append(await start_seconds(caravan, token, mounted, f"mounted-{i}"))
            emit({"measure": "start_seconds", **{k: [round(s, 3) for s in v] for k, v in starts.items()}})
        medians = {k: statistics.median(v) for k, v in starts.items() if v}

        ratios = {k: round(v / rates["local_copy"], 3) for k, v in rates.items() if k != "local_copy"}
        emit(
            {
                "summary": {
                    "mib": args.mib,
                    "local_copy_mib_per_s": round(rates["local_copy"], 1),
                    "ratio_vs_local_copy": ratios,
                    "start_median_s": {k: round(v, 3) for k, v in medians.items()},
                    "added_start_s_three_mounts": (round(medians["three"] - medians["none"], 3) if medians else None),
                    "load_average_1m": os.getloadavg()[0],
                },
                "goal": f"upload and download through the gateway and over SFTP >= {GOAL}x a local copy (same disk)",
                "meets_goal": all(ratios.get(k, 0) >= GOAL for k in GOAL_PATHS),
            }
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the file moved, MiB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per direction (the best kept)")
    parser.add_argument("--starts", type=int, default=5, help="sessions started with no mount and with three")
    parser.add_argument("--paths", default="gateway,sftp", help="what to measure besides the local copy")
    args = parser.parse_args()
    env = stack_env()
    settings = {"storage": StorageSettings(max_bytes_per_user=1 << 40), "sftp_image": env.get("CARAVAN_SFTP_IMAGE")}
    with private_stack(want_drivers=("raw_exec", "exec", "docker"), settings=settings) as stack:
        await measure(stack.settings, stack.home, args)


if __name__ == "__main__":
    uvloop.install()  # the gateway's loop in production (uvicorn's loop="auto")
    asyncio.run(main())
