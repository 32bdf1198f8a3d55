"""A Nomad agent in dev mode (server and client in one) with Caravan's configuration.

ACLs are on (:mod:`caravan.stack.nomad_acl`): the agent is bootstrapped with Caravan's secret and given its policies
and tokens as soon as it has a leader. Readiness is polled: agent health (server and client), then, with the
management token, the node ready and the wanted drivers healthy.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from caravan.stack.device_plugin import DEFAULT_DEVICES, SimDevices, plugin_block, plugin_dir
from caravan.stack.nomad_acl import lock_down
from caravan.stack.processes import Service, StartupFailed, free_port, spawn, unmount_under, wait_until
from caravan.stack.session_network import SessionNetwork, release, session_network

NOMAD_AGENT_CONFIG = """\
bind_addr  = "127.0.0.1"
data_dir   = "{data_dir}"
plugin_dir = "{plugin_dir}"
log_level  = "INFO"
# No call home to checkpoint-api.hashicorp.com: Caravan sends nothing off the machine.
disable_update_check = true
# Without it a non-dev client keeps no allocation stats at all (Nomad's task stats hook is off), and the idle
# checker's utilization check reads nothing: every Nomad client Caravan uses needs it (README, "Pointing Caravan at
# an existing Nomad and Redis").
telemetry {{
  publish_allocation_metrics = true
}}
ports {{
  http = {http}
  rpc  = {rpc}
  serf = {serf}
}}
limits {{
  http_max_conns_per_client = 0
}}
acl {{
  enabled = true
}}
client {{
  network_interface = "lo"
{cgroup_parent}{network_config}{meta}  chroot_env {{
    "{rootfs}" = "/"
  }}
  gc_max_allocs = 2000
  options = {{
    # Cloud metadata probes are useless on loopback and the AWS one fails to start in this build.
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }}
}}
plugin "raw_exec" {{
  config {{
    enabled = {raw_exec}
  }}
}}
{docker_plugin}plugin "qemu" {{
  config {{
    image_paths = {image_paths}
  }}
}}
{device_plugin}"""


DOCKER_PLUGIN = """\
plugin "docker" {{
  config {{
{infra_image}    # No host paths into containers: a job spec (even one registered with a leaked token) cannot
    # bind-mount the host's files; Caravan's own jobs never ask for it.
    volumes {{
      enabled = false
    }}
    gc {{
      image = false
{dangling}    }}
  }}
}}
"""

SHARED_DAEMON = """\
      # Several clients share this machine's Docker daemon: each driver's reconciler would remove, as "dangling",
      # every running Nomad container it does not track itself (the other clients' kernels, once 5 minutes old).
      # Each client removes its own (and a killed test cluster's sweep what its clients left).
      dangling_containers {
        enabled = false
      }
"""


def docker_plugin(pause_image: str | None, *, shared_daemon: bool = False) -> str:
    """The docker driver's block; ``pause_image``: its infra container image (see :func:`write_config`);
    ``shared_daemon``: other Nomad clients use the same Docker daemon (no dangling-container reconciler)."""
    return DOCKER_PLUGIN.format(
        infra_image=f'    infra_image = "{pause_image}"\n' if pause_image else "",
        dangling=SHARED_DAEMON if shared_daemon else "",
    )


CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


@dataclass
class NomadAgent:
    service: Service
    addr: str
    node_id: str
    drivers: dict[str, bool] = field(default_factory=dict)

    data_dir: Path | None = None
    network: SessionNetwork | None = None
    """The client's session network (bridge, subnet, CNI configuration)."""
    token: str | None = None
    """The management token (``nomad-admin.token`` in the secrets directory)."""
    device_dir: Path | None = None
    """The device plugin's state directory (:mod:`node_plugins.devices.sim.state`: health switches, load files)."""

    def stop(self, drain_timeout: float = 20.0) -> None:
        """Purge every job and wait for its tasks to end first: an exec task's executor outlives a stopped agent."""
        if self.service.alive() and self.data_dir:
            with contextlib.suppress(Exception):
                drain(self.addr, self.data_dir, drain_timeout, token=self.token)
        self.service.stop()
        if self.data_dir:
            unmount_under(self.data_dir)
        if self.network:
            release(self.network)


def drain(addr: str, state_dir: Path, timeout: float, *, token: str | None) -> None:
    """Purge every job, then wait until the clients have torn their allocations down (no mount left under
    ``state_dir``): tasks end first, and no secrets/private tmpfs outlives the test run."""
    jobs = _get(f"{addr}/v1/jobs?namespace=*", token)
    for job in jobs if isinstance(jobs, list) else []:
        url = f"{addr}/v1/job/{urllib.parse.quote(job['ID'])}?purge=true&namespace={job['Namespace']}"
        urllib.request.urlopen(_request(url, token, method="DELETE"), timeout=5).close()

    def unmounted() -> bool:
        return f" {state_dir}/" not in Path("/proc/self/mounts").read_text()

    wait_until(unmounted, what="allocations of the Nomad cluster to be torn down", timeout=timeout)


def _request(url: str, token: str | None, *, method: str = "GET") -> urllib.request.Request:
    request = urllib.request.Request(url, method=method)
    if token:
        request.add_header("X-Nomad-Token", token)
    return request


def _get(url: str, token: str | None = None) -> object:
    with urllib.request.urlopen(_request(url, token), timeout=2) as response:
        return json.loads(response.read())


def cgroup_parent(name: str) -> str:
    """The cgroup under which a Nomad client ``name`` puts its tasks, one of its own: two clients on one machine
    sharing Nomad's default (``nomad.slice``, ``/nomad``) would each rewrite the other's shared cpuset."""
    # cgroups v2 wants a systemd-style slice name, v1 a path
    return f"caravan-{name}.slice" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else f"/caravan-{name}"


def write_config(
    path: Path,
    *,
    data_dir: Path,
    nomad_home: Path,
    rootfs: Path,
    image_dir: Path,
    device_dir: Path,
    http: int,
    rpc: int,
    serf: int,
    network: SessionNetwork,
    qemu_image_dirs: tuple[Path, ...] = (),
    pause_image: str | None = None,
    raw_exec: bool = True,
    devices: SimDevices | None = DEFAULT_DEVICES,
    shared_daemon: bool = False,
    cgroups: str | None = None,
) -> None:
    """``pause_image``: the docker driver's infra container image for kernels in a network of their own (no
    registry serves Nomad's default here; ops/build-images builds one). ``raw_exec``: whether the client runs the
    unisolated raw_exec driver at all (the stack's agents always do: the platform's jobs need it; which namespaces
    may use it is the namespaces' capabilities, ``caravan.stack.nomad_acl.configure``). ``devices``: the simulated
    accelerators the client offers (Caravan's device plugin, its state in ``device_dir``; None: none).
    ``shared_daemon``: other Nomad clients (the tests' agents beside the stack's) use this machine's Docker daemon
    too (:func:`docker_plugin`). ``cgroups``: the client's own cgroup parent (:func:`cgroup_parent`; None: Nomad's
    default, as the stack's one agent has it)."""
    for directory in (data_dir, image_dir, device_dir):
        directory.mkdir(parents=True, exist_ok=True)
    path.write_text(
        NOMAD_AGENT_CONFIG.format(
            data_dir=data_dir,
            plugin_dir=plugin_dir(path.parent, nomad_home),
            rootfs=rootfs,
            device_plugin=plugin_block(devices, device_dir, data_dir),
            image_paths=json.dumps([str(image_dir), *map(str, qemu_image_dirs)]),  # a JSON string list is HCL too
            http=http,
            rpc=rpc,
            serf=serf,
            network_config=network.client_config(),
            meta=network.meta_block(),
            docker_plugin=docker_plugin(pause_image, shared_daemon=shared_daemon),
            raw_exec="true" if raw_exec else "false",
            cgroup_parent=f'  cgroup_parent = "{cgroups}"\n' if cgroups else "",
        )
    )


def start_nomad_dev(
    state_dir: Path,
    *,
    nomad_home: Path,
    rootfs: Path,
    http: int | None = None,
    want_drivers: tuple[str, ...] = ("raw_exec", "exec"),
    log: Path,
    timeout: float = 120.0,
    qemu_image_dirs: tuple[Path, ...] = (),
    pause_image: str | None = None,
    secrets_dir: Path | None = None,
    namespace: str = "default",
    devices: SimDevices | None = DEFAULT_DEVICES,
    cgroups: str | None = None,
) -> NomadAgent:
    """Start ``nomad agent -dev`` from ``nomad_home`` (bin/nomad, plugins/) on loopback ports, ACLs on, its tokens in
    ``secrets_dir`` (default ``<state_dir>/secrets``); ``raw_exec`` is disabled in ``namespace`` unless wanted."""
    binary = nomad_home / "bin" / "nomad"
    if not binary.exists():
        found = shutil.which("nomad")
        if not found:
            raise StartupFailed("nomad is not installed (ops/install-nomad builds it)")
        binary = Path(found)
    http = http or free_port()
    config = state_dir / "nomad.hcl"
    state_dir.mkdir(parents=True, exist_ok=True)
    network = session_network(state_dir)
    write_config(
        config,
        data_dir=state_dir / "data",
        nomad_home=nomad_home,
        rootfs=rootfs,
        image_dir=state_dir / "images",
        device_dir=state_dir / "devices",
        qemu_image_dirs=qemu_image_dirs,
        http=http,
        rpc=free_port(),
        serf=free_port(),
        network=network,
        pause_image=pause_image,
        devices=devices,
        shared_daemon=True,  # a test's agent: ./ops/dev's, another test's, may run kernels in the same daemon
        cgroups=cgroups,
    )
    # Nomad hands its own environment to exec and raw_exec tasks: start it with a clean one.
    service = spawn("nomad", [str(binary), "agent", "-dev", f"-config={config}"], log, env=CLEAN_ENV, clean=True)
    addr = f"http://127.0.0.1:{http}"

    def healthy() -> bool:
        if not service.alive():
            raise StartupFailed("nomad exited")
        health = _get(f"{addr}/v1/agent/health?type=client&type=server")
        return isinstance(health, dict) and all(part.get("ok") for part in health.values())

    node_id = ""
    drivers: dict[str, bool] = {}
    """The ready node's driver health, by driver name, once ``node_ready`` saw every wanted one healthy."""
    token: str | None = None

    def node_ready() -> bool:
        nodes = _get(f"{addr}/v1/nodes", token)
        ready = [n for n in nodes if n.get("Status") == "ready"] if isinstance(nodes, list) else []
        if not ready:
            return False
        detail = _get(f"{addr}/v1/node/{ready[0]['ID']}", token)
        assert isinstance(detail, dict)
        found = detail.get("Drivers") or {}
        if all((found.get(d) or {}).get("Healthy") for d in want_drivers):
            nonlocal node_id
            node_id = str(detail["ID"])
            drivers.update({name: bool(d.get("Healthy")) for name, d in found.items()})
            return True
        return False

    try:
        wait_until(healthy, what="Nomad agent health", timeout=timeout, log=log)
        token = lock_down(
            addr,
            secrets_dir or state_dir / "secrets",
            namespace=namespace,
            allow_raw_exec="raw_exec" in want_drivers,
            timeout=timeout,
            log=log,
        )
        wait_until(node_ready, what=f"Nomad node with drivers {', '.join(want_drivers)}", timeout=timeout, log=log)
    except BaseException:
        service.stop()  # an agent that never became ready must not outlive the failed start
        unmount_under(state_dir / "data")
        release(network)
        raise
    return NomadAgent(
        service=service,
        addr=addr,
        node_id=node_id,
        drivers=drivers,
        data_dir=state_dir / "data",
        network=network,
        token=token,
        device_dir=state_dir / "devices",
    )
