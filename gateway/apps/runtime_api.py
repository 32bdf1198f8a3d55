"""HAProxy's runtime API (its ``stats socket``, a unix socket, level admin), spoken directly: commands in, text out.

One connection per batch, in interactive mode (``prompt``): the commands go one a line, each answer ends at the next
prompt. Map edits (``add map``, ``set map``, ``del map``) take effect at once, for the next request of every
connection, with no reload; a map's whole content is swapped atomically with ``prepare map`` / ``add map @<version>``
/ ``commit map``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROMPT = b"\n> "
ENTRY = re.compile(r"^0x[0-9a-f]+: key=(?P<key>.*?) (?P<rest>use=.*)$")
"""A line of ``show table``: the key (which may hold spaces) up to the counters."""
TIMEOUT = 10.0
"""Seconds one batch may take before the API counts as unreachable."""


@dataclass(frozen=True)
class MapEdit:
    """What to delete, change and add in one map."""

    path: Path
    add: Mapping[str, str]
    change: Mapping[str, str]
    delete: Sequence[str]


class RuntimeApiError(Exception):
    """HAProxy's runtime API is unreachable or refused a command."""


class RuntimeApi:
    def __init__(self, socket: Path) -> None:
        self.socket = socket

    async def run(self, commands: Sequence[str]) -> list[str]:
        """Each command's answer, in order."""
        if not commands:
            return []
        for command in commands:
            if "\n" in command:
                raise ValueError(f"a runtime API command is one line: {command[:80]!r}")
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives as the answer
            # does, and the control plane's task then never stops
            async with asyncio.timeout(TIMEOUT):
                return await self._run(commands)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            raise RuntimeApiError(f"HAProxy's runtime API at {self.socket}: {type(exc).__name__}: {exc}") from exc

    async def _run(self, commands: Sequence[str]) -> list[str]:
        reader, writer = await asyncio.open_unix_connection(str(self.socket), limit=64 * 1024 * 1024)
        try:
            writer.write(b"prompt\n")
            await reader.readuntil(PROMPT)
            answers = []
            for start in range(0, len(commands), 500):  # bounded: HAProxy reads as we write
                chunk = commands[start : start + 500]
                writer.write("".join(c + "\n" for c in chunk).encode())
                await writer.drain()
                for _ in chunk:
                    answers.append((await reader.readuntil(PROMPT))[: -len(PROMPT)].decode(errors="replace"))
            writer.write(b"quit\n")
            await writer.drain()
            return answers
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def replace_map(self, path: Path, content: Mapping[str, str]) -> None:
        """``path``'s whole content, swapped in atomically."""
        (answer,) = await self.run([f"prepare map {path}"])
        version = answer.rsplit(":", 1)[-1].strip()
        if not version.isdigit():
            raise RuntimeApiError(f"prepare map {path}: {answer.strip()}")
        adds = [f"add map @{version} {path} {key} {value}" for key, value in content.items()]
        answers = await self.run([*adds, f"commit map @{version} {path}"])
        _check(adds + ["commit"], answers)

    async def edit_map(
        self, path: Path, add: Mapping[str, str], change: Mapping[str, str], delete: Sequence[str]
    ) -> None:
        await self.edit_maps([MapEdit(path, add, change, delete)])

    async def edit_maps(self, edits: Sequence[MapEdit]) -> None:
        """Several maps' edits in one batch (one connection), in order."""
        commands = [
            command
            for edit in edits
            for command in (
                *(f"del map {edit.path} {key}" for key in edit.delete),
                *(f"set map {edit.path} {key} {value}" for key, value in edit.change.items()),
                *(f"add map {edit.path} {key} {value}" for key, value in edit.add.items()),
            )
        ]
        _check(commands, await self.run(commands))

    async def show_map(self, path: Path) -> dict[str, str]:
        (answer,) = await self.run([f"show map {path}"])
        found = {}
        for line in answer.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3:
                found[parts[1]] = parts[2]
        return found

    async def table(self, name: str, where: str = "") -> list[dict[str, str]]:
        """The entries of stick table ``name`` (those matching ``where``, e.g. ``data.conn_cur gt 0``): ``key`` and
        each stored counter."""
        (answer,) = await self.run([f"show table {name} {where}".rstrip()])
        entries = []
        for line in answer.splitlines():
            found = ENTRY.match(line)
            if found is None:
                continue
            fields = dict(part.split("=", 1) for part in found["rest"].split() if "=" in part)
            entries.append({**fields, "key": found["key"]})
        return entries


def _check(commands: Sequence[str], answers: Sequence[str]) -> None:
    for command, answer in zip(commands, answers, strict=True):
        text = answer.strip()
        if text and not text.startswith("Done"):
            raise RuntimeApiError(f"{command.split(' ', 3)[:3]}: {text[:200]}")
