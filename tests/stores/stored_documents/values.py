"""The values behind the stored-document fixtures: every field set, with the shapes Redis holds.

Imported by ``generate.py`` under the code that wrote the fixtures (commit 1171ae4, the last before
``core.codec``: its models' ``to_json``), and by ``tests/stores/test_stored_documents.py`` under today's code,
which must read each fixture back to exactly these values. Only constructors are used here, so both sides agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from domain.idle.config import CheckName, ThresholdOperator
from domain.idle.verdict import CheckReport, MetricReading, RemainingBasis, TerminationReason, Verdict
from domain.idle.window import MetricSeries, UtilizationWindow
from domain.model import (
    ClusterMode,
    Driver,
    Kernel,
    RoleSpec,
    Session,
    SessionResult,
    SessionStatus,
    SessionType,
    StatusChange,
)
from domain.presets import ResourcePreset
from domain.resource_policies import ProjectResourcePolicy, UserResourcePolicy
from domain.templates import Template, TemplateScope, TemplateSpec
from domain.users import Role, User

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 3, 1, 12, 0, 7, 250000, tzinfo=UTC)
T2 = datetime(2026, 3, 1, 12, 5, 30, 1, tzinfo=UTC)


def full_session() -> Session:
    """Every field of a session and of its kernels set (non-ASCII text too: the old writer escaped it)."""
    main = Kernel(
        role="main",
        index=1,
        hostname="main1",
        image="caravan/busybox:1",
        resources={"cpu": "2", "mem": "1073741824"},
        status=SessionStatus.RUNNING,
        agent="0d5f6a1e-node",
        alloc_id="9b2c-alloc",
        exit_code=None,
        status_info="running",
        status_detail="Nomad: restarted once — exit 137",
        started_at=T1,
        finished_at=None,
        ports=("8080=127.0.0.1:23456", "8081=127.0.0.1:23457"),
        restarts=1,
        healthy=True,
    )
    sub = Kernel(
        role="sub",
        index=1,
        hostname="sub1",
        image="caravan/busybox:2",
        resources={"cpu": "0.5", "mem": "268435456"},
        status=SessionStatus.TERMINATED,
        agent="1e6a7b2f-node",
        alloc_id="7c3d-alloc",
        exit_code=3,
        status_info="task-failed",
        status_detail=None,
        started_at=T1,
        finished_at=T2,
        ports=(),
        restarts=0,
        healthy=False,
    )
    history = (
        StatusChange(SessionStatus.PENDING, T0, "created"),
        StatusChange(SessionStatus.SCHEDULED, T0, "scheduled", None),
        StatusChange(SessionStatus.PREPARING, T1, "pulling-image", "Nomad: Downloading image caravan/busybox:1"),
        StatusChange(SessionStatus.RUNNING, T2, "running", "Überall ✓"),
    )
    return Session(
        id="5f0c2a7e9d8b4c3a",
        name="train-ré",
        owner_id="user-001",
        type=SessionType.INFERENCE,
        driver=Driver.DOCKER,
        image="caravan/busybox:1",
        resources={"cpu": "2", "mem": "1073741824", "cuda.shares": "0.5"},
        kernels=(main, sub),
        created_at=T0,
        status=SessionStatus.RUNNING,
        status_info="running",
        status_detail="Überall ✓",
        status_history=history,
        resource_group="gpu",
        project="research",
        startup_command="python -m http.server 8080",
        environ={"OMP_NUM_THREADS": "4", "GREETING": "héllo\u2028wörld"},
        cluster_mode=ClusterMode.MULTI_NODE,
        result=SessionResult.FAILURE,
        exit_code=3,
        nomad_job_id="caravan-5f0c",
        job_hcl='job "caravan-5f0c" {\n  type = "service"\n}\n',
        client_token="token-1",
        priority=42,
        retries=2,
        wait_reasons=("start-time", "dependencies"),
        queue_position=7,
        starts_at=T1,
        batch_timeout=90.5,
        dependencies=("a1", "b2"),
        designated_agent="0d5f6a1e-node",
        preopen_ports=(8080, 8081),
        shared_memory="67108864",
        started_at=T1,
        service_port=8080,
        health_check_path="/healthz",
        health_check_grace=12.5,
    )


def minimal_session() -> Session:
    """A new session: only the fields without defaults."""
    kernel = Kernel(role="main", index=1, hostname="main1", image="caravan/busybox:1", resources={"cpu": "1"})
    return Session(
        id="0a1b",
        name="plain",
        owner_id="admin",
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="caravan/busybox:1",
        resources={"cpu": "1"},
        kernels=(kernel,),
        created_at=T0,
    )


def user() -> User:
    return User(id="user-001", name="Zoë", role=Role.ADMIN, projects=("default", "research"), active=False)


def template() -> Template:
    spec = TemplateSpec(
        type=SessionType.BATCH,
        driver=Driver.EXEC,
        image="caravan/busybox:1",
        startup_command="make train",
        environ={"A": "1"},
        resources={"cpu": "2", "mem": "4g"},
        resource_group="gpu",
        starts_at="1h",
        batch_timeout="30m",
        cluster_size=3,
        cluster_mode=ClusterMode.MULTI_NODE,
        count=2,
        preopen_ports=(9000,),
        shared_memory="64m",
        designated_agent="node-7",
        priority=20,
        preset="small",
        kernel_roles={"main": RoleSpec("caravan/busybox:2", {"cpu": "4"}), "sub": RoleSpec(None, {})},
        replicas=2,
        service_port=8000,
        health_check_path="/ready",
        health_check_grace="15s",
    )
    return Template("4e9f-template", "nightly train", "user-001", "research", TemplateScope.PROJECT, spec, T0, T2)


def preset() -> ResourcePreset:
    return ResourcePreset("small", {"cpu": "1", "mem": "2147483648"}, "67108864")


def user_policy() -> UserResourcePolicy:
    return UserResourcePolicy(
        total_resource_slots={"cpu": Decimal("8"), "mem": Decimal("1E+10"), "cuda.shares": Decimal("0.5")},
        max_session_lifetime=86400.0,
        idle_timeout=600.0,
        allowed_resource_groups=("gpu", "default"),
        allowed_drivers=("docker",),
        max_concurrent_sessions=4,
        max_pending_sessions=10,
        max_priority=30,
    )


def project_policy() -> ProjectResourcePolicy:
    return ProjectResourcePolicy(total_resource_slots={"cpu": Decimal("64")}, allowed_drivers=())


def verdict() -> Verdict:
    return Verdict(
        True,
        TerminationReason.UTILIZATION,
        (
            CheckReport(CheckName.SESSION_LIFETIME, False, 3600.0, RemainingBasis.LIFETIME),
            CheckReport(CheckName.NETWORK_TIMEOUT, False, None, None, "no network check for BATCH"),
            CheckReport(
                CheckName.UTILIZATION,
                True,
                0.0,
                RemainingBasis.WINDOW,
                "",
                ThresholdOperator.ALL,
                (
                    MetricReading("cpu_util", 0.75, 5.0),
                    MetricReading("cuda_util", None, 10.0),
                ),
            ),
        ),
    )


def window() -> UtilizationWindow:
    stamps = (1772366400000, 1772366415000, 1772366430000)
    return UtilizationWindow(
        window_seconds=600.0,
        interval=15.0,
        series={
            "cpu_util": MetricSeries(stamps, (1500, 0, 250)),
            "mem": MetricSeries(stamps, (40000, 40125, 39999)),
            "cuda_util": MetricSeries(stamps[1:], (99000, 100000)),
        },
    )


CLIENT_TOKEN_IDS = ["5f0c2a7e9d8b4c3a", "0a1b"]
"""What a client token records: the ids of the sessions its creation made."""
