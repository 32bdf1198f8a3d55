"""An app's preferred host port ("try preferred port") on real Nomad, scheduler and gateway: granted when no allocation
holds it on the node, another port when one does (and the session says so), bad input refused with a typed error."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from domain.apps import PREFERRED_PORTS
from nomad_jobs.agents import host_ports_in_use
from tests.harness import CREATE, Caravan, GraphQLErrors

APP_PORT = 8080
SERVE = (
    'mkdir -p /tmp/w && echo "served by $WHO" > /tmp/w/index.html && '
    f'exec httpd -f -p "${{NOMAD_PORT_p{APP_PORT}}}" -h /tmp/w'
)
"""The kernel serves a page naming its session on the app's port."""
APPS = "query($id: ID!) { session(id: $id) { apps { name port preferredPort preferredPortTaken hostPort } } }"


def serving(name: str, preferred: int | None, **extra: Any) -> dict[str, Any]:
    app = {"name": "db", "port": APP_PORT, "protocol": "TCP", "preferredPort": preferred}
    return {
        "name": name, "type": "INTERACTIVE", "driver": "EXEC", "startupCommand": SERVE, "apps": [app],
        "environ": [{"name": "WHO", "value": name}],
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}], **extra,
    }  # fmt: skip


async def started(caravan: Caravan, fields: dict[str, Any]) -> dict[str, Any]:
    """The session created with ``fields``, RUNNING, its one app as the API shows it once Nomad published it."""
    session_id = (await caravan.gql(CREATE, {"input": fields}))["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING", timeout=90)
    [app] = (await caravan.gql(APPS, {"id": session_id}))["session"]["apps"]
    return dict(app)


async def page(caravan: Caravan, port: int) -> str:
    for _ in range(100):
        try:
            return (await caravan.http.get(f"http://127.0.0.1:{port}/", timeout=2)).text
        except Exception:  # not listening yet
            await asyncio.sleep(0.2)
    raise AssertionError(f"nothing answered on host port {port}")


async def free_preferred_port(caravan: Caravan) -> int:
    """A port of the preferred range no live allocation holds (Nomad's own view, as the scheduler's)."""
    held = set().union(*host_ports_in_use(await caravan.nomad.live_allocations()).values())
    while (port := random.randrange(PREFERRED_PORTS.start + 4000, PREFERRED_PORTS.stop)) in held:
        pass
    return port


async def test_a_free_preferred_port_is_used_and_a_taken_one_falls_back_and_says_so(caravan: Caravan) -> None:
    wanted = await free_preferred_port(caravan)
    first = await started(caravan, serving("first", wanted))
    assert first == {"name": "db", "port": APP_PORT, "preferredPort": wanted, "preferredPortTaken": False,
                     "hostPort": wanted}  # fmt: skip
    assert "served by first" in await page(caravan, wanted)

    second = await started(caravan, serving("second", wanted))  # the same node: the port is the first's
    assert second["preferredPort"] == wanted and second["preferredPortTaken"] is True
    assert second["hostPort"] not in (None, wanted)
    assert "served by second" in await page(caravan, second["hostPort"])
    assert "served by first" in await page(caravan, wanted)  # the first keeps its own


@pytest.mark.parametrize(
    ("apps", "field"),
    [
        ([{"name": "db", "port": 8080, "preferredPort": 80}], "apps[0].preferredPort"),
        ([{"name": "db", "port": 8080, "preferredPort": 65000}], "apps[0].preferredPort"),
        (
            [{"name": "a", "port": 8080, "preferredPort": 25000}, {"name": "b", "port": 8081, "preferredPort": 25000}],
            "apps[1].preferredPort",
        ),
    ],
)
async def test_a_preferred_port_outside_the_range_or_twice_is_refused(
    caravan: Caravan, apps: list[dict[str, Any]], field: str
) -> None:
    fields = {"name": "refused", "type": "INTERACTIVE", "driver": "EXEC", "apps": apps}
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(CREATE, {"input": fields})
    assert refused.value.codes == ["INVALID_INPUT"]
    assert refused.value.errors[0]["extensions"]["field"] == field
    live = await caravan.store.get_many(sorted(await caravan.store.live_ids()))
    assert all(s is None or s.name != "refused" for s in live)  # nothing half-created


async def test_an_inference_endpoint_cannot_ask_for_a_preferred_port(caravan: Caravan) -> None:
    fields = {
        "name": "replicas", "type": "INFERENCE", "driver": "EXEC", "startupCommand": "sleep 60", "servicePort": 8080,
        "apps": [{"name": "web", "port": 8080, "preferredPort": 25001}],
    }  # fmt: skip
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(CREATE, {"input": fields})
    assert refused.value.codes == ["INVALID_INPUT"]
    assert refused.value.errors[0]["extensions"]["field"] == "apps"
