"""What a driver cannot honour is refused, naming the field, rather than ignored (real gateway and Redis; no
scheduler): exec and raw_exec run no image, and only docker sizes /dev/shm.
Templates: tests/gateway/test_templates.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import CREATE, Caravan, GraphQLErrors

IMAGE = "caravan/busybox:1"
MIB = 1024 * 1024


def session(name: str, driver: str, **fields: Any) -> dict[str, Any]:
    return {"input": {"name": name, "type": "INTERACTIVE", "driver": driver, **fields}}


REFUSED = [
    ("exec image", session("exec-image", "EXEC", image=IMAGE), "image"),
    ("raw_exec image", session("raw-image", "RAW_EXEC", image=IMAGE), "image"),
    ("exec role image", session("exec-role", "EXEC", clusterSize=2, kernelRoles=[{"role": "SUB", "image": IMAGE}]),
     "kernelRoles.sub.image"),
    ("exec shared memory", session("exec-shm", "EXEC", sharedMemory="8m"), "sharedMemory"),
    ("raw_exec shared memory", session("raw-shm", "RAW_EXEC", sharedMemory="8m"), "sharedMemory"),
    ("qemu shared memory", session("vm-shm", "QEMU", sharedMemory="8m", resources=[{"slot": "mem", "amount": "256m"}]),
     "sharedMemory"),
]  # fmt: skip


@pytest.mark.parametrize(("variables", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_what_a_driver_cannot_honour_is_refused(caravan: Caravan, variables: dict[str, Any], field: str) -> None:
    with pytest.raises(GraphQLErrors) as refused:
        await caravan.gql(CREATE, variables)  # as the SUPERADMIN: raw_exec is theirs
    [error] = refused.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", field), error
    assert await caravan.store.session_ids() == []


async def test_what_a_driver_honours_is_kept(caravan: Caravan) -> None:
    """exec sessions show no image (they run none); a docker session gets its image and /dev/shm."""
    data = await caravan.gql(CREATE, session("plain-exec", "EXEC"))
    exec_session = await caravan.store.get(data["createSession"]["sessions"][0]["id"])
    assert exec_session is not None and (exec_session.image, exec_session.main_kernel.image) == ("", "")
    data = await caravan.gql(CREATE, session("docker-shm", "DOCKER", image=IMAGE, sharedMemory="8m"))
    docker_session = await caravan.store.get(data["createSession"]["sessions"][0]["id"])
    assert docker_session is not None
    assert (docker_session.image, docker_session.shared_memory) == (IMAGE, str(8 * MIB))
