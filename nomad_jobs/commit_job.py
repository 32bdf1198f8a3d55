"""The platform's short job that runs one Docker command on one node (``docker commit`` of a kernel's container,
``docker rmi`` of a committed image): a batch ``raw_exec`` task, pinned to the node, never retried. Registered only
by the scheduler's job owner (``scheduler.image_owner``), in the platform's namespace (raw_exec there only, written
by the scheduler's token alone: ``caravan.stack.nomad_acl``); every string through ``nomad_jobs.hcl``. Its command is
fixed (``/usr/bin/docker``); its arguments are the kernel's container name (Nomad's ids) and the image's reference
(checked by ``domain.images``), each one argv item, never a shell."""

from __future__ import annotations

from nomad_jobs.hcl import Block, render

DOCKER = "/usr/bin/docker"
TASK = "docker"


def image_job_id(job_prefix: str, image_id: str, action: str) -> str:
    """Not ``<prefix>-<...>``: the follower takes those for sessions' jobs (and stops them as orphans)."""
    return f"{job_prefix}.image-{action}-{image_id}"


def render_image_job(job_id: str, *, node_id: str, args: list[str], namespace: str, datacenter: str) -> str:
    """The job; in Nomad's built-in ``all`` node pool, so the kernel's node is reachable whatever its pool."""
    job = Block("job", job_id, type="batch", datacenters=[datacenter], namespace=namespace, node_pool="all")
    group = job.block("group", "docker", count=1)
    group.block("constraint", attribute="${node.unique.id}", value=node_id)
    group.block("restart", attempts=0, mode="fail")
    group.block("reschedule", attempts=0, unlimited=False)
    task = group.block("task", TASK, driver="raw_exec")
    task.block("config", command=DOCKER, args=args)
    task.block("resources", cpu=100, memory=64)
    return render(job)
