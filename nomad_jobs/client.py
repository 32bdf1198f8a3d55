"""Caravan's async client for the Nomad HTTP API: the only module that talks to Nomad.

Errors are mapped once, here: unreachable, 5xx or too slow → :class:`TransientError` (retry with backoff),
404 → :class:`JobNotFound` / :class:`NomadNotFound`, other 4xx → :class:`NomadRejected`.

HTTP is httpx2, pydantic's maintained fork of httpx: the same API, and its pool reclaims the slot of a call
cancelled while the pool is contended, which httpcore 1.0.9 (pinned by httpx 0.28.1) leaks forever
(encode/httpcore#1093; ``tests/nomad_jobs/test_client_pool.py``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

import httpx2

from core.clock import from_iso
from core.errors import PermanentError, TransientError
from core.retry import stop_if_cancelled
from core.settings import NomadSettings
from nomad_jobs.log_frames import HEARTBEAT, FrameSplitter, LogFrame, absolute_offset
from nomad_jobs.stats import AllocStats, parse_alloc_stats

log = logging.getLogger(__name__)

Json = dict[str, Any]

Admission = Callable[[], AbstractAsyncContextManager[object]]
"""What a call waits for before it takes a connection (see :meth:`NomadClient.admitted`)."""

LIVE_ALLOCATIONS = (
    'DesiredStatus == "run" and (ClientStatus == "pending" or ClientStatus == "running" or ClientStatus == "unknown")'
)
"""Allocations Nomad's own scheduler counts against a node (one being stopped already frees its resources there)."""

TERMINAL_ALLOCATION_STATUSES = frozenset({"complete", "failed", "lost"})
"""Client statuses of an allocation whose tasks will not run (or write logs) again."""
CONNECTIONS = 64
"""Connections of a client's pool for calls (besides log follows): more calls at once wait for a free one."""
LOG_FOLLOWS = 64
"""Log follows open at once per client; more wait for a free connection (Nomad allows 100 per client address)."""


REFUSALS_AS_500 = (
    "is not allowed in namespace",  # the namespace's capabilities refuse the job's driver or network
    "validation failed",  # the job breaks Nomad's rules ("Task group main1 validation failed: ... minimum MemoryMB")
)
"""What Nomad answers with a 500 when it refuses a job for good: retrying would never succeed."""


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process and shared by every client's pools: building one reads the
    system's CA bundle (tens of milliseconds: bench/README.md), and each client has two pools (a test suite makes
    hundreds of clients)."""
    return httpx2.create_ssl_context()


class NomadRejected(PermanentError):
    """Nomad refused the request (bad job, bad parameter)."""


class NomadNotFound(PermanentError):
    pass


class NomadDenied(NomadRejected):
    """Nomad answered 403 (Permission denied): the token may not do this, or the server answering has not restored its
    ACL state yet (seen just after a Nomad server restarts: bench/chaos)."""


class JobExists(PermanentError):
    """A create-only registration found the job already there: a re-delivered submission."""


class NomadClient:
    def __init__(self, settings: NomadSettings, *, timeout: float = 10.0, max_connections: int = CONNECTIONS) -> None:
        """``timeout``: seconds one call may take in all (waiting for admission and a connection, sending, reading
        the answer), and each phase of a log follow or event stream; ``max_connections``: size of the call pool."""
        headers = {"X-Nomad-Token": settings.token} if settings.token else {}
        self.settings = settings
        self.timeout = timeout
        self._admission: Admission | None = None
        self._http = httpx2.AsyncClient(
            base_url=settings.addr,
            headers=headers,
            timeout=timeout,
            verify=tls_context(),
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections // 2),
        )
        # log follows hold a connection each for as long as someone watches: a pool of their own, so that
        # many watchers cannot starve the calls that run sessions
        self._follows = httpx2.AsyncClient(
            base_url=settings.addr,
            headers=headers,
            timeout=timeout,
            verify=tls_context(),
            limits=httpx2.Limits(max_connections=LOG_FOLLOWS, max_keepalive_connections=0),
        )

    def admitted(self, admission: Admission) -> NomadClient:
        """This client (its pools shared) with every call first entering ``admission()`` (a semaphore, say: the
        gateway's per-request and per-user caps); the wait counts against the call's timeout."""
        view = copy.copy(self)
        view._admission = admission
        return view

    def in_namespace(self, namespace: str) -> NomadClient:
        """This client (its pools shared) speaking for jobs of ``namespace`` (the platform's, say)."""
        view = copy.copy(self)
        view.settings = dataclasses.replace(self.settings, namespace=namespace)
        return view

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._follows.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        params = {"namespace": self.settings.namespace, **kwargs.pop("params", {})}
        try:
            async with asyncio.timeout(self.timeout):
                async with self._admission() if self._admission else contextlib.nullcontext():
                    response = await self._http.request(method, path, params=params, **kwargs)
        except TimeoutError as exc:
            raise TransientError(f"Nomad {method} {path} did not answer within {self.timeout:g} s") from exc
        except httpx2.TransportError as exc:
            raise TransientError(f"Nomad at {self.settings.addr} is unreachable: {exc!r}") from exc
        if response.status_code >= 500:
            text = response.text.strip()
            if "job already exists" in text:
                raise JobExists(text)
            if any(refusal in text for refusal in REFUSALS_AS_500):
                raise NomadRejected(f"Nomad {method} {path} refused: {text}")
            raise TransientError(f"Nomad {method} {path} answered {response.status_code}: {text}")
        if response.status_code == 404:
            raise NomadNotFound(f"{path}: {response.text.strip()}")
        if response.status_code == 403:
            raise NomadDenied(f"Nomad {method} {path} refused: {response.text.strip()}")
        if response.status_code >= 400:
            raise NomadRejected(f"Nomad {method} {path} refused: {response.text.strip()}")
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._request(method, path, **kwargs)).json()

    # -- jobs ------------------------------------------------------------------------------------

    async def parse(self, hcl: str) -> Json:
        """Nomad's own parse of job HCL (server side, no file access)."""
        job: Json = await self._json("POST", "/v1/jobs/parse", json={"JobHCL": hcl, "Canonicalize": True})
        return job

    async def register(self, job: Json, *, source_hcl: str | None = None, create_only: bool = True) -> Json:
        body: Json = {"Job": job}
        if create_only:
            body |= {"EnforceIndex": True, "JobModifyIndex": 0}
        if source_hcl is not None:
            body["Submission"] = {"Source": source_hcl, "Format": "hcl2"}
        result: Json = await self._json("POST", "/v1/jobs", json=body)
        return result

    async def deregister(self, job_id: str, *, purge: bool = False) -> None:
        params = {"purge": "true"} if purge else {}
        with contextlib.suppress(NomadNotFound):
            await self._request("DELETE", f"/v1/job/{job_id}", params=params)

    async def job(self, job_id: str) -> Json:
        job: Json = await self._json("GET", f"/v1/job/{job_id}")
        return job

    async def jobs(self, prefix: str) -> list[Json]:
        jobs: list[Json] = await self._json("GET", "/v1/jobs", params={"prefix": prefix, "meta": "true"})
        return jobs

    async def allocations(self, job_prefix: str) -> list[Json]:
        """Allocation stubs of every job whose id starts with ``job_prefix``, in one call (with their allocated
        ports: a rescheduled replica's new endpoint must converge even when the event stream missed it)."""
        params = {"filter": f'JobID matches "^{job_prefix}"', "task_states": "true", "resources": "true"}
        allocs: list[Json] = await self._json("GET", "/v1/allocations", params=params)
        return allocs

    async def job_allocations(self, job_id: str) -> list[Json]:
        allocs: list[Json] = await self._json("GET", f"/v1/job/{job_id}/allocations", params={"all": "true"})
        return allocs

    async def job_evaluations(self, job_id: str) -> list[Json]:
        """The job's evaluations: each with ``Status`` (``blocked`` while one waits for room), ``FailedTGAllocs``
        (task group -> why it could not be placed) and ``CreateIndex``/``ModifyIndex``."""
        evaluations: list[Json] = await self._json("GET", f"/v1/job/{job_id}/evaluations")
        return evaluations

    # -- allocations -----------------------------------------------------------------------------

    async def allocation(self, alloc_id: str) -> Json:
        alloc: Json = await self._json("GET", f"/v1/allocation/{alloc_id}")
        return alloc

    async def alloc_stats(self, alloc_id: str) -> AllocStats:
        """The allocation's resource usage (:mod:`nomad_jobs.stats`); ``NomadRejected`` when the answer is malformed."""
        response = await self._request("GET", f"/v1/client/allocation/{alloc_id}/stats")
        try:
            return parse_alloc_stats(response.content)
        except ValueError as exc:
            raise NomadRejected(f"allocation {alloc_id}: {exc}") from exc

    async def file_modified(self, alloc_id: str, path: str) -> datetime:
        """When the file at ``path`` (relative to the allocation's directory: ``alloc/...``, ``<task>/local/...``) was
        last modified, by the clock of the allocation's node (``fs/stat``: metadata only, never the content)."""
        found = await self._json("GET", f"/v1/client/fs/stat/{alloc_id}", params={"path": path})
        try:
            return from_iso(str(found["ModTime"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise NomadRejected(f"allocation {alloc_id}: no modification time for {path}: {found!r:.200}") from exc

    async def read_file(self, alloc_id: str, path: str) -> bytes:
        """The content of the file at ``path`` (relative to the allocation's directory), read through the allocation's
        client (``fs/cat``; the server forwards the call, whichever node runs it). For small files only."""
        response = await self._request("GET", f"/v1/client/fs/cat/{alloc_id}", params={"path": path})
        return response.content

    async def allocation_checks(self, alloc_id: str) -> Json:
        """The latest result of each Nomad-native service check of the allocation: check id -> ``{"Status":
        "success"|"failure"|"pending", "Mode": "healthiness"|"readiness", "Timestamp": unix seconds, "Output",
        "Check", "Service", …}``. Answered by the allocation's Nomad client (the server forwards the call)."""
        checks: Json = await self._json("GET", f"/v1/client/allocation/{alloc_id}/checks")
        return checks or {}

    async def restart_allocation(self, alloc_id: str, task: str) -> None:
        await self._request("POST", f"/v1/client/allocation/{alloc_id}/restart", json={"TaskName": task})

    async def signal_allocation(self, alloc_id: str, task: str, signal: str) -> None:
        """Send ``signal`` (``SIGKILL``, ``SIGTERM`` …) to the task's process, as ``nomad alloc signal`` does."""
        await self._request("POST", f"/v1/client/allocation/{alloc_id}/signal", json={"Task": task, "Signal": signal})

    async def live_allocations(self) -> list[Json]:
        """Every allocation that holds resources now, in every namespace and of any job, with its allocated
        resources and without task states: one call, whatever the cluster runs (the scheduler's occupancy)."""
        params = {"namespace": "*", "resources": "true", "task_states": "false", "filter": LIVE_ALLOCATIONS}
        allocs: list[Json] = await self._json("GET", "/v1/allocations", params=params)
        return allocs

    async def node_allocations(self, node_id: str, *, index: int = 0, wait: float = 5.0) -> tuple[list[Json], int]:
        """Every allocation of one node, in every namespace, with its job; a blocking query: it answers once the
        node's allocations changed after ``index`` (or ``wait`` seconds passed). Returns them and the new index."""
        params = {"index": str(index), "wait": f"{wait:g}s"} if index else {}
        response = await self._request("GET", f"/v1/node/{node_id}/allocations", params=params)
        allocs: list[Json] = response.json()
        return allocs, int(response.headers.get("X-Nomad-Index", "0"))

    async def stop_allocation(self, alloc_id: str) -> None:
        await self._request("POST", f"/v1/allocation/{alloc_id}/stop")

    async def logs(self, alloc_id: str, task: str, stream: str = "stdout", *, tail_bytes: int | None = None) -> str:
        params: dict[str, str] = {"task": task, "type": stream, "plain": "true"}
        if tail_bytes is not None:
            params |= {"origin": "end", "offset": str(tail_bytes)}
        else:
            params |= {"origin": "start", "offset": "0"}
        response = await self._request("GET", f"/v1/client/fs/logs/{alloc_id}", params=params)
        return response.text

    async def follow_logs(
        self, alloc_id: str, task: str, stream: str = "stdout", *, tail_bytes: int = 0, quiet: float = 1.0
    ) -> AsyncIterator[str]:
        """The task's log from ``tail_bytes`` before its end, then live as it is written, as text chunks.

        Waits while the task has not started. Ends once the allocation is terminal (or gone) and the stream
        has been ``quiet`` seconds without data after that was seen: Nomad's follow never ends by itself.
        A broken stream is reopened right after the last byte delivered.
        """
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if tail_bytes > 0:
            start = {"origin": "end", "offset": str(tail_bytes)}
        else:  # Nomad reads origin=end offset=0 as the start of the newest file: start at the end ourselves
            written = sum(size for _, size in await self._log_files(alloc_id, task, stream))
            start = {"origin": "start", "offset": str(written)}
        while True:
            stop_if_cancelled()  # a cancellation suppressed with the reader's (below) or lost in a call ends it here
            frames: asyncio.Queue[LogFrame | BaseException | None] = asyncio.Queue()
            reader = asyncio.create_task(self._read_log_frames(alloc_id, task, stream, start, frames))
            last: LogFrame | None = None
            try:
                async for chunk, frame in self._until_drained(alloc_id, frames, quiet):
                    last = frame  # where to resume from, after the loop
                    if decoded := text.decode(chunk):
                        yield decoded
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            if await self._allocation_ended(alloc_id):
                if rest := text.decode(b"", final=True):
                    yield rest
                return
            if last is None:
                await asyncio.sleep(quiet / 2)  # the task has not started yet: Nomad has no log to follow
                continue
            position = absolute_offset(await self._log_files(alloc_id), task, stream, last)
            start = {"origin": "start", "offset": str(position)}

    async def _log_files(
        self, alloc_id: str, task: str | None = None, stream: str | None = None
    ) -> list[tuple[str, int]]:
        """(name, size) of the allocation's log files (of one task's stream if given); none before it has any."""
        try:
            files = await self._json("GET", f"/v1/client/fs/ls/{alloc_id}", params={"path": "/alloc/logs"})
        except (NomadNotFound, NomadRejected, TransientError) as exc:  # no log directory yet (an outage shows next)
            log.debug("no log files of %s: %s", alloc_id, exc)
            return []
        listing = [(str(f["Name"]), int(f["Size"])) for f in files or () if not f.get("IsDir")]
        if task is None:
            return listing
        return [(name, size) for name, size in listing if name.startswith(f"{task}.{stream}.")]

    async def _read_log_frames(
        self,
        alloc_id: str,
        task: str,
        stream: str,
        start: dict[str, str],
        frames: asyncio.Queue[LogFrame | BaseException | None],
    ) -> None:
        """Put each frame of one follow request on ``frames``; then None (the stream ended) or the error."""
        params = {
            "namespace": self.settings.namespace,
            "task": task,
            "type": stream,
            "follow": "true",
            "plain": "false",
            **start,
        }
        splitter = FrameSplitter()
        try:
            async with self._follows.stream(
                "GET", f"/v1/client/fs/logs/{alloc_id}", params=params, timeout=httpx2.Timeout(10.0, read=None)
            ) as response:
                if response.status_code != 200:
                    # 404 before the task starts, 400 before Nomad knows the task: both settle on their own
                    await response.aread()
                    raise NomadNotFound(f"logs of {alloc_id}: {response.status_code} {response.text.strip()}")
                async for chunk in response.aiter_bytes():
                    for frame in splitter.feed(chunk):
                        frames.put_nowait(frame)
            frames.put_nowait(None)
        except (httpx2.TransportError, NomadNotFound, ValueError) as exc:
            frames.put_nowait(exc)

    async def _until_drained(
        self, alloc_id: str, frames: asyncio.Queue[LogFrame | BaseException | None], quiet: float
    ) -> AsyncIterator[tuple[bytes, LogFrame]]:
        """The data of ``frames`` until the allocation has ended and no data came for ``quiet`` seconds since;
        stops early when the request ends (returns, and the caller decides whether to reopen it)."""
        ended = False
        last_data = last_check = time.monotonic()
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the frame when a cancellation (a
                # kernelLogs subscription completed or its connection closed) lands as the frame arrives, and the
                # follow went on for as long as the kernel wrote, holding its place (gateway.log_follows)
                async with asyncio.timeout(quiet):
                    frame = await frames.get()
            except TimeoutError:
                frame = HEARTBEAT
            if frame is None or isinstance(frame, BaseException):
                if isinstance(frame, httpx2.TransportError | ValueError):
                    log.info("log stream of %s broke (%s); reopening it", alloc_id, frame)
                return
            now = time.monotonic()
            if frame.data:
                last_data = now
                yield frame.data, frame
                continue
            if not ended and now - last_check >= quiet:
                last_check = now
                ended = await self._allocation_ended(alloc_id)
            if ended and now - last_data >= quiet:
                return

    async def _allocation_ended(self, alloc_id: str) -> bool:
        try:
            alloc = await self.allocation(alloc_id)
        except NomadNotFound:
            return True  # collected: it ended long ago
        return str(alloc.get("ClientStatus")) in TERMINAL_ALLOCATION_STATUSES

    # -- dynamic host volumes (storage folders) ------------------------------------------------------

    async def create_host_volume(self, name: str, node_id: str) -> Json:
        """Create (idempotently, by name on that node) a dynamic host volume with Nomad's built-in ``mkdir`` plugin:
        the answer's ``Volume`` has its ``ID``, ``NodeID`` and ``HostPath``. Mounted by several allocations at once
        (``single-node-multi-writer``), read-only where a job asks."""
        body = {
            "Volume": {
                "Name": name,
                "Namespace": self.settings.namespace,
                "PluginID": "mkdir",
                "NodeID": node_id,
                "RequestedCapabilities": [
                    {"AccessMode": "single-node-multi-writer", "AttachmentMode": "file-system"},
                    {"AccessMode": "single-node-reader-only", "AttachmentMode": "file-system"},
                ],
                "Parameters": {"mode": "0777"},
            }
        }
        volume: Json = (await self._json("PUT", "/v1/volume/host/create", json=body))["Volume"]
        return volume

    async def delete_host_volume(self, volume_id: str) -> None:
        """Delete a dynamic host volume and its data (a missing one is no error)."""
        with contextlib.suppress(NomadNotFound):
            await self._request("DELETE", f"/v1/volume/host/{volume_id}", params={"type": "host"})

    # -- nodes and agent -------------------------------------------------------------------------

    async def namespace_capabilities(self) -> Json:
        """This client's namespace's capabilities (``EnabledTaskDrivers``, ``DisabledTaskDrivers``, ...); {}: none."""
        found: Json = await self._json("GET", f"/v1/namespace/{self.settings.namespace}")
        capabilities: Json = found.get("Capabilities") or {}
        return capabilities

    async def nodes(self) -> list[Json]:
        nodes: list[Json] = await self._json("GET", "/v1/nodes", params={"resources": "true"})
        return nodes

    async def node(self, node_id: str) -> Json:
        node: Json = await self._json("GET", f"/v1/node/{node_id}")
        return node

    async def leader(self) -> str:
        leader: str = await self._json("GET", "/v1/status/leader")
        return leader

    # -- events ----------------------------------------------------------------------------------

    async def event_stream(self, *, index: int, topics: Sequence[str]) -> AsyncIterator[Json]:
        """Nomad's event stream from ``index`` on: one dict per batch ``{"Index", "Events"}``, heartbeats dropped."""
        params = httpx2.QueryParams(
            [("index", str(index)), ("namespace", self.settings.namespace), *(("topic", t) for t in topics)]
        )
        try:
            async with self._http.stream(
                "GET", "/v1/event/stream", params=params, timeout=httpx2.Timeout(10.0, read=60.0)
            ) as response:
                if response.status_code != 200:
                    raise TransientError(f"event stream answered {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    batch = json.loads(line)
                    if batch:
                        yield batch
        except httpx2.TransportError as exc:
            raise TransientError(f"event stream broken: {exc}") from exc
