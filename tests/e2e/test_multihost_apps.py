"""Session apps across hosts, on the multi-host test cluster (``tests/multihost_fixtures.py``): a session's app on a
host other than the data plane's answers through the gateway and HAProxy (on the machine, 172.26.255.1 on the hosts'
link), and nothing else reaches its published port.

A kernel's port is published on its host's own address (Nomad's address for the port, 172.26.255.x: not every address
of the host), and from beyond the host only the data plane's addresses reach it (the isolation plugin's
``data_plane`` set): not a Nomad server, not the other host, not a kernel of another session on either host (nor the
kernel's own address). Traffic goes only to the cluster's own addresses in 172.26.0.0/16.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from caravan.stack.multihost import MultiHostCluster, enter
from tests.conftest import DEFAULT_IMAGE
from tests.e2e.test_app_proxy import APP_FIELDS, HELLO, Site
from tests.e2e.test_multihost import nothing_reached
from tests.harness import ADMIN_TOKEN, CREATE
from tests.multihost_fixtures import HOSTS, OnMultihost

WEB = [{"name": "web", "port": 8080}]
SESSION = f"query($id: ID!) {{ session(id: $id) {{ {APP_FIELDS} mainKernel {{ ports }} }} }}"


def curl_from(namespace: str, address: str, port: int) -> int:
    """``curl``'s exit status for the page at ``address:port`` from a namespace of the cluster (0: it answered)."""
    argv = [*enter(namespace), "curl", "-s", "-o", "/dev/null", "-m", "4", f"http://{address}:{port}/"]
    return subprocess.run(argv, capture_output=True).returncode


@pytest.mark.parametrize("driver", ["EXEC", pytest.param("DOCKER", marks=pytest.mark.docker)])
async def test_an_app_on_another_host_answers_through_the_data_plane_and_nothing_else_reaches_its_port(
    on_multihost: OnMultihost,
    multihost_cluster: MultiHostCluster,
    driver: str,
) -> None:
    cluster = multihost_cluster
    near, far = HOSTS[0].name, HOSTS[1].name
    image = {"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}
    async with on_multihost(ingress=True) as caravan:
        created = await caravan.gql(
            CREATE,
            {
                "input": {
                    "name": f"far-app-{driver.lower()}",
                    "type": "INTERACTIVE",
                    "driver": driver,
                    **image,
                    "designatedAgent": cluster.node_ids[far],
                    "startupCommand": HELLO,
                    "apps": WEB,
                }
            },
        )
        session_id = created["createSession"]["sessions"][0]["id"]
        await caravan.wait_for(session_id, "RUNNING", timeout=120)
        shown = (await caravan.gql(SESSION, {"id": session_id}))["session"]
        [published] = shown["mainKernel"]["ports"]
        address, port = published.split("=", 1)[1].rsplit(":", 1)
        assert address == cluster.hosts[far].address, published  # the host's own address on the link
        stored = await caravan.store.get(session_id)
        assert stored is not None
        kernel = (await caravan.nomad.allocation(stored.main_kernel.alloc_id or ""))["NetworkStatus"]["Address"]

        site = Site(caravan, session_id, shown["apps"][0]["url"])
        for _ in range(150):  # httpd starts after the kernel does
            page = await site.get("/", ADMIN_TOKEN)
            if page.status_code == 200:
                break
            await asyncio.sleep(0.2)
        assert (page.status_code, page.text) == (200, "hello\n"), page.text[:200]
        bob = await caravan.user("bob")
        assert (await site.get("/", bob)).status_code == 404

        # nothing else on the hosts' link: a Nomad server, the other host (its processes); the host itself does
        # (Nomad's checks). Another session's kernel on either host: neither the published port nor the kernel's own.
        # All probed at once (one not answered waits out its timeout), the intruder sessions meanwhile.
        sources = ("cvmh-srv1", near, far)
        targets = [("published", address, int(port)), ("kernel", kernel, 8080)]
        *codes, _ = await asyncio.gather(
            *(asyncio.to_thread(curl_from, n, address, int(port)) for n in sources),
            nothing_reached(caravan, cluster, driver, targets),
        )
        for namespace, code in zip(sources[:2], codes[:2], strict=True):
            assert code != 0, f"{namespace} reached {published}"
        assert codes[2] == 0, f"{far} did not reach {published}"
