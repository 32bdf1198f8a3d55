"""``caravan deploy``'s job specs, rendered without a Nomad: no secret in them (each comes from a Nomad Variable
through a template), and configurations that would leak one or break the jobs are refused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from caravan.deploy import DeployConfig, DeployError, IngressSpec, Replicas, check, show, variables
from caravan.stack.haproxy import ingress_config
from core.secrets import nomad_token_path, redis_password_path, redis_sentinel_client_path, write_secret
from core.settings import Settings, load_settings
from gateway.apps.ingress_config import IngressPaths, render

PAUSE = "caravan/pause:1.35.0-4-deb12u1-b1"


@pytest.fixture
def operator(tmp_path: Path) -> Settings:
    """An operator's secrets directory holding every credential the jobs need."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    for role in ("gateway", "scheduler", "idle", "admin"):
        write_secret(nomad_token_path(secrets, role), f"nomad-token-of-{role}-0123456789")
        write_secret(redis_password_path(secrets, role), f"redis-password-of-{role}-0123456789")
    write_secret(redis_sentinel_client_path(secrets), "sentinel-client-password-0123456789")
    return Settings(home=tmp_path / "home", secrets_dir=secrets)


def test_rendered_specs_hold_no_secret(operator: Settings) -> None:
    config = DeployConfig(env={"CARAVAN_REDIS_URL": "redis://10.0.0.5:6379/0", "CARAVAN_PAUSE_IMAGE": PAUSE})
    secrets = variables(config, operator)
    rendered = show(config, operator)
    values = {value for items in secrets.values() for value in items.values()}
    assert len(values) >= 9  # 3 roles' tokens and passwords, the sentinel's, the cookie key, the admin token
    for value in values:
        assert value not in rendered
    specs = json.loads(rendered)
    gateway = specs["gateway"]["Job"]["TaskGroups"][0]
    templates = gateway["Tasks"][0]["Templates"]
    assert {t["DestPath"] for t in templates} >= {
        "secrets/nomad-gateway.token", "secrets/redis-gateway.password", "secrets/app-cookie.key", "secrets/admin.env"
    }  # fmt: skip
    assert all('nomadVar "nomad/jobs/caravan-gateway"' in t["EmbeddedTmpl"] for t in templates)
    assert gateway["Count"] == 2 and specs["scheduler"]["Job"]["TaskGroups"][0]["Count"] == 2
    assert gateway["Services"][0]["Checks"][0]["Path"] == "/healthz"
    assert specs["gateway"]["Job"]["Update"]["MaxParallel"] == 1
    # the ingress' backend follows the gateway's service
    ingress = specs["ingress"]["Job"]["TaskGroups"][0]["Tasks"][0]
    assert any('nomadService "caravan-gateway"' in t["EmbeddedTmpl"] for t in ingress["Templates"])
    # the keepers run with the scheduler's credentials, from their own Variable
    [keeper] = specs["namespace-keeper"]["Job"]["TaskGroups"][0]["Tasks"]
    assert {t["DestPath"] for t in keeper["Templates"]} == {
        "secrets/nomad-scheduler.token", "secrets/redis-scheduler.password", "secrets/redis-sentinel-client.password"
    }  # fmt: skip
    assert all('nomadVar "nomad/jobs/caravan-namespace-keeper"' in t["EmbeddedTmpl"] for t in keeper["Templates"])


def test_the_namespace_keepers_are_a_system_job_on_every_client_with_docker_and_a_session_network(
    operator: Settings,
) -> None:
    """One keeper per client that can keep a pool (the docker driver, a session network advertised in its meta), in
    every node pool, told its node and that network's directory by Nomad; its kill timeout leaves it the time to
    delete its free namespaces; no keeper job with a pool of 0, nor without a pause image."""
    config = DeployConfig(env={"CARAVAN_PAUSE_IMAGE": PAUSE, "CARAVAN_NAMESPACE_POOL": "4"}, distinct_hosts=True)
    job = json.loads(show(config, operator))["namespace-keeper"]["Job"]
    assert (job["ID"], job["Type"], job["NodePool"], job["Namespace"]) == (
        "caravan-namespace-keeper", "system", "all", "caravan-system"
    )  # fmt: skip
    assert job["Constraints"] == [
        {"LTarget": "${attr.driver.docker}", "Operand": "=", "RTarget": "1"},
        {"LTarget": "${meta.caravan_session_network}", "Operand": "is_set"},
    ]
    [group] = job["TaskGroups"]
    assert "ReschedulePolicy" not in group
    [task] = group["Tasks"]
    assert (task["Driver"], task["Config"]["args"]) == ("raw_exec", ["-m", "caravan.cli", "namespace-keeper"])
    assert task["Env"]["CARAVAN_NODE_ID"] == "${node.unique.id}"
    assert task["Env"]["CARAVAN_SESSION_NETWORK_DIR"] == "${meta.caravan_session_network}"
    assert (task["Env"]["CARAVAN_NAMESPACE_POOL"], task["Env"]["CARAVAN_PAUSE_IMAGE"]) == ("4", PAUSE)
    assert task["KillSignal"] == "SIGTERM" and task["KillTimeout"] == 18 * 1_000_000_000  # 10 s + 2 s a namespace
    for env in ({"CARAVAN_PAUSE_IMAGE": PAUSE, "CARAVAN_NAMESPACE_POOL": "0"}, {}):
        assert "namespace-keeper" not in json.loads(show(DeployConfig(env=env), operator)), env


def test_the_ingress_keeps_the_maps_on_its_node_and_the_gateways_go_anywhere(operator: Settings) -> None:
    """HAProxy's control planes run in the ingress job (``--keep-maps``, with the gateway's Redis credentials and
    no Nomad token), so only the ingress is pinned; the gateways keep no maps and spread like the others."""
    specs = json.loads(show(DeployConfig(ingress_node="edge-1", distinct_hosts=True), operator))
    pinned = [{"LTarget": "${node.unique.name}", "Operand": "=", "RTarget": "edge-1"}]
    assert specs["ingress"]["Job"]["Constraints"] == pinned
    spread = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    for job in ("gateway", "scheduler", "idle"):
        assert specs[job]["Job"]["Constraints"] == spread, job
    [ingress] = specs["ingress"]["Job"]["TaskGroups"][0]["Tasks"]
    assert "--keep-maps" in ingress["Config"]["args"]
    assert {t["DestPath"] for t in ingress["Templates"]} >= {"secrets/redis-gateway.password", "secrets/app-cookie.key"}
    assert not any("nomad-gateway.token" in t["DestPath"] for t in ingress["Templates"])
    [gateway] = specs["gateway"]["Job"]["TaskGroups"][0]["Tasks"]
    assert gateway["Env"]["CARAVAN_GATEWAY_KEEPS_MAPS"] == "0" and "CARAVAN_INGRESS_DIR" not in gateway["Env"]


def test_the_deployed_ingress_binds_its_clients_address_and_one_machine_loopback(
    operator: Settings, tmp_path: Path
) -> None:
    """Deployed, HAProxy's public and health ports bind the address of the ingress' client (Nomad's, where it checks
    the health port and where clients reach it) or the configured one; on one machine (``./ops/dev``, the tests),
    127.0.0.1."""

    def bind(config: DeployConfig) -> str:
        [task] = json.loads(show(config, operator))["ingress"]["Job"]["TaskGroups"][0]["Tasks"]
        return str(task["Env"]["CARAVAN_INGRESS_BIND"])

    assert bind(DeployConfig()) == "${NOMAD_IP_health}"
    assert bind(DeployConfig(ingress=IngressSpec(bind="172.26.255.11"))) == "172.26.255.11"

    def rendered(env: dict[str, str]) -> str:
        settings = load_settings({"CARAVAN_HOME": str(tmp_path), **env})
        paths = IngressPaths(tmp_path)
        return render(
            dataclasses.replace(ingress_config(settings, 8420, 0), health_port=8421), paths, paths.own_socket("a")
        )

    assert "bind 127.0.0.1:8420" in rendered({}) and "bind 127.0.0.1:8421" in rendered({})
    deployed = rendered({"CARAVAN_INGRESS_BIND": "172.26.255.11"})
    assert "bind 172.26.255.11:8420" in deployed and "bind 172.26.255.11:8421" in deployed
    assert "127.0.0.1:842" not in deployed
    with pytest.raises(ValueError, match="CARAVAN_INGRESS_BIND"):
        load_settings({"CARAVAN_HOME": str(tmp_path), "CARAVAN_INGRESS_BIND": "edge-1"})


@pytest.mark.parametrize(
    ("config", "names"),
    [
        (DeployConfig(env={"CARAVAN_NOMAD_TOKEN": "x"}), "CARAVAN_NOMAD_TOKEN"),
        (DeployConfig(env={"CARAVAN_REDIS_URL": "redis://u:pw@h:1/0"}), "password"),
        (DeployConfig(env={"CARAVAN_HOME": "/x"}), "CARAVAN_HOME"),
        (DeployConfig(env={"PATH": "/x"}), "CARAVAN_"),
        (DeployConfig(env={"CARAVAN_DEFAULT_IMAGE": "${attr.x}"}), "interpolation"),
        (DeployConfig(home="/var/{{ env }}"), "template"),
        (DeployConfig(ingress_node="${node.class}"), "interpolation"),
        (DeployConfig(name="Bad Name"), "name"),
        (DeployConfig(namespace="default"), "namespace"),
        (DeployConfig(gateway=Replicas(4), ingress=IngressSpec(gateway_slots=4)), "gateway_slots"),
        (DeployConfig(scheduler=Replicas(0)), "scheduler.count"),
        (DeployConfig(python="python3"), "absolute"),
        (DeployConfig(ingress=IngressSpec(bind="edge-1")), "ingress.bind"),
        (DeployConfig(env={"CARAVAN_INGRESS_BIND": "0.0.0.0"}), "CARAVAN_INGRESS_BIND"),
        (DeployConfig(env={"CARAVAN_NODE_ID": "n1"}), "CARAVAN_NODE_ID"),
        (DeployConfig(env={"CARAVAN_SESSION_NETWORK_DIR": "/x"}), "CARAVAN_SESSION_NETWORK_DIR"),
        (DeployConfig(env={"CARAVAN_NAMESPACE_POOL": "2"}), "CARAVAN_PAUSE_IMAGE"),
        (DeployConfig(env={"CARAVAN_NAMESPACE_POOL": "two", "CARAVAN_PAUSE_IMAGE": PAUSE}), "not a number"),
        (DeployConfig(env={"CARAVAN_NAMESPACE_POOL": "11", "CARAVAN_PAUSE_IMAGE": PAUSE}), "between 0 and 10"),
        (DeployConfig(env={"CARAVAN_PAUSE_IMAGE": "--privileged"}), "image reference"),
        (DeployConfig(memory_mb=32), "memory_mb"),
    ],
)
def test_refused_configurations(config: DeployConfig, names: str) -> None:
    with pytest.raises(DeployError, match=names):
        check(config)


def test_cli_refuses_a_bad_file_with_status_2(tmp_path: Path) -> None:
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps({"gateway": {"count": 2}, "unknown": 1}))
    done = subprocess.run(
        [sys.executable, "-m", "caravan.cli", "deploy", "--config", str(path), "--render"],
        capture_output=True, text=True, env={"CARAVAN_HOME": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown" in done.stderr
