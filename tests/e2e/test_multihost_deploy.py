"""``caravan deploy`` on the multi-host test cluster (``tests/multihost_fixtures.py``: three Nomad servers, two hosts,
each a network namespace with its own Nomad client): HAProxy pinned to one host binds that host's address on the
hosts' link (Nomad's ``${NOMAD_IP_health}``: not 127.0.0.1, which is the host's own loopback there) and answers
the machine at it; its gateway backend holds a gateway on the other host, which serves requests through it; a
rolling upgrade of the gateways (one on each host) under a steady stream of requests through it fails none; and the
namespace keepers (a system job) fill each host's pool, a docker session placed on each host runs in one of that
host's pooled namespaces, and the deployment's end leaves no pause container on either.

The deployed jobs reach Redis on the machine's end of the link (a Redis of the test's own, 172.26.255.1, its users'
passwords as every test Redis's): the tests' Redis listens on the machine's loopback, which no host reaches."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from caravan.deploy import Replicas
from caravan.stack.multihost import ROOT_ADDRESS, MultiHostCluster, host_address
from caravan.stack.processes import free_port
from caravan.stack.redis_server import start_redis
from core.settings import Settings
from tests.cluster_fixtures import on_the_cluster
from tests.conftest import STACK, TEST_KEY_PREFIXES
from tests.deployed import Deployed, config_for, deployed, free_namespaces, logs, pause_containers
from tests.e2e.test_deploy import CREATE, DESTROY, JOB_HCL, STATUS, SteadyStream, until, upgraded_gateways
from tests.e2e.test_namespace_pool import pooled_in
from tests.harness import ADMIN_TOKEN
from tests.multihost_fixtures import HOSTS

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

VIEWER = {"query": "{ viewer { id } }"}
SMALL = [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}]
"""A docker session's resources: it fits beside the deployed jobs on either host (2 GiB each)."""


@pytest.fixture
def linked_redis(settings: Settings, tmp_path: Path) -> Iterator[str]:
    """A Redis the hosts reach: on the machine's end of their link (and its loopback), the tests' users."""
    port = free_port()
    service = start_redis(
        tmp_path / "redis",
        port,
        log=tmp_path / "redis.log",
        secrets_dir=settings.secrets,
        key_prefixes=TEST_KEY_PREFIXES,
        extra_args=("--bind", "127.0.0.1", ROOT_ADDRESS),
    )
    try:
        yield f"redis://{ROOT_ADDRESS}:{port}/0"
    finally:
        service.stop()


def served_by(stack: Deployed) -> dict[str, int]:
    """Requests each gateway replica answered through HAProxy (by its address), from its runtime API."""
    names = {}
    for line in stack.runtime("show servers state gateway").splitlines():
        fields = line.split()
        if len(fields) > 18 and fields[1] == "gateway":
            names[fields[3]] = fields[4]
    rows = csv.DictReader(io.StringIO(stack.runtime("show stat").lstrip("# ")))
    counts: dict[str, int] = {}
    for row in rows:
        if row["pxname"] == "gateway" and row["svname"] in names:
            address = names[row["svname"]]
            counts[address] = counts.get(address, 0) + int(row["hrsp_2xx"] or 0)
    return counts


def test_the_deployed_ingress_answers_through_a_gateway_on_another_host_and_a_rolling_upgrade_fails_no_request(
    settings: Settings,
    multihost_cluster: MultiHostCluster,
    linked_redis: str,
) -> None:
    clustered = on_the_cluster(settings, multihost_cluster)
    clustered = dataclasses.replace(clustered, redis=dataclasses.replace(clustered.redis, url=linked_redis))
    edge, other = HOSTS[0].name, HOSTS[1].name
    pool = {"CARAVAN_NAMESPACE_POOL": "1", "CARAVAN_PAUSE_IMAGE": STACK["CARAVAN_PAUSE_IMAGE"]}
    config = config_for(
        clustered,
        {"CARAVAN_GRAPHQL_RATE_LIMIT": "1000000", **pool},
        ingress_node=edge,
        distinct_hosts=True,  # the two gateways on two hosts
        scheduler=Replicas(1),
        idle=Replicas(1),
        memory_mb=384,  # the five jobs fit a host of 2 GiB however Nomad packs them (512: not with the keeper)
    )
    with deployed(clustered, config) as stack:
        url = f"http://{host_address(0)}:{config.ingress.port}/graphql"
        answer = httpx2.post(url, json=VIEWER, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        assert answer.json() == {"data": {"viewer": {"id": "admin"}}}, answer.text
        replicas = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 60, "two gateways")
        assert {address for address, _ in replicas} == {host_address(0), host_address(1)}, (edge, other, replicas)
        until(lambda: stack.backend() == replicas, 60, f"HAProxy's backend to list {replicas}")
        with httpx2.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10) as http:
            for _ in range(20):
                assert http.post(url, json=VIEWER).json() == {"data": {"viewer": {"id": "admin"}}}
        counts = served_by(stack)
        print(f"deployed on two hosts: requests each gateway answered through HAProxy: {counts}")
        assert counts.get(host_address(1), 0) > 0, counts
        # a new release of the gateway job replaces the replica on each host, one at a time, under a steady stream of
        # requests through HAProxy at its host's address: none fails
        with SteadyStream(url) as stream:
            after = upgraded_gateways(stack, replicas, "2")
        print(f"rolling upgrade across two hosts: {stream.sent} requests, {len(stream.failures)} failed")
        assert {address for address, _ in after} == {host_address(0), host_address(1)}, after
        assert stream.sent > 0
        assert stream.failures == []
        pooled_sessions_on_each_host(dataclasses.replace(stack, url=url), clustered, multihost_cluster)
    nodes = [multihost_cluster.node_ids[host.name] for host in HOSTS]
    until(lambda: not any(pause_containers(node) for node in nodes), 60, "no pause container left on either host")


def pooled_sessions_on_each_host(stack: Deployed, settings: Settings, cluster: MultiHostCluster) -> None:
    """Each host's keeper (the system job's allocation there) fills that host's pool; a docker session designated to
    each host runs in a namespace of that host's pool; once it ends, its namespace is deleted. (Before, ``caravan
    deploy`` started no keeper: the pools stayed empty.)"""
    nodes = [cluster.node_ids[host.name] for host in HOSTS]
    try:
        pools = {
            node: until(lambda node=node: f if len(f := free_namespaces(settings, node)) == 1 else None, 90, "a pool")
            for node in nodes
        }
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n{logs(stack.settings, stack.config)}") from None
    print(f"deployed keepers' pools: {pools}")
    sessions = {}
    for index, node in enumerate(nodes):
        fields = {
            "name": f"pooled{index}",
            "type": "INTERACTIVE",
            "driver": "DOCKER",
            "designatedAgent": node,
            "resources": SMALL,
        }
        sessions[node] = stack.gql(CREATE, {"input": fields})["createSession"]["sessions"][0]["id"]
    for node, session_id in sessions.items():
        until(lambda s=session_id: stack.gql(STATUS, {"id": s})["session"]["status"] == "RUNNING", 120, "RUNNING")
        claimed = pooled_in(stack.gql(JOB_HCL, {"id": session_id})["session"]["jobHcl"] or "")
        assert claimed is not None and claimed in pools[node], (node, claimed, pools)
        stack.gql(DESTROY, {"id": session_id})
        until(lambda c=claimed, n=node: c not in pause_containers(n), 60, "the session's namespace deleted")
