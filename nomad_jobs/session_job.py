"""A session as a Nomad job, rendered to HCL. Pure: the inputs are the session and a context.

Resource mapping (documented for operators):
- ``cpu`` is requested in cores (decimals allowed) and becomes Nomad's ``cpu`` in MHz:
  cores × the agent's MHz per core (``JobContext.mhz_per_core``). That is a CPU *share*, not an
  exclusive core reservation, so fractional cores work and the kernel may burst when idle cores exist.
- ``mem`` is requested in bytes and becomes ``memory`` in MiB, rounded up.
- a device slot (``sim.device``, ``cuda.device``) becomes a ``device "<vendor>/<type>[/<name>]" { count = N }``
  block (``JobContext.devices``), so Nomad reserves the instances and the task sees only those; N is the amount
  rounded up to whole instances: a device is one, a share (``sim.shares``) 1/K of a device, so 0.5 of a device offered
  as 4 shares is 2 instances, with a constraint on the model when the slot names one.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from core.settings import NomadSettings
from devices.catalog import MODEL_ATTRIBUTE, DeviceAsk
from domain.endpoint_scaling import as_run_by
from domain.idle.network import NET_STATS_INTERVAL
from domain.model import Driver, Kernel, Session, SessionType
from nomad_jobs import meta, qemu
from nomad_jobs.hcl import Block, render, runtime_text
from nomad_jobs.kernel_network import (
    HOST,
    SESSION_NETWORK,
    add_network,
    add_peers_template,
    docker_network_config,
    network_environment,
)
from nomad_jobs.replica_service import add_recovery, add_service, service_environment

MIB = 1024 * 1024
SHELL = "/bin/sh"
KEEP_ALIVE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
"""An interactive kernel with no startup command stays up until Caravan stops it."""

NOMAD_ENV_REFERENCE = re.compile(r"\$\{[a-zA-Z0-9_\-.]+\}")
"""What Nomad's client rewrites in env values (``helper/args.envRe``), with no escape syntax: a value
matching it would be changed (and could read node attributes or task secrets), so such values travel
base64-encoded and the bootstrap below restores them."""

BOOTSTRAP = """\
for caravan_name in $CARAVAN_ENCODED_ENV; do
  eval "caravan_value=\\$CARAVAN_B64_$caravan_name"
  caravan_value=$(printf %s "$caravan_value" | base64 -d; echo .)
  export "$caravan_name=${caravan_value%.}"
  unset "CARAVAN_B64_$caravan_name"
done
unset CARAVAN_ENCODED_ENV caravan_name caravan_value
if [ -n "${CARAVAN_NET_STATS:-}" ]; then
  (
    trap - TERM INT
    while :; do
      cat /proc/uptime /proc/net/dev > "$CARAVAN_NET_STATS.tmp" && mv -f "$CARAVAN_NET_STATS.tmp" "$CARAVAN_NET_STATS"
      sleep %(net_interval)s
    done
  ) </dev/null >/dev/null 2>&1 &
  unset CARAVAN_NET_STATS
fi
if [ -n "${CARAVAN_CLUSTER_PEERS:-}" ]; then
  caravan_listed() {
    caravan_rest="$CARAVAN_CLUSTER_HOSTS," caravan_known= caravan_missing=
    while [ -n "$caravan_rest" ]; do
      caravan_host=${caravan_rest%%,*} caravan_rest=${caravan_rest#*,} caravan_found=
      while read -r caravan_ip caravan_peer; do
        [ "$caravan_peer" = "$caravan_host" ] && caravan_found=$caravan_ip
      done < "$CARAVAN_CLUSTER_PEERS"
      if [ -z "$caravan_found" ]; then caravan_missing=1; continue; fi
      [ "$caravan_host" = "$CARAVAN_CLUSTER_HOST" ] && CARAVAN_CLUSTER_ADDR=$caravan_found
      caravan_known="$caravan_known$caravan_found $caravan_host
"
    done
    [ -z "$caravan_missing" ]
  }
  trap 'exit 143' TERM INT
  caravan_tries=0
  until [ -f "$CARAVAN_CLUSTER_PEERS" ] && caravan_listed; do
    caravan_tries=$((caravan_tries + 1))
    if [ "$caravan_tries" -gt 600 ]; then
      echo "caravan: not every cluster peer is known after 120 s; starting anyway" >&2
      break
    fi
    sleep 0.2
  done
  trap - TERM INT
  caravan_hosts=
  set -f
  while read -r caravan_line; do
    caravan_keep=1
    for caravan_word in $caravan_line; do
      case ",$CARAVAN_CLUSTER_HOSTS," in *",$caravan_word,"*) caravan_keep= ;; esac
    done
    [ -n "$caravan_keep" ] && caravan_hosts="$caravan_hosts$caravan_line
"
  done 2>/dev/null < /etc/hosts
  set +f
  rm -f /etc/hosts 2>/dev/null
  printf %s "$caravan_hosts$caravan_known" > /etc/hosts ||
    echo "caravan: /etc/hosts is not writable: peers unresolved" >&2
  export CARAVAN_CLUSTER_ADDR
  unset -f caravan_listed
  unset caravan_rest caravan_host caravan_found caravan_ip caravan_peer caravan_tries caravan_hosts caravan_known \
    caravan_missing caravan_line caravan_keep caravan_word
fi
if [ -n "${CARAVAN_OUTPUT_LINGER:-}${CARAVAN_WAIT_FOR_MAIN:-}" ]; then
  caravan_linger=${CARAVAN_OUTPUT_LINGER:-0} caravan_hold=${CARAVAN_WAIT_FOR_MAIN:-}
  unset CARAVAN_OUTPUT_LINGER CARAVAN_WAIT_FOR_MAIN
  /bin/sh -c "$1" <&0 &
  caravan_child=$!
  for caravan_signal in TERM INT HUP QUIT USR1 USR2; do
    trap "kill -$caravan_signal $caravan_child 2>/dev/null" "$caravan_signal"
  done
  while :; do
    wait "$caravan_child"
    caravan_code=$?
    kill -0 "$caravan_child" 2>/dev/null || break
  done
  if [ -n "$caravan_hold" ] && [ "$caravan_code" = 0 ]; then
    trap 'exit 0' TERM INT
    while :; do sleep 3600 & wait $!; done
  fi
  sleep "$caravan_linger"
  exit "$caravan_code"
fi
exec /bin/sh -c "$1"
""".replace("%(net_interval)s", str(NET_STATS_INTERVAL))
"""Every kernel starts as ``sh -c BOOTSTRAP caravan-kernel <command>``: the bootstrap restores encoded environment
values; an isolated kernel (``CARAVAN_NET_STATS``) gets a background loop copying its namespace's network counters
into its allocation directory every ``domain.idle.network.NET_STATS_INTERVAL`` seconds (the session page's network
chart: Nomad's stats have none); in a cluster session on the session network it waits (up to 120 s) until every
peer's address is known (a kernel stopped meanwhile exits 143 at once: a container's first process ignores an
untrapped TERM) and writes ``/etc/hosts``: its lines naming no kernel of the session, then one line per kernel
(Docker's own line for the kernel's hostname is replaced, not repeated; ``rm`` first: an exec kernel's ``/etc`` may
hold hard links into the shared root filesystem; Docker's ``/etc/hosts`` is a per-allocation bind mount, written in
place); then it replaces itself with ``/bin/sh -c <command>``, so the user's command reaches its shell byte for byte.

A docker kernel (``CARAVAN_OUTPUT_LINGER``) instead runs the command as its child, passes signals on to it, and
lingers :data:`OUTPUT_LINGER_SECONDS` after it ends before exiting with its status: Nomad stops copying a container's
output the moment the container exits (hashicorp/nomad#6931), which lost the last lines of kernels that print and
exit at once. So does a sub kernel of a BATCH cluster (``CARAVAN_WAIT_FOR_MAIN``), which, when its command succeeds,
stays up idle until Caravan stops it (main1 ended) and then exits 0: its allocation, and so its address in Nomad's
service registry, lives until the session ends, so a peer never waits for the address of a sub that already ended.
"""

OUTPUT_LINGER_SECONDS = "0.5"
"""How long a docker kernel stays up after its command ends, for Nomad to copy the last of its output."""


HPC_THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NPROC",
)
"""Set to the kernel's allocated cores unless the user set them: libraries otherwise start one thread per
host core and oversubscribe the CPU share the kernel actually has."""


@dataclass(frozen=True)
class JobContext:
    job_prefix: str
    datacenter: str = "dc1"
    namespace: str = "default"
    mhz_per_core: int = 1000
    pinned_nodes: dict[str, str] = field(default_factory=dict)
    """Kernel hostname → Nomad node id chosen by Caravan's scheduler (empty: Nomad places)."""
    node_pool: str | None = None
    """The Nomad node pool of the session's resource group (None: Nomad's default pool)."""
    devices: Mapping[str, DeviceAsk] = field(default_factory=dict)
    """Device slot → how a job asks Nomad for it (``sim.device`` → ``caravan-sim/gpu``; ``devices.catalog``): a
    kernel asking for such a slot gets a ``device`` block, so Nomad reserves the instances the scheduler counted."""
    qemu_images: Mapping[str, str] = field(default_factory=dict)
    """Allowlisted VM image name → its directory (``Settings.qemu_images``), for qemu kernels."""
    static_ports: Mapping[int, int] = field(default_factory=dict)
    """The main kernel's container port -> the host port granted it (apps' preferred ports); the rest are dynamic."""
    network_mode: str = SESSION_NETWORK
    """Nomad network mode of docker and exec kernels (``Settings.session_network``): ``cni/caravan``, a namespace of
    their own on the session network, or ``host`` (no isolation); see ``nomad_jobs.kernel_network``."""
    restart_delay: float = NomadSettings.restart_delay
    """Seconds before a failed task of a long-running (not BATCH, not INFERENCE) session is restarted
    (``NomadSettings.restart_delay``)."""
    pooled_namespace: str | None = None
    """The pooled network namespace the scheduler claimed for the session's one docker kernel (its pause container's
    name, ``nomad_jobs.namespace_keeper``); None: a namespace made at launch, as the network mode says."""


@dataclass(frozen=True)
class RenderedJob:
    job_id: str
    hcl: str


def render_session_job(session: Session, ctx: JobContext) -> RenderedJob:
    job_id = meta.job_id(ctx.job_prefix, session.id)
    job = Block(
        "job",
        job_id,
        type="batch" if session.type is SessionType.BATCH else "service",
        datacenters=[ctx.datacenter],
        namespace=ctx.namespace,
        node_pool=ctx.node_pool,
        meta={
            meta.SESSION_ID: session.id,
            meta.SESSION_NAME: session.name,
            meta.OWNER: session.owner_id,
            meta.SESSION_TYPE: session.type.value,
        },
    )
    for kernel in session.kernels:
        _kernel_group(job, as_run_by(session, kernel), kernel, ctx)  # a replica of the previous revision as it was
    return RenderedJob(job_id=job_id, hcl=render(job))


def _kernel_group(job: Block, session: Session, kernel: Kernel, ctx: JobContext) -> None:
    group = job.block("group", kernel.hostname, count=0 if kernel.parked else 1)  # parked: an endpoint at zero
    group.block("meta").set(**{meta.KERNEL: kernel.hostname})
    node = ctx.pinned_nodes.get(kernel.hostname) or session.designated_agent
    if node:
        group.block("constraint", attribute="${node.unique.id}", value=node)
    if session.type is SessionType.BATCH:
        # A batch kernel runs once: its exit code is the session's result, so no retries.
        group.block("restart", attempts=0, mode="fail")
        group.block("reschedule", attempts=0, unlimited=False)
    elif session.type is SessionType.INFERENCE:
        add_recovery(group)  # a killed or unhealthy replica comes back: restarted in place, else rescheduled
    else:  # Nomad's policy for a service job, its delay the operator's (``NomadSettings.restart_delay``)
        group.block("restart", attempts=2, interval="30m", delay=f"{round(ctx.restart_delay * 1000)}ms", mode="fail")
    if session.driver is not Driver.QEMU:
        add_network(group, session, kernel, ctx.network_mode, ctx.static_ports, ctx.pooled_namespace)
    task = group.block("task", meta.TASK_NAME, driver=session.driver.value)
    task.block("config", **_driver_config(session, kernel, ctx))
    add_mounts(group, task, session)
    task.block("env", **_environment(session, kernel, ctx.network_mode))
    add_peers_template(task, session, ctx.network_mode)
    add_service(task, session, kernel.hostname)
    cores = Decimal(kernel.resources.get("cpu", "1"))
    mem = Decimal(kernel.resources.get("mem", str(256 * MIB)))
    resources = task.block("resources", cpu=cpu_mhz(cores, ctx.mhz_per_core), memory=max(16, math.ceil(mem / MIB)))
    for slot, ask in sorted(ctx.devices.items()):
        count = math.ceil(Decimal(kernel.resources.get(slot, "0")) * ask.units)
        if count > 0:
            device = resources.block("device", ask.id, count=count)
            if ask.model is not None:
                device.block("constraint", attribute=f"${{device.attr.{MODEL_ATTRIBUTE}}}", value=ask.model)


def cpu_mhz(cores: Decimal, mhz_per_core: int) -> int:
    """Nomad's ``cpu`` (MHz) for ``cores``."""
    return max(1, int(cores * mhz_per_core))


def mhz_rendered(cpu: int, cores: Decimal) -> int | None:
    """A MHz per core that renders ``cores`` as ``cpu`` again (how a registered job was rendered, so that a job
    rendered anew leaves its groups as they are, even if the agents' MHz per core changed since); None: none does."""
    if cores <= 0:
        return None
    guess = int(Decimal(cpu) / cores)
    return next((m for m in range(max(1, guess - 2), guess + 3) if cpu_mhz(cores, m) == cpu), None)


def add_mounts(group: Block, task: Block, session: Session) -> None:
    """The session's storage folders: each a Nomad dynamic host volume (by name; Nomad places the group on the node
    that has it, as the scheduler did already), mounted read-only where asked."""
    for i, mount in enumerate(session.mounts):
        name = f"folder{i}"
        group.block(
            "volume",
            name,
            type="host",
            source=mount.volume_name,
            read_only=mount.read_only,
            access_mode="single-node-reader-only" if mount.read_only else "single-node-multi-writer",
            attachment_mode="file-system",
        )
        task.block("volume_mount", volume=name, destination=mount.path, read_only=mount.read_only)


def _driver_config(session: Session, kernel: Kernel, ctx: JobContext) -> dict[str, object]:
    command = session.startup_command if session.startup_command else KEEP_ALIVE
    if session.driver is Driver.QEMU:
        # An image no longer allowlisted renders as no image ("": files missing), so the VM fails to start.
        return qemu.driver_config(
            ctx.qemu_images.get(kernel.image, ""),
            command,
            vm_environment(session, kernel),
            Decimal(kernel.resources.get("cpu", "1")),
        )
    args = [runtime_text(a) for a in ("-c", BOOTSTRAP, "caravan-kernel", command)]
    if session.driver is Driver.DOCKER:
        config: dict[str, object] = {
            "image": runtime_text(kernel.image),
            "command": SHELL,
            "args": args,
            **docker_network_config(session, kernel, ctx.network_mode, ctx.pooled_namespace),
        }
        if session.shared_memory:
            config["shm_size"] = int(session.shared_memory)
        return config
    return {"command": SHELL, "args": args}


def waits_for_main(session: Session, kernel: Kernel) -> bool:
    """Does this kernel, once its command succeeded, stay up until the session ends? A sub kernel of a BATCH cluster
    does (``BOOTSTRAP``; not a VM, which runs no bootstrap): a BATCH cluster ends when main1's command does."""
    return (
        session.type is SessionType.BATCH
        and len(session.kernels) > 1
        and not kernel.is_main
        and session.driver is not Driver.QEMU
    )


def vm_environment(session: Session, kernel: Kernel) -> dict[str, str]:
    """A VM's environment: the same variables, the user's as written (they reach the guest base64-encoded). A VM has
    no network card, so it is on no session network."""
    env = {
        k: v
        for k, v in _environment(session, kernel, HOST).items()
        if not k.startswith("CARAVAN_B64_") and k != "CARAVAN_ENCODED_ENV"
    }
    return env | session.environ


def _environment(session: Session, kernel: Kernel, network_mode: str) -> dict[str, str]:
    hosts = ",".join(k.hostname for k in session.kernels)
    cores = max(1, math.ceil(Decimal(kernel.resources.get("cpu", "1"))))
    env = {name: str(cores) for name in HPC_THREAD_VARIABLES}
    env |= {
        "CARAVAN_SESSION_ID": session.id,
        "CARAVAN_SESSION_NAME": session.name,
        "CARAVAN_CLUSTER_ROLE": kernel.role,
        "CARAVAN_CLUSTER_IDX": str(kernel.index),
        "CARAVAN_CLUSTER_HOST": kernel.hostname,
    }
    if session.type is not SessionType.INFERENCE:
        # Not for replicas: they come and go as the endpoint scales, and a changed value would restart every one.
        env |= {"CARAVAN_CLUSTER_SIZE": str(session.cluster_size), "CARAVAN_CLUSTER_HOSTS": hosts}
    if session.driver is Driver.DOCKER:
        env["CARAVAN_OUTPUT_LINGER"] = OUTPUT_LINGER_SECONDS
    if waits_for_main(session, kernel):
        env["CARAVAN_WAIT_FOR_MAIN"] = "1"
    env |= network_environment(session, kernel, network_mode)
    env |= service_environment(session)
    encoded = []
    for name, value in session.environ.items():
        if NOMAD_ENV_REFERENCE.search(value):
            env[f"CARAVAN_B64_{name}"] = base64.b64encode(value.encode()).decode()
            encoded.append(name)
        else:
            env[name] = value
    env["CARAVAN_ENCODED_ENV"] = " ".join(encoded)
    return env
