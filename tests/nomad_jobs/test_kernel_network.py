"""Where kernels' traffic goes, as rendered into the job (pure; read back with python-hcl2). The e2e tests in
tests/e2e/test_isolation.py run these jobs on Nomad with the session network and try to get out of them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import hcl2
import pytest

from domain.model import Driver, Kernel, Session, SessionType
from nomad_jobs.kernel_network import PEERS_FILE, peers_service_name
from nomad_jobs.session_job import JobContext, render_session_job
from tests.nomad_jobs.test_session_job_inference import plain, task


def cluster(
    driver: Driver = Driver.DOCKER, size: int = 2, type: SessionType = SessionType.BATCH, ports: tuple[int, ...] = ()
) -> Session:
    kernels = tuple(
        Kernel(
            role="main" if i == 1 else "sub",
            index=i,
            hostname="main1" if i == 1 else f"sub{i - 1}",
            image="img:1",
            resources={"cpu": "1", "mem": "268435456"},
        )
        for i in range(1, size + 1)
    )
    return Session(
        id="0b9e3c4a-1111-4222-8333-944445555666",
        name="c",
        owner_id="u",
        type=type,
        driver=driver,
        image="img:1",
        resources=kernels[0].resources,
        kernels=kernels,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        startup_command="run",
        preopen_ports=ports,
    )


def groups(session: Session, network_mode: str = "cni/caravan") -> dict[str, dict[str, Any]]:
    rendered = render_session_job(session, JobContext(job_prefix="cv", network_mode=network_mode)).hcl
    [job] = plain(hcl2.loads(rendered))["job"][0].values()
    return {name: body for g in job["group"] for name, body in g.items()}


def config(group: dict[str, Any]) -> dict[str, Any]:
    return task(group)["config"][0]  # type: ignore[no-any-return]


def test_docker_cluster_kernels_get_a_namespace_their_hostname_and_their_peers() -> None:
    found = groups(cluster(Driver.DOCKER, size=3, ports=(8080,)))
    assert list(found) == ["main1", "sub1", "sub2"]
    for hostname, group in found.items():
        assert group["network"] == [{"mode": "cni/caravan", "hostname": hostname, "port": [{"p8080": {"to": 8080}}]}]
        assert group["service"] == [
            {
                "provider": "nomad",
                "name": "caravan-peers-0b9e3c4a-1111-4222-8333-944445555666",
                "tags": [hostname],
                "address_mode": "alloc",
            }
        ]
        [template] = task(group)["template"]
        assert template["destination"] == "local/caravan-peers" and template["change_mode"] == "noop"
        assert 'nomadService "caravan-peers-0b9e3c4a-1111-4222-8333-944445555666"' in template["data"].replace(
            "\\u0022", '"'
        )
        env = task(group)["env"][0]
        assert env["CARAVAN_CLUSTER_PEERS"] == PEERS_FILE and "CARAVAN_CLUSTER_ADDR" not in env
        assert not {"network_mode", "extra_hosts", "hostname"} & set(config(group))


def test_exec_kernels_cannot_name_their_namespace() -> None:
    group = groups(cluster(Driver.EXEC))["main1"]
    assert group["network"] == [{"mode": "cni/caravan"}]  # Nomad refuses a hostname for exec
    assert "service" in group


@pytest.mark.parametrize("driver", [Driver.DOCKER, Driver.EXEC])
def test_a_single_kernel_has_no_peers_to_find(driver: Driver) -> None:
    group = groups(cluster(driver, size=1))["main1"]
    assert "service" not in group and "template" not in task(group)
    assert not {"CARAVAN_CLUSTER_PEERS", "CARAVAN_CLUSTER_ADDR"} & set(task(group)["env"][0])


def test_inference_replicas_serve_alone() -> None:
    session = cluster(Driver.EXEC, size=2, type=SessionType.INFERENCE)
    assert all("template" not in task(g) for g in groups(session).values())
    assert peers_service_name(session) != "caravan-0b9e3c4a-1111-4222-8333-944445555666"


def test_raw_exec_and_the_host_mode_use_the_hosts_network_with_loopback_addresses() -> None:
    raw = groups(cluster(Driver.RAW_EXEC, ports=(8080,)))["main1"]
    assert raw["network"] == [{"port": [{"p8080": {}}]}]  # a dynamic host port the kernel listens on itself
    assert task(raw)["env"][0]["CARAVAN_CLUSTER_ADDR"].startswith("127.")
    docker = groups(cluster(Driver.DOCKER), network_mode="host")
    assert "network" not in docker["main1"]
    assert config(docker["sub1"])["network_mode"] == "host"
    assert config(docker["sub1"])["extra_hosts"] == [
        f"{h}:{task(g)['env'][0]['CARAVAN_CLUSTER_ADDR']}" for h, g in docker.items()
    ]


def test_vms_have_no_network_block() -> None:
    session = cluster(Driver.QEMU, ports=())
    assert all("network" not in g for g in groups(session).values())


@pytest.mark.parametrize("driver", [Driver.DOCKER, Driver.EXEC, Driver.RAW_EXEC])
def test_only_the_subs_of_a_batch_cluster_wait_for_main1(driver: Driver) -> None:
    batch = groups(cluster(driver, size=3))
    assert {h: task(g)["env"][0].get("CARAVAN_WAIT_FOR_MAIN") for h, g in batch.items()} == {
        "main1": None,
        "sub1": "1",
        "sub2": "1",
    }
    interactive = groups(cluster(driver, size=2, type=SessionType.INTERACTIVE))
    single = groups(cluster(driver, size=1))
    assert all("CARAVAN_WAIT_FOR_MAIN" not in task(g)["env"][0] for g in [*interactive.values(), *single.values()])
