"""Writes the stored-document fixtures beside this file, with the code that wrote such documents in Redis.

Run under a checkout of the commit named, first on the path (``git archive <commit> | tar -x -C DIR``)::

    PYTHONPATH=DIR python tests/stores/stored_documents/generate.py current     # at 1171ae4 (the last before the codec)
    PYTHONPATH=DIR python tests/stores/stored_documents/generate.py foundation  # at c75d824 (the first sessions)
    PYTHONPATH=DIR python tests/stores/stored_documents/generate.py checkpoint  # at bae4576 (the first policies)

``current`` writes every kind of document with ``values.py``'s values through the models' own ``to_json`` (and the
stores' expressions for idle reports, events and client-token ids, copied from that commit); the others write
documents whose newer fields did not exist yet. Each file holds the document's bytes exactly as Redis held them.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 3, 1, 12, 0, 7, 250000, tzinfo=UTC)


def write(name: str, text: str | bytes) -> None:
    (HERE / name).write_bytes(text.encode() if isinstance(text, str) else text)


def current() -> None:
    sys.path.insert(1, str(HERE))
    import values  # the fixture values, built by the models of the checkout first on the path

    from core.clock import to_iso
    from stores.events import event_fields

    write("session_full.json", values.full_session().to_json())
    write("session_minimal.json", values.minimal_session().to_json())
    write("user.json", values.user().to_json())
    write("template.json", values.template().to_json())
    write("preset.json", values.preset().to_json())
    write("user_policy.json", values.user_policy().to_json())
    write("project_policy.json", values.project_policy().to_json())
    write("window.json", values.window().to_json())
    # stores.idle.IdleStore.save_sweep, stores.events.event_fields, stores.sessions.SessionStore.create at 1171ae4
    write(
        "idle_report.json",
        json.dumps({"checked_at": to_iso(values.T2), **values.verdict().to_dict()}, separators=(",", ":")),
    )
    write("event.json", event_fields(values.full_session())["event"])
    write("client_token_ids.json", json.dumps(values.CLIENT_TOKEN_IDS))


def foundation() -> None:
    from common.model import (
        ClusterMode,
        Driver,
        Kernel,
        Session,
        SessionResult,
        SessionStatus,
        SessionType,
        StatusChange,
    )

    kernel = Kernel(
        role="main",
        index=1,
        hostname="main1",
        image="busybox:1",
        resources={"cpu": "1"},
        status=SessionStatus.RUNNING,
        agent="node-1",
        alloc_id="alloc-1",
        exit_code=None,
        status_info="running",
    )
    session = Session(
        id="f00d",
        name="first",
        owner_id="admin",
        type=SessionType.INTERACTIVE,
        driver=Driver.DOCKER,
        image="busybox:1",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=T0,
        status=SessionStatus.RUNNING,
        status_info="running",
        status_history=(
            StatusChange(SessionStatus.PENDING, T0, "created"),
            StatusChange(SessionStatus.RUNNING, T1, "running"),
        ),
        environ={"A": "1"},
        cluster_mode=ClusterMode.SINGLE_NODE,
        result=SessionResult.UNDEFINED,
        nomad_job_id="caravan-f00d",
        job_hcl="job {}",
        priority=10,
        retries=0,
        wait_reasons=(),
    )
    write("session_c75d824.json", session.to_json())


def checkpoint() -> None:
    from common.model import ClusterMode, Driver, RoleSpec, SessionType
    from common.policies import UserResourcePolicy
    from common.templates import Template, TemplateScope, TemplateSpec

    policy = UserResourcePolicy(total_resource_slots={"cpu": "4"}, idle_timeout=300, max_concurrent_sessions=2)
    write("user_policy_bae4576.json", policy.to_json())
    spec = TemplateSpec(
        type=SessionType.BATCH,
        driver=Driver.DOCKER,
        image="busybox:1",
        resources={"cpu": "1"},
        cluster_size=2,
        cluster_mode=ClusterMode.MULTI_NODE,
        kernel_roles={"sub": RoleSpec(None, {"cpu": "2"})},
    )
    write(
        "template_bae4576.json",
        Template("t-1", "old", "admin", "default", TemplateScope.PERSONAL, spec, T0, T1).to_json(),
    )


if __name__ == "__main__":
    {"current": current, "foundation": foundation, "checkpoint": checkpoint}[sys.argv[1]]()
