"""A live endpoint's replicas changed: which to add, drain, stop or park, and who still gets traffic."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import Conflict, Forbidden, InvalidInput, UnsupportedResource
from domain.autoscaling import ScalingRules
from domain.endpoint_scaling import (
    PROPAGATION,
    ReplicaPlan,
    ReplicaUpdate,
    as_run_by,
    check_replica_ceiling,
    fixed_rules,
    moved,
    plan_replicas,
    plan_rollout,
    replica_template,
    replicas_now,
    stranded,
    with_plan,
    with_update,
)
from domain.inference import endpoints_of
from domain.lifecycle import observe_kernel
from domain.model import Driver, Kernel, KernelObservation, ReplicaSpec, Session, SessionType
from domain.model import SessionStatus as S
from domain.resource_policies import UserResourcePolicy
from domain.session_requests import CreationRules, checked_replica_update
from domain.users import Role, User

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def replica(i: int, **changes: object) -> Kernel:
    kernel = Kernel(
        role="main",
        index=i,
        hostname=f"main{i}",
        image="img",
        resources={"cpu": "1"},
        status=S.RUNNING,
        agent="node-a",
        alloc_id=f"alloc{i}",
        ports=(f"8000=127.0.0.1:{20000 + i}",),
        healthy=True,
    )
    return replace(kernel, **changes)  # type: ignore[arg-type]


def endpoint(*kernels: Kernel) -> Session:
    return Session(
        id="s1",
        name="ep",
        owner_id="u1",
        type=SessionType.INFERENCE,
        driver=Driver.EXEC,
        image="img",
        resources={"cpu": "1"},
        kernels=kernels,
        created_at=T0,
        status=S.RUNNING,
        service_port=8000,
        started_at=T0,
    )


def plan(session: Session, desired: int, *, now: datetime = T0, in_flight: int | None = 3) -> ReplicaPlan:
    return plan_replicas(session, desired, now=now, drain_timeout=30, in_flight=in_flight, sampled_at=now.timestamp())


@pytest.mark.parametrize(
    ("kernels", "desired", "expected"),
    [
        ((replica(1), replica(2)), 2, ReplicaPlan()),
        ((replica(1),), 3, ReplicaPlan(add=("main2", "main3"))),
        ((replica(1), replica(3)), 3, ReplicaPlan(add=("main2",))),  # the lowest free index
        ((replica(1), replica(2), replica(3)), 1, ReplicaPlan(drain=("main3", "main2"))),  # the highest first
        ((replica(1), replica(2, draining_since=T0)), 2, ReplicaPlan(undrain=("main2",))),  # taken back first
        ((replica(1, parked=True, status=S.TERMINATED),), 2, ReplicaPlan(add=("main1", "main2"))),  # woken
        ((replica(1),), 0, ReplicaPlan(drain=("main1",))),
    ],
)
def test_plan(kernels: tuple[Kernel, ...], desired: int, expected: ReplicaPlan) -> None:
    assert plan(endpoint(*kernels), desired) == expected


def test_a_draining_replica_leaves_the_endpoints_at_once_and_stops_once_drained() -> None:
    session = endpoint(replica(1), replica(2))
    drained = with_plan(session, plan(session, 1), now=T0, agents={})
    assert endpoints_of(drained) == ("127.0.0.1:20001",)  # no new request reaches main2
    assert replicas_now(drained).current == 1
    # Requests still in flight: kept running.
    assert plan(drained, 1, now=T0 + timedelta(seconds=5), in_flight=2).stop == ()
    # Nothing in flight, but in a sample from before the ingress dropped it: kept.
    early = plan_replicas(
        drained, 1, now=T0 + timedelta(seconds=1), drain_timeout=30, in_flight=0, sampled_at=T0.timestamp() + 1
    )
    assert early.stop == ()
    # Nothing in flight after the ingress dropped it: stopped.
    later = T0 + timedelta(seconds=PROPAGATION + 1)
    assert plan(drained, 1, now=later, in_flight=0).stop == ("main2",)
    # Busy for ever: stopped at the drain timeout.
    assert plan(drained, 1, now=T0 + timedelta(seconds=30), in_flight=9).stop == ("main2",)
    stopped = with_plan(drained, plan(drained, 1, now=later, in_flight=0), now=later, agents={})
    assert [k.hostname for k in stopped.kernels] == ["main1"]


def test_the_last_replica_is_parked_and_woken() -> None:
    session = endpoint(replica(1))
    draining = with_plan(session, plan(session, 0), now=T0, agents={})
    assert endpoints_of(draining) == ()
    later = T0 + timedelta(seconds=10)
    parked = with_plan(draining, plan(draining, 0, now=later, in_flight=0), now=later, agents={})
    (kernel,) = parked.kernels
    assert kernel.parked and kernel.agent is None and kernel.alloc_id is None
    assert parked.status is S.RUNNING  # a live endpoint at zero
    assert replicas_now(parked).current == 0
    # Its old allocation's late report changes nothing.
    late = KernelObservation(hostname="main1", status=S.TERMINATED, reason="completed", alloc_id="alloc1")
    assert observe_kernel(parked, late, at=later) is None
    woken = with_plan(parked, plan(parked, 1, now=later), now=later, agents={"main1": "node-b"})
    (kernel,) = woken.kernels
    assert not kernel.parked and kernel.status is S.PENDING and kernel.agent == "node-b"
    assert replicas_now(woken).current == 1


def test_a_new_replica_ignores_the_stopped_allocation_of_its_name() -> None:
    """main2 was stopped, then added again: until Nomad places the new one, the old allocation is still reported."""
    session = endpoint(replica(1))
    grown = with_plan(session, plan(session, 2), now=T0, agents={"main2": "node-b"})
    old = KernelObservation(hostname="main2", status=S.TERMINATED, reason="completed", alloc_id="old", agent="node-a")
    assert observe_kernel(grown, old, at=T0) is None
    new = KernelObservation(hostname="main2", status=S.RUNNING, reason="running", alloc_id="new", agent="node-b")
    seen = observe_kernel(grown, new, at=T0)
    assert seen is not None and seen.kernels[1].alloc_id == "new" and seen.kernels[1].status is S.RUNNING
    # Once it has run, a failure of its own is read as usual: recovering.
    failed = replace(new, status=S.ERROR, reason="task-failed")
    after = observe_kernel(seen, failed, at=T0)
    assert after is not None and after.kernels[1].status_info.startswith("recovering")


def test_a_replica_down_on_a_lost_node_moves_and_its_old_allocation_no_longer_counts() -> None:
    """main1 was lost with node-a (Nomad marked it down); main2 runs on node-b and serves meanwhile."""
    lost = observe_kernel(
        endpoint(replica(1), replica(2, agent="node-b")),
        KernelObservation(hostname="main1", status=S.ERROR, reason="job-lost", alloc_id="alloc1", agent="node-a"),
        at=T0,
    )
    assert lost is not None and lost.kernels[0].status_info == "recovering: job-lost"
    assert endpoints_of(lost) == ("127.0.0.1:20002",)
    assert stranded(lost, {"node-a"}) == ("main1",) and stranded(lost, {"node-c"}) == ()
    assert stranded(endpoint(replica(1)), {"node-a"}) == ()  # running there (its client back): left as it runs
    now = moved(lost, {"main1": "node-b"})
    assert now.kernels[0].agent == "node-b" and now.kernels[0].alloc_id is None and now.kernels[1] == lost.kernels[1]
    new = KernelObservation(hostname="main1", status=S.RUNNING, reason="running", alloc_id="new", agent="node-b")
    seen = observe_kernel(now, new, at=T0)
    assert seen is not None and seen.kernels[0].alloc_id == "new"
    # node-a back, its client stops the old allocation (and may say it runs first): neither says anything of main1
    for status in (S.RUNNING, S.TERMINATED):
        old = KernelObservation(hostname="main1", status=status, reason="x", alloc_id="alloc1", agent="node-a")
        assert observe_kernel(seen, old, at=T0) is None


def test_a_new_replica_without_an_agent_waits() -> None:
    session = endpoint(replica(1))
    grown = with_plan(session, plan(session, 3), now=T0, agents={"main2": "node-b"})
    assert [k.hostname for k in grown.kernels] == ["main1", "main2"]
    assert grown.kernels[1].agent == "node-b" and grown.kernels[1].status is S.PENDING


@pytest.mark.parametrize(("max_replicas", "refused"), [(4, False), (5, True)])
def test_max_replicas_must_fit_the_policy(max_replicas: int, refused: bool) -> None:
    policy = UserResourcePolicy(total_resource_slots={"cpu": "4"})
    rules = ScalingRules(min_replicas=0, max_replicas=max_replicas)
    if refused:
        with pytest.raises(Forbidden) as caught:
            check_replica_ceiling(endpoint(replica(1)), rules, user=policy, project=None)
        assert caught.value.field == "maxReplicas"
    else:
        check_replica_ceiling(endpoint(replica(1)), rules, user=policy, project=None)


# -- rolling updates --


def serve(session: Session, hostname: str) -> Session:
    """``hostname`` running and passing its check (what the follower records once Nomad says so)."""
    kernels = tuple(
        replace(k, status=S.RUNNING, healthy=True, alloc_id=f"a-{k.hostname}", ports=(f"8000=127.0.0.1:2{k.index}",))
        if k.hostname == hostname
        else k
        for k in session.kernels
    )
    return session.evolve(kernels=kernels)


def update(
    command: str, environ: dict[str, str] | None = None, image: str = "img", resources: dict[str, str] | None = None
) -> ReplicaUpdate:
    return ReplicaUpdate(command, environ or {}, image, resources or {"cpu": "1"})


def step(session: Session, now: datetime, agents: dict[str, str] | None = None) -> tuple[Session, ReplicaPlan]:
    found = plan_rollout(session, now=now, drain_timeout=30, in_flight=0, sampled_at=now.timestamp())
    assert found is not None
    return with_plan(session, found, now=now, agents=agents or {}), found


def test_a_rolling_update_replaces_one_replica_at_a_time_and_never_serves_fewer() -> None:
    session = with_update(
        endpoint(replica(1), replica(2)).evolve(startup_command="serve v1"), update("serve v2", {"MODEL": "v2"})
    )
    assert (session.revision, session.previous) == (1, ReplicaSpec("serve v1", {}, 2))
    assert [as_run_by(session, k).startup_command for k in session.kernels] == ["serve v1", "serve v1"]
    now = T0
    session, did = step(session, now, {"main3": "node-a"})
    assert did == ReplicaPlan(add=("main3",))  # surge: a new replica first
    assert as_run_by(session, session.kernels[2]).environ == {"MODEL": "v2"}
    _, did = step(session, now)
    assert did == ReplicaPlan()  # the new one does not serve yet: nothing else moves
    session = serve(session, "main3")
    session, did = step(session, now)
    assert did == ReplicaPlan(drain=("main2",))
    assert len(endpoints_of(session)) == 2  # main1 and main3: never fewer than before
    now += timedelta(seconds=PROPAGATION + 1)
    session, did = step(session, now)
    assert did == ReplicaPlan(stop=("main2",))
    session, did = step(session, now, {"main2": "node-a"})
    assert did == ReplicaPlan(add=("main2",)) and session.kernels[1].revision == 1
    session = serve(session, "main2")
    session, did = step(session, now)
    assert did == ReplicaPlan(drain=("main1",))
    now += timedelta(seconds=PROPAGATION + 1)
    session, did = step(session, now)
    assert did == ReplicaPlan(stop=("main1",))
    assert [(k.hostname, k.revision) for k in session.kernels] == [("main2", 1), ("main3", 1)]
    assert session.previous is None  # over
    assert plan_rollout(session, now=now, drain_timeout=30, in_flight=0, sampled_at=None) is None


def test_a_second_update_waits_for_the_first() -> None:
    session = with_update(endpoint(replica(1)), update("serve v2"))
    with pytest.raises(Conflict):
        with_update(session, update("serve v3"))


def test_a_rolling_update_of_image_and_slots_makes_new_replicas_of_them_and_leaves_the_old_as_they_run() -> None:
    before = endpoint(replica(1), replica(2)).evolve(driver=Driver.DOCKER, startup_command="serve")
    session = with_update(before, update("serve", image="img:v2", resources={"cpu": "2", "mem": "268435456"}))
    assert (session.image, session.resources) == ("img:v2", {"cpu": "2", "mem": "268435456"})
    assert [(k.image, k.resources) for k in session.kernels] == [("img", {"cpu": "1"})] * 2  # as they run
    assert replica_template(session).image == "img:v2"
    session, did = step(session, T0, {"main3": "node-a"})
    assert did == ReplicaPlan(add=("main3",))
    new = session.kernels[2]
    assert (new.image, new.resources, new.revision) == ("img:v2", {"cpu": "2", "mem": "268435456"}, 1)
    assert replica_template(session) == new  # from now on, the new revision's replica is the template


def test_a_replica_woken_after_an_update_runs_the_new_revision() -> None:
    parked = endpoint(replica(1, parked=True, status=S.TERMINATED, agent=None))
    session = with_update(parked, update("serve v2", image="img:v2", resources={"cpu": "0.5"}))
    woken = with_plan(session, plan(session, 1), now=T0, agents={"main1": "node-b"})
    (kernel,) = woken.kernels
    assert (kernel.image, kernel.resources, kernel.revision, kernel.parked) == ("img:v2", {"cpu": "0.5"}, 1, False)


def test_new_slots_must_fit_the_policy_for_every_replica() -> None:
    policy = UserResourcePolicy(total_resource_slots={"cpu": "4"})
    session = endpoint(replica(1), replica(2))
    check_replica_ceiling(session, fixed_rules(session), user=policy, project=None, replica={"cpu": "2"})
    with pytest.raises(Forbidden) as caught:
        check_replica_ceiling(session, fixed_rules(session), user=policy, project=None, replica={"cpu": "2.5"})
    assert caught.value.field == "resources.cpu"


ADMIN = User(id="admin", name="admin", role=Role.SUPERADMIN, projects=("default",))
RULES = CreationRules(docker_images=("caravan/*",))


def checked(session: Session, **given: Any) -> ReplicaUpdate:
    fields: dict[str, Any] = {"startup_command": None, "environ": None, "image": None, "resources": None, **given}
    return checked_replica_update(session, replica_template(session), rules=RULES, users=[ADMIN], **fields)


def test_an_update_keeps_what_it_does_not_give() -> None:
    session = endpoint(replica(1, resources={"cpu": "1", "mem": "268435456"})).evolve(
        driver=Driver.DOCKER, startup_command="serve", environ={"A": "1"}
    )
    assert checked(session, image="caravan/model:2") == ReplicaUpdate(
        "serve", {"A": "1"}, "caravan/model:2", {"cpu": "1", "mem": "268435456"}
    )
    assert checked(session, resources={"mem": "512m"}).resources == {"cpu": "1", "mem": str(512 * 1024 * 1024)}
    assert checked(session, environ={}).environ == {}


@pytest.mark.parametrize(
    ("driver", "given", "error", "field"),
    [
        (Driver.DOCKER, {}, InvalidInput, "input"),
        (Driver.DOCKER, {"image": "elsewhere/model:1"}, InvalidInput, "image"),  # not allowlisted
        (Driver.DOCKER, {"image": ""}, InvalidInput, "image"),
        (Driver.EXEC, {"image": "caravan/model:2"}, InvalidInput, "image"),  # exec runs no image
        (Driver.DOCKER, {"resources": {"gpu.magic": "1"}}, UnsupportedResource, "resources.gpu.magic"),
        (Driver.DOCKER, {"resources": {"mem": "1m"}}, InvalidInput, "resources.mem"),
        (Driver.DOCKER, {"resources": {"cpu": "0"}}, InvalidInput, "resources.cpu"),
        (Driver.DOCKER, {"startup_command": " "}, InvalidInput, "startupCommand"),
        (Driver.DOCKER, {"environ": {"CARAVAN_X": "1"}}, InvalidInput, "environ.CARAVAN_X"),
    ],
)
def test_a_bad_update_is_refused_naming_its_field(
    driver: Driver, given: dict[str, Any], error: type[Exception], field: str
) -> None:
    session = endpoint(replica(1, resources={"cpu": "1", "mem": "268435456"})).evolve(
        driver=driver, startup_command="serve"
    )
    with pytest.raises(error) as caught:
        checked(session, **given)
    assert getattr(caught.value, "field", None) == field
