"""A session as a Nomad job, rendered to HCL. Pure: the inputs are the session and a context.

Resource mapping (documented for operators):
- ``cpu`` is requested in cores (decimals allowed) and becomes Nomad's ``cpu`` in MHz:
  cores × the agent's MHz per core (``JobContext.mhz_per_core``). That is a CPU *share*, not an
  exclusive core reservation, so fractional cores work and the kernel may burst when idle cores exist.
- ``mem`` is requested in bytes and becomes ``memory`` in MiB, rounded up.
- a device slot (``mock.device``, ``cuda.device``) becomes a ``device "<vendor>/<type>[/<name>]" { count = N }``
  block (``JobContext.devices``), so Nomad reserves the instances and the task sees only those.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from common.model import Driver, Kernel, Session, SessionType
from nomad_jobs import meta, qemu
from nomad_jobs.hcl import Block, render, runtime_text
from nomad_jobs.replica_service import add_recovery, add_service, exposed_ports, port_label, service_environment

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
exec /bin/sh -c "$1"
"""
"""Every kernel starts as ``sh -c BOOTSTRAP caravan-kernel <command>``: the bootstrap restores encoded
environment values, then replaces itself with ``/bin/sh -c <command>``, so the user's command reaches
its shell byte for byte."""


HPC_THREAD_VARIABLES = (
    "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS", "NPROC",
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
    devices: Mapping[str, str] = field(default_factory=dict)
    """Device slot → the Nomad device id it reserves (``mock.device`` → ``nomad/file/mock``): a kernel asking for
    such a slot gets a ``device`` block, so Nomad reserves the instances the scheduler counted."""
    qemu_images: Mapping[str, str] = field(default_factory=dict)
    """Allowlisted VM image name → its directory (``Settings.qemu_images``), for qemu kernels."""


@dataclass(frozen=True)
class RenderedJob:
    job_id: str
    hcl: str


def kernel_addresses(session: Session) -> dict[str, str]:
    """Each kernel's address on the one-machine stack: a loopback address of its own (127.x.y.n).

    Kernels use host networking there, so distinct addresses let every kernel of a cluster listen on
    the same port. ``x.y`` come from the session id, ``n`` is the kernel's index.
    """
    digest = hashlib.sha256(session.id.encode()).digest()
    first, second = 1 + digest[0] % 254, digest[1]
    return {k.hostname: f"127.{first}.{second}.{k.index}" for k in session.kernels}


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
        _kernel_group(job, session, kernel, ctx)
    return RenderedJob(job_id=job_id, hcl=render(job))


def _kernel_group(job: Block, session: Session, kernel: Kernel, ctx: JobContext) -> None:
    group = job.block("group", kernel.hostname, count=1)
    group.block("meta").set(**{meta.KERNEL: kernel.hostname})
    node = ctx.pinned_nodes.get(kernel.hostname) or session.designated_agent
    if node:
        group.block("constraint", attribute="${node.unique.id}", value=node)
    if session.type is SessionType.BATCH:
        # A batch kernel runs once: its exit code is the session's result, so no retries.
        group.block("restart", attempts=0, mode="fail")
        group.block("reschedule", attempts=0, unlimited=False)
    if session.type is SessionType.INFERENCE:
        add_recovery(group)  # a killed or unhealthy replica comes back: restarted in place, else rescheduled
    if exposed_ports(session):
        network = group.block("network")
        for port in exposed_ports(session):
            network.block("port", port_label(port))
    task = group.block("task", meta.TASK_NAME, driver=session.driver.value)
    task.block("config", **_driver_config(session, kernel, ctx))
    task.block("env", **_environment(session, kernel))
    add_service(task, session, kernel.hostname)
    cores = Decimal(kernel.resources.get("cpu", "1"))
    mem = Decimal(kernel.resources.get("mem", str(256 * MIB)))
    resources = task.block("resources", cpu=max(1, int(cores * ctx.mhz_per_core)),
                           memory=max(16, math.ceil(mem / MIB)))
    for slot, device in sorted(ctx.devices.items()):
        count = math.ceil(Decimal(kernel.resources.get(slot, "0")))
        if count > 0:
            resources.block("device", device, count=count)


def _driver_config(session: Session, kernel: Kernel, ctx: JobContext) -> dict[str, object]:
    command = session.startup_command if session.startup_command else KEEP_ALIVE
    if session.driver is Driver.QEMU:
        # An image no longer allowlisted renders as no image ("": files missing), so the VM fails to start.
        return qemu.driver_config(ctx.qemu_images.get(kernel.image, ""), command, vm_environment(session, kernel),
                                  Decimal(kernel.resources.get("cpu", "1")))
    args = [runtime_text(a) for a in ("-c", BOOTSTRAP, "caravan-kernel", command)]
    if session.driver is Driver.DOCKER:
        config: dict[str, object] = {
            "image": runtime_text(kernel.image), "command": SHELL, "args": args, "network_mode": "host",
            "hostname": kernel.hostname,
            "extra_hosts": [f"{host}:{address}" for host, address in kernel_addresses(session).items()],
        }
        if session.shared_memory:
            config["shm_size"] = int(session.shared_memory)
        return config
    return {"command": SHELL, "args": args}


def vm_environment(session: Session, kernel: Kernel) -> dict[str, str]:
    """A VM's environment: the same variables, the user's as written (they reach the guest base64-encoded)."""
    env = {k: v for k, v in _environment(session, kernel).items()
           if not k.startswith("CARAVAN_B64_") and k != "CARAVAN_ENCODED_ENV"}
    return env | session.environ


def _environment(session: Session, kernel: Kernel) -> dict[str, str]:
    hosts = ",".join(k.hostname for k in session.kernels)
    cores = max(1, math.ceil(Decimal(kernel.resources.get("cpu", "1"))))
    env = {name: str(cores) for name in HPC_THREAD_VARIABLES}
    env |= {
        "CARAVAN_SESSION_ID": session.id,
        "CARAVAN_SESSION_NAME": session.name,
        "CARAVAN_CLUSTER_ROLE": kernel.role,
        "CARAVAN_CLUSTER_IDX": str(kernel.index),
        "CARAVAN_CLUSTER_HOST": kernel.hostname,
        "CARAVAN_CLUSTER_SIZE": str(session.cluster_size),
        "CARAVAN_CLUSTER_HOSTS": hosts,
        "CARAVAN_CLUSTER_ADDR": kernel_addresses(session)[kernel.hostname],
    }
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
