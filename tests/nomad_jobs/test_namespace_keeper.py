"""The namespace keeper's decisions (pure) and a pooled kernel's job (read back with python-hcl2). The real pool, its
binding and cleanup run in tests/e2e/test_namespace_pool.py; its isolation in tests/e2e/test_isolation.py."""

from __future__ import annotations

from typing import Any

import hcl2

from domain.model import Driver, SessionType
from nomad_jobs.kernel_network import poolable
from nomad_jobs.namespace_keeper import UNCLAIMED_GRACE, Plan, named_namespace, plan, port_mappings, ports_of
from nomad_jobs.session_job import JobContext, render_session_job
from tests.nomad_jobs.test_kernel_network import cluster
from tests.nomad_jobs.test_session_job_inference import plain

A, B, C, D = (f"caravan-pool-{c * 12}" for c in "abcd")


def alloc(name: str, status: str = "running", job: str = "cv-s1") -> dict[str, Any]:
    task = {"Name": "kernel", "Driver": "docker", "Config": {"network_mode": f"container:{name}"}}
    return {
        "ID": f"alloc-{name}-{status}",
        "JobID": job,
        "Namespace": "default",
        "TaskGroup": "main1",
        "ClientStatus": status,
        "Job": {"TaskGroups": [{"Name": "main1", "Tasks": [task]}]},
        "AllocatedResources": {
            "Shared": {"Ports": [{"Label": "p8888", "Value": 23456, "To": 8888, "HostIP": "127.0.0.1"}]}
        },
    }


def test_a_named_namespace_is_bound_once_and_retired_when_its_allocations_end() -> None:
    ours = {A: 0.0, B: 0.0, C: 0.0, D: 0.0}
    allocs = [alloc(A), alloc(B, "complete"), alloc(D, "pending", "cv-s2")]
    ports = ports_of(alloc(D))
    decided = plan(ours, bound={B: ports, C: ports, D: ports}, free=[], allocs=allocs, now=1.0)
    assert set(decided.bind) == {A}  # D is bound already, with its allocation's ports
    assert decided.retire == {B: ("default", "cv-s1")}  # its allocation ended: deleted once its job is over
    assert decided.delete == [C]  # bound, and no allocation names it any more
    assert named_namespace(alloc(A)) == A
    assert port_mappings(alloc(A)) == [
        {"hostIP": "127.0.0.1", "hostPort": 23456, "containerPort": 8888, "protocol": p} for p in ("tcp", "udp")
    ]


def test_a_namespace_named_by_two_sessions_is_bound_to_neither() -> None:
    allocs = [alloc(A, job="cv-s1"), alloc(A, "pending", job="cv-s2")]
    assert plan({A: 0.0}, bound={}, free=[], allocs=allocs, now=1.0) == Plan()


def test_a_claimed_namespace_never_named_is_deleted_after_the_grace_only() -> None:
    ours = {A: 0.0, B: 0.0}
    assert plan(ours, bound={}, free=[B], allocs=[], now=UNCLAIMED_GRACE - 1).delete == []
    assert plan(ours, bound={}, free=[B], allocs=[], now=UNCLAIMED_GRACE + 1).delete == [A]
    assert plan(ours, bound={}, free=[], allocs=[alloc(A, "failed")], now=1.0).retire == {A: ("default", "cv-s1")}


def test_a_replacement_allocation_with_other_ports_is_bound_again() -> None:
    """A session's allocation replaced on its node (an ``alloc stop``, a batch kernel placed again) names the same
    namespace with other host ports: bound again, so they are published (before, only the first allocation's were, and
    the session's apps answered nothing after the replacement)."""
    replaced = alloc(A)
    replaced["AllocatedResources"]["Shared"]["Ports"][0]["Value"] = 24001
    first = ports_of(alloc(A))
    assert ports_of(replaced) == {("tcp", 24001, 8888), ("udp", 24001, 8888)}
    decided = plan({A: 0.0}, bound={A: first}, free=[], allocs=[alloc(A, "complete"), replaced], now=1.0)
    assert decided.bind == {A: replaced} and decided.retire == {}
    replaced["CreateIndex"] = 20
    for beside in ([alloc(A), replaced], [replaced, alloc(A)]):  # the one it replaces still running: the newest wins
        assert plan({A: 0.0}, bound={A: first}, free=[], allocs=beside, now=1.0).bind == {A: replaced}
    assert plan({A: 0.0}, bound={A: first}, free=[], allocs=[alloc(A)], now=1.0) == Plan()


def test_a_port_the_plugin_skips_does_not_bind_the_namespace_again_at_every_look() -> None:
    """An IPv6 host address: the isolation plugin publishes the kernel's other ports and skips it (the session network
    is IPv4), so the bound record never holds it; counted as missing, every event on the node bound the namespace
    again (its ports unpublished and published anew each time)."""
    dual = alloc(A)
    ipv6 = {"Label": "p9999", "Value": 23457, "To": 9999, "HostIP": "::1"}
    dual["AllocatedResources"]["Shared"]["Ports"].append(ipv6)
    assert ports_of(dual) == ports_of(alloc(A)) == {("tcp", 23456, 8888), ("udp", 23456, 8888)}
    assert plan({A: 0.0}, bound={A: ports_of(alloc(A))}, free=[], allocs=[dual], now=1.0) == Plan()
    refused = alloc(A)
    refused["AllocatedResources"]["Shared"]["Ports"][0]["HostIP"] = "not-an-address"  # the bind will fail, saying why
    assert ports_of(refused) == {("tcp", 23456, 8888), ("udp", 23456, 8888)}


def test_a_pooled_kernel_joins_its_namespace_on_the_hosts_network_with_its_ports() -> None:
    session = cluster(size=1, type=SessionType.INTERACTIVE, ports=(8888,))
    assert poolable(session, "cni/caravan")
    rendered = render_session_job(session, JobContext(job_prefix="cv", pooled_namespace=A)).hcl
    [job] = plain(hcl2.loads(rendered))["job"][0].values()
    [group] = job["group"][0].values()
    assert group["network"] == [{"port": [{"p8888": {"to": 8888}}]}]  # no mode (the host's), no hostname
    [task] = group["task"][0].values()
    assert task["config"][0]["network_mode"] == f"container:{A}"
    assert "hostname" not in task["config"][0]


def test_only_single_kernel_isolated_docker_interactive_or_batch_sessions_are_pooled() -> None:
    assert poolable(cluster(size=1), "cni/caravan")
    assert not poolable(cluster(size=2), "cni/caravan")
    assert not poolable(cluster(size=1), "host")
    assert not poolable(cluster(Driver.EXEC, size=1), "cni/caravan")
    assert not poolable(cluster(size=1, type=SessionType.INFERENCE), "cni/caravan")
