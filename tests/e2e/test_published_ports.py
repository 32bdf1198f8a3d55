"""A kernel's published port on the session network, on real Nomad, CNI and nftables: the isolation plugin's own DNAT
(its ``ip caravan_isolation`` maps, in place of CNI's portmap) leads the Nomad host port to the kernel's port while the
kernel runs, and is gone with the kernel (no element left behind for a later kernel given the same host port)."""

from __future__ import annotations

import asyncio
import subprocess

from node_plugins.cni_isolation import TABLE
from tests.e2e.test_preferred_port import APPS, page, serving
from tests.harness import CREATE, Caravan

DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }"


def published_elements() -> str:
    """The published-port maps as nft lists them (empty when the table is not there)."""
    listed = [
        subprocess.run(["nft", "list", "map", "ip", TABLE, name], capture_output=True, text=True).stdout
        for name in ("anyports", "hostports")
    ]
    return "\n".join(listed)


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def test_a_published_port_leads_to_its_kernel_while_it_runs_and_goes_with_it(caravan: Caravan) -> None:
    session_id = (await caravan.gql(CREATE, {"input": serving("ported", None)}))["createSession"]["sessions"][0]["id"]
    await caravan.wait_for(session_id, "RUNNING", timeout=90)
    [app] = (await caravan.gql(APPS, {"id": session_id}))["session"]["apps"]
    port = int(app["hostPort"])
    assert "served by ported" in await page(caravan, port)
    assert f"tcp . {port} : " in published_elements()  # the plugin's DNAT, not an iptables rule of portmap's

    await caravan.gql(DESTROY, {"ids": [session_id]})
    await caravan.wait_for(session_id, "TERMINATED", timeout=90)
    for _ in range(100):  # Nomad runs the CNI DEL as it tears the allocation's network down
        if f"tcp . {port} : " not in published_elements():
            break
        await asyncio.sleep(0.2)
    assert f"tcp . {port} : " not in published_elements()
    assert await refused(port)
