"""Caravan's async client for the Nomad HTTP API: the only module that talks to Nomad.

Errors are mapped once, here: unreachable or 5xx → :class:`TransientError` (retry with backoff),
404 → :class:`JobNotFound` / :class:`NomadNotFound`, other 4xx → :class:`NomadRejected`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from common.errors import PermanentError, TransientError
from common.settings import NomadSettings

log = logging.getLogger(__name__)

Json = dict[str, Any]

LIVE_ALLOCATIONS = (
    'DesiredStatus == "run" and (ClientStatus == "pending" or ClientStatus == "running" or ClientStatus == "unknown")'
)
"""Allocations Nomad's own scheduler counts against a node (one being stopped already frees its resources there)."""


class NomadRejected(PermanentError):
    """Nomad refused the request (bad job, bad parameter)."""


class NomadNotFound(PermanentError):
    pass


class JobExists(PermanentError):
    """A create-only registration found the job already there: a re-delivered submission."""


class NomadClient:
    def __init__(self, settings: NomadSettings, *, timeout: float = 10.0) -> None:
        headers = {"X-Nomad-Token": settings.token} if settings.token else {}
        self.settings = settings
        self._http = httpx.AsyncClient(
            base_url=settings.addr,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        params = {"namespace": self.settings.namespace, **kwargs.pop("params", {})}
        try:
            response = await self._http.request(method, path, params=params, **kwargs)
        except httpx.TransportError as exc:
            raise TransientError(f"Nomad at {self.settings.addr} is unreachable: {exc}") from exc
        if response.status_code >= 500:
            text = response.text.strip()
            if "job already exists" in text:
                raise JobExists(text)
            raise TransientError(f"Nomad {method} {path} answered {response.status_code}: {text}")
        if response.status_code == 404:
            raise NomadNotFound(f"{path}: {response.text.strip()}")
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
        try:
            await self._request("DELETE", f"/v1/job/{job_id}", params=params)
        except NomadNotFound:
            pass

    async def job(self, job_id: str) -> Json:
        job: Json = await self._json("GET", f"/v1/job/{job_id}")
        return job

    async def jobs(self, prefix: str) -> list[Json]:
        jobs: list[Json] = await self._json("GET", "/v1/jobs", params={"prefix": prefix, "meta": "true"})
        return jobs

    async def allocations(self, job_prefix: str) -> list[Json]:
        """Allocation stubs of every job whose id starts with ``job_prefix``, in one call."""
        allocs: list[Json] = await self._json(
            "GET", "/v1/allocations", params={"filter": f'JobID matches "^{job_prefix}"', "task_states": "true"}
        )
        return allocs

    async def job_allocations(self, job_id: str) -> list[Json]:
        allocs: list[Json] = await self._json("GET", f"/v1/job/{job_id}/allocations", params={"all": "true"})
        return allocs

    # -- allocations -----------------------------------------------------------------------------

    async def allocation(self, alloc_id: str) -> Json:
        alloc: Json = await self._json("GET", f"/v1/allocation/{alloc_id}")
        return alloc

    async def allocation_stats(self, alloc_id: str) -> Json:
        stats: Json = await self._json("GET", f"/v1/client/allocation/{alloc_id}/stats")
        return stats

    async def restart_allocation(self, alloc_id: str, task: str) -> None:
        await self._request("POST", f"/v1/client/allocation/{alloc_id}/restart", json={"TaskName": task})

    async def live_allocations(self) -> list[Json]:
        """Every allocation that holds resources now, in every namespace and of any job, with its allocated
        resources and without task states: one call, whatever the cluster runs (the scheduler's occupancy)."""
        params = {"namespace": "*", "resources": "true", "task_states": "false", "filter": LIVE_ALLOCATIONS}
        allocs: list[Json] = await self._json("GET", "/v1/allocations", params=params)
        return allocs

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

    # -- nodes and agent -------------------------------------------------------------------------

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
        params = [("index", str(index)), ("namespace", self.settings.namespace)]
        params += [("topic", t) for t in topics]
        try:
            async with self._http.stream(
                "GET", "/v1/event/stream", params=params, timeout=httpx.Timeout(10.0, read=60.0)
            ) as response:
                if response.status_code != 200:
                    raise TransientError(f"event stream answered {response.status_code}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    batch = json.loads(line)
                    if batch:
                        yield batch
        except httpx.TransportError as exc:
            raise TransientError(f"event stream broken: {exc}") from exc
