"""A session as a Nomad job, rendered to HCL. Pure: the inputs are the session and a context.

Resource mapping (documented for operators):
- ``cpu`` is requested in cores (decimals allowed) and becomes Nomad's ``cpu`` in MHz:
  cores × the agent's MHz per core (``JobContext.mhz_per_core``). That is a CPU *share*, not an
  exclusive core reservation, so fractional cores work and the kernel may burst when idle cores exist.
- ``mem`` is requested in bytes and becomes ``memory`` in MiB, rounded up.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal

from common.model import Driver, Kernel, Session, SessionType
from nomad_jobs import meta
from nomad_jobs.hcl import Block, render, runtime_text

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
    if session.preopen_ports:
        network = group.block("network")
        for port in session.preopen_ports:
            network.block("port", f"p{port}")
    task = group.block("task", meta.TASK_NAME, driver=session.driver.value)
    task.block("config", **_driver_config(session, kernel))
    task.block("env", **_environment(session, kernel))
    cores = Decimal(kernel.resources.get("cpu", "1"))
    mem = Decimal(kernel.resources.get("mem", str(256 * MIB)))
    task.block("resources", cpu=max(1, int(cores * ctx.mhz_per_core)), memory=max(16, math.ceil(mem / MIB)))


def _driver_config(session: Session, kernel: Kernel) -> dict[str, object]:
    command = session.startup_command if session.startup_command else KEEP_ALIVE
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
    encoded = []
    for name, value in session.environ.items():
        if NOMAD_ENV_REFERENCE.search(value):
            env[f"CARAVAN_B64_{name}"] = base64.b64encode(value.encode()).decode()
            encoded.append(name)
        else:
            env[name] = value
    env["CARAVAN_ENCODED_ENV"] = " ".join(encoded)
    return env
