"""Session templates through the real gateway (real Redis; no scheduler): who may use and write which, checks on
write, and sessions created from a template with overrides."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from domain.scheduling_config import DEFAULT_RESOURCES
from domain.users import Role
from gateway.graphql.schema import schema
from stores.known_resources import record_resource_groups
from tests.harness import ADMIN_TOKEN, Caravan, GraphQLErrors

TEMPLATE_FIELDS = """id name ownerId project scope
spec { type driver image startupCommand resourceGroup clusterSize clusterMode preset
       environ { name value } resources { slot amount } kernelRoles { role image resources { slot amount } } }"""
CREATE_TEMPLATE = f"""
mutation($input: CreateSessionTemplateInput!) {{ createSessionTemplate(input: $input) {{ {TEMPLATE_FIELDS} }} }}"""
UPDATE_TEMPLATE = f"""
mutation($id: ID!, $input: UpdateSessionTemplateInput!) {{
  updateSessionTemplate(id: $id, input: $input) {{ {TEMPLATE_FIELDS} }} }}"""
DELETE_TEMPLATE = "mutation($id: ID!) { deleteSessionTemplate(id: $id) }"
TEMPLATES = "{ sessionTemplates { id name scope } }"
TEMPLATE = f"query($id: ID!) {{ sessionTemplate(id: $id) {{ {TEMPLATE_FIELDS} }} }}"
FROM_TEMPLATE = """
mutation($id: ID!, $overrides: SessionOverridesInput!) {
  createSessionFromTemplate(templateId: $id, overrides: $overrides) { sessions { id name status } } }"""

CLUSTER_SPEC = {
    "type": "INTERACTIVE", "driver": "EXEC", "clusterSize": 3,
    "environ": [{"name": "MODE", "value": "train"}, {"name": "LEVEL", "value": "1"}],
    "resources": [{"slot": "cpu", "amount": "0.5"}, {"slot": "mem", "amount": "64m"}],
    "kernelRoles": [{"role": "SUB", "resources": [{"slot": "mem", "amount": "128m"}]}],
}  # fmt: skip


async def create_template(
    caravan: Caravan, token: str, spec: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    payload = {"name": "trainer", "spec": spec or CLUSTER_SPEC, **fields}
    return dict((await caravan.gql(CREATE_TEMPLATE, {"input": payload}, token=token))["createSessionTemplate"])


async def refused(caravan: Caravan, query: str, variables: dict[str, Any], token: str) -> dict[str, Any]:
    """The one error's extensions (code, field) of a request that must fail."""
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(query, variables, token=token)
    [error] = failed.value.errors
    return dict(error["extensions"])


async def test_a_session_from_a_template_takes_its_values_then_the_overrides(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    template = await create_template(caravan, alice)
    assert (template["ownerId"], template["project"], template["scope"]) == ("alice", "default", "PERSONAL")
    assert template["spec"]["kernelRoles"] == [
        {"role": "SUB", "image": None, "resources": [{"slot": "mem", "amount": "128m"}]}
    ]
    overrides = {
        "name": "run-1",
        "environ": [{"name": "LEVEL", "value": "2"}],
        "resources": [{"slot": "cpu", "amount": "0.25"}],
        "clusterSize": 2,
        "kernelRoles": [{"role": "MAIN", "resources": [{"slot": "mem", "amount": "96m"}]}],
    }
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": overrides}, token=alice)
    [created] = data["createSessionFromTemplate"]["sessions"]
    session = await caravan.store.get(created["id"])
    assert session is not None and (session.name, session.owner_id, session.status.value) == (
        "run-1",
        "alice",
        "PENDING",
    )
    assert session.environ == {"MODE": "train", "LEVEL": "2"}
    main, sub = session.kernels
    mib = 1024 * 1024
    assert (main.hostname, Decimal(main.resources["cpu"]), Decimal(main.resources["mem"])) == (
        "main1",
        Decimal("0.25"),
        96 * mib,
    )
    assert (sub.hostname, Decimal(sub.resources["cpu"]), Decimal(sub.resources["mem"])) == (
        "sub1",
        Decimal("0.25"),
        128 * mib,
    )


async def test_overrides_are_checked_in_full_and_nothing_is_created_when_they_are_wrong(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    template = await create_template(caravan, alice)
    cases = [
        ({"name": "x"}, "INVALID_INPUT", "name"),
        ({"name": "run-1", "resources": [{"slot": "cpu", "amount": "-1"}]}, "INVALID_INPUT", "resources.cpu"),
        ({"name": "run-1", "kernelRoles": [{"role": "SUB", "resources": [{"slot": "mem", "amount": "1k"}]}]},
         "INVALID_INPUT", "kernelRoles.sub.resources.mem"),
        ({"name": "run-1", "type": "BATCH"}, "INVALID_INPUT", "startupCommand"),
        ({"name": "run-1", "preset": "nope"}, "INVALID_INPUT", "preset"),
        ({"name": "run-1", "driver": "RAW_EXEC"}, "FORBIDDEN", "driver"),
    ]  # fmt: skip
    for overrides, code, field in cases:
        found = await refused(caravan, FROM_TEMPLATE, {"id": template["id"], "overrides": overrides}, alice)
        assert (found["code"], found.get("field")) == (code, field), overrides
    assert await caravan.store.session_ids(owner_id="alice") == []


async def test_a_template_spec_is_checked_when_written(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    base = {"type": "INTERACTIVE", "driver": "EXEC"}
    cases = [
        ({"name": "  "}, base, "INVALID_INPUT", "name"),
        ({}, {"type": "BATCH", "driver": "EXEC"}, "INVALID_INPUT", "spec.startupCommand"),
        ({}, {**base, "resources": [{"slot": "mem", "amount": "lots"}]}, "INVALID_INPUT", "spec.resources.mem"),
        ({}, {**base, "resources": [{"slot": "warp.drive", "amount": "1"}]}, "UNSUPPORTED_RESOURCE",
         "spec.resources.warp.drive"),
        ({}, {**base, "kernelRoles": [{"role": "SUB", "resources": [{"slot": "cpu", "amount": "0"}]}]},
         "INVALID_INPUT", "spec.kernelRoles.sub.resources.cpu"),
        ({}, {**base, "kernelRoles": [{"role": "SUB"}, {"role": "SUB"}]}, "INVALID_INPUT", "spec.kernelRoles"),
        ({}, {**base, "kernelRoles": [{"role": "MAIN", "image": "other:1"}]}, "INVALID_INPUT",
         "spec.kernelRoles.main.image"),
        ({}, {**base, "clusterSize": 99}, "INVALID_INPUT", "spec.clusterSize"),
        ({}, {**base, "preset": "missing"}, "INVALID_INPUT", "spec.preset"),
        ({}, {**base, "environ": [{"name": "CARAVAN_X", "value": "1"}]}, "INVALID_INPUT", "spec.environ.CARAVAN_X"),
        ({}, {**base, "driver": "RAW_EXEC"}, "FORBIDDEN", "spec.driver"),
        ({"scope": "PROJECT"}, base, "INVALID_INPUT", "project"),
        ({"scope": "PROJECT", "project": "default"}, base, "FORBIDDEN", "project"),
        ({"project": "physics"}, base, "FORBIDDEN", "project"),
    ]  # fmt: skip
    for fields, spec, code, field in cases:
        found = await refused(caravan, CREATE_TEMPLATE, {"input": {"name": "t1", "spec": spec, **fields}}, alice)
        assert (found["code"], found.get("field")) == (code, field), (fields, spec)
    assert (await caravan.gql(TEMPLATES, token=alice))["sessionTemplates"] == []


async def test_personal_templates_are_their_owners_and_their_project_admins(caravan: Caravan) -> None:
    alice = await caravan.user("alice")
    bob = await caravan.user("bob")
    admin = await caravan.user("ada", Role.ADMIN)
    outsider_admin = await caravan.user("olga", Role.ADMIN, projects=("physics",))
    template = await create_template(caravan, alice)
    ids = {"id": template["id"]}
    for token in (bob, outsider_admin):
        assert (await caravan.gql(TEMPLATES, token=token))["sessionTemplates"] == []
        for query, variables in (
            (TEMPLATE, ids),
            (DELETE_TEMPLATE, ids),
            (UPDATE_TEMPLATE, {**ids, "input": {"name": "x"}}),
            (FROM_TEMPLATE, {**ids, "overrides": {"name": "stolen"}}),
        ):
            found = await refused(caravan, query, variables, token)
            assert found["code"] == "NOT_FOUND" and found["field"] in ("id", "templateId")
    assert [t["id"] for t in (await caravan.gql(TEMPLATES, token=admin))["sessionTemplates"]] == [template["id"]]
    renamed = await caravan.gql(UPDATE_TEMPLATE, {**ids, "input": {"name": "trainer v2"}}, token=admin)
    assert renamed["updateSessionTemplate"]["name"] == "trainer v2"
    assert renamed["updateSessionTemplate"]["spec"] == template["spec"]
    data = await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": {"name": "by-admin"}}, token=admin)
    [made] = data["createSessionFromTemplate"]["sessions"]
    made_session = await caravan.store.get(made["id"])
    assert made_session is not None and made_session.owner_id == "ada"  # the viewer's session, not the template owner's
    assert (await caravan.gql(DELETE_TEMPLATE, ids, token=alice))["deleteSessionTemplate"] == template["id"]
    assert (await refused(caravan, TEMPLATE, ids, alice))["code"] == "NOT_FOUND"


async def test_project_templates_are_used_by_members_and_written_by_admins(caravan: Caravan) -> None:
    admin = await caravan.user("ada", Role.ADMIN, projects=("physics",))
    member = await caravan.user("max", projects=("physics", "default"))
    outsider = await caravan.user("bob")
    template = await create_template(caravan, admin, scope="PROJECT", project="physics", name="physics trainer")
    ids = {"id": template["id"]}
    assert (template["scope"], template["project"]) == ("PROJECT", "physics")
    assert [t["name"] for t in (await caravan.gql(TEMPLATES, token=member))["sessionTemplates"]] == ["physics trainer"]
    data = await caravan.gql(
        FROM_TEMPLATE, {**ids, "overrides": {"name": "max-run", "project": "physics"}}, token=member
    )
    [made] = data["createSessionFromTemplate"]["sessions"]
    made_session = await caravan.store.get(made["id"])
    assert made_session is not None and (made_session.owner_id, made_session.project) == ("max", "physics")
    for query, variables in ((UPDATE_TEMPLATE, {**ids, "input": {"name": "mine now"}}), (DELETE_TEMPLATE, ids)):
        assert await refused(caravan, query, variables, member) == {"code": "FORBIDDEN", "field": "id"}
    assert (await refused(caravan, TEMPLATE, ids, outsider))["code"] == "NOT_FOUND"
    await record_resource_groups(caravan.store.redis, caravan.store.keys, ["gpu"])  # a node pool the scheduler saw
    spec = {**CLUSTER_SPEC, "clusterSize": 2, "resourceGroup": "gpu"}
    updated = await caravan.gql(UPDATE_TEMPLATE, {**ids, "input": {"spec": spec}}, token=admin)
    assert (
        updated["updateSessionTemplate"]["spec"]["clusterSize"],
        updated["updateSessionTemplate"]["spec"]["resourceGroup"],
    ) == (2, "gpu")
    bad = {**spec, "resources": [{"slot": "cpu", "amount": "zero"}]}
    found = await refused(caravan, UPDATE_TEMPLATE, {**ids, "input": {"spec": bad}}, admin)
    assert (found["code"], found["field"]) == ("INVALID_INPUT", "spec.resources.cpu")
    assert (await caravan.gql(TEMPLATE, ids, token=admin))["sessionTemplate"]["spec"]["clusterSize"] == 2


async def test_a_raw_exec_template_serves_only_superadmins(caravan: Caravan) -> None:
    """raw_exec is SUPERADMIN-only, and a template is no way around it: a project ADMIN cannot write one, and one a
    SUPERADMIN wrote for a project is refused at use to its members and admins alike."""
    admin = await caravan.user("ada", Role.ADMIN, projects=("physics",))
    member = await caravan.user("max", projects=("physics",))
    raw = {"type": "INTERACTIVE", "driver": "RAW_EXEC"}
    found = await refused(
        caravan,
        CREATE_TEMPLATE,
        {"input": {"name": "root", "spec": raw, "scope": "PROJECT", "project": "physics"}},
        admin,
    )
    assert (found["code"], found["field"]) == ("FORBIDDEN", "spec.driver")
    template = await create_template(caravan, ADMIN_TOKEN, spec=raw, scope="PROJECT", project="physics", name="root")
    ids = {"id": template["id"]}
    for token in (member, admin):
        found = await refused(caravan, FROM_TEMPLATE, {**ids, "overrides": {"name": "as-root"}}, token)
        assert (found["code"], found["field"]) == ("FORBIDDEN", "driver")
        exec_instead = {"name": "not-root", "driver": "EXEC"}  # overriding the driver is the way to use it
        assert await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": exec_instead}, token=token)
    assert await caravan.store.session_ids(owner_id="max") and await caravan.store.session_ids(owner_id="ada")
    data = await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": {"name": "by-super", "project": "physics"}})
    [made] = data["createSessionFromTemplate"]["sessions"]
    made_session = await caravan.store.get(made["id"])
    assert made_session is not None and made_session.driver.value == "raw_exec"


async def test_a_template_may_name_a_preset_and_explicit_resources_win(caravan: Caravan) -> None:
    await caravan.gql("""mutation { createResourcePreset(input: {name: "small", sharedMemory: "8m",
        resources: [{slot: "cpu", amount: "0.5"}, {slot: "mem", amount: "128m"}]}) { name } }""")
    alice = await caravan.user("alice")
    spec = {
        "type": "INTERACTIVE",
        "driver": "DOCKER",
        "image": "caravan/busybox:1",
        "preset": "small",
        "resources": [{"slot": "mem", "amount": "96m"}],
    }
    template = await create_template(caravan, alice, spec=spec)
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "preset-run"}}, token=alice)
    session = await caravan.store.get(data["createSessionFromTemplate"]["sessions"][0]["id"])
    assert session is not None
    assert {k: Decimal(v) for k, v in session.resources.items()} == {"cpu": Decimal("0.5"), "mem": 96 * 1024 * 1024}
    assert session.shared_memory == str(8 * 1024 * 1024)


def field_names(type_name: str) -> set[str]:
    found = schema._schema.get_type(type_name)
    assert found is not None, type_name
    return set(found.fields)  # type: ignore[union-attr]


def test_every_create_session_option_can_be_overridden() -> None:
    missing = field_names("CreateSessionInput") - field_names("SessionOverridesInput")
    assert not missing, f"SessionOverridesInput lacks {missing}"


def test_a_template_holds_every_create_session_option_but_those_of_one_creation() -> None:
    """Nothing but the options of one creation is left out of a template's spec, and the spec reads back whole."""
    per_creation = {"name", "clientToken", "dependencies", "project", "owner", "autoscaling"}
    assert field_names("CreateSessionInput") - field_names("SessionSpecInput") == per_creation
    assert field_names("SessionSpecInput") <= field_names("CreateSessionInput")
    assert field_names("SessionSpec") == field_names("SessionSpecInput")


EVERY_OPTION = {
    "type": "BATCH", "driver": "DOCKER", "image": "caravan/busybox:1", "startupCommand": "echo hi",
    "environ": [{"name": "MODE", "value": "train"}], "resources": [{"slot": "cpu", "amount": "0.5"}],
    "resourceGroup": "default", "startsAt": "1h", "batchTimeout": "2h", "clusterSize": 2,
    "clusterMode": "SINGLE_NODE", "count": 2, "preopenPorts": [8080], "sharedMemory": "32m",
    "designatedAgent": "node-7", "priority": 40, "preset": None,
    "kernelRoles": [{"role": "SUB", "image": None, "resources": [{"slot": "mem", "amount": "128m"}]}],
    "replicas": None, "servicePort": None, "healthCheckPath": None, "healthCheckGrace": None,
}  # fmt: skip
"""A value for every option a template holds (the INFERENCE ones are in tests/e2e/test_inference.py)."""
EVERY_FIELD = (
    "type driver image startupCommand environ { name value } resources { slot amount } resourceGroup "
    "startsAt batchTimeout clusterSize clusterMode count preopenPorts sharedMemory designatedAgent priority "
    "preset kernelRoles { role image resources { slot amount } } replicas servicePort healthCheckPath "
    "healthCheckGrace"
)


async def test_a_template_keeps_every_option_and_a_creation_gets_them(caravan: Caravan) -> None:
    created = await caravan.gql(
        f"mutation($input: CreateSessionTemplateInput!) {{ createSessionTemplate(input: $input) {{ id spec {{ "
        f"{EVERY_FIELD} }} }} }}",
        {"input": {"name": "everything", "spec": EVERY_OPTION}},
    )
    template = created["createSessionTemplate"]
    assert template["spec"] == EVERY_OPTION
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "every"}})
    made = [await caravan.store.get(s["id"]) for s in data["createSessionFromTemplate"]["sessions"]]
    assert [s.name for s in made if s] == ["every-1", "every-2"]  # count
    session = made[0]
    assert session is not None
    assert (
        session.batch_timeout,
        session.preopen_ports,
        session.shared_memory,
        session.designated_agent,
        session.priority,
    ) == (7200.0, (8080,), str(32 * 1024 * 1024), "node-7", 40)
    assert session.starts_at is not None and 3500 < (session.starts_at - session.created_at).total_seconds() <= 3600
    # a USER may not hold what only admins may ask for: checked when written
    alice = await caravan.user("alice")
    found = await refused(caravan, CREATE_TEMPLATE, {"input": {"name": "mine", "spec": EVERY_OPTION}}, alice)
    assert (found["code"], found["field"]) == ("FORBIDDEN", "spec.designatedAgent")


async def test_an_override_clears_a_template_value_with_null(caravan: Caravan) -> None:
    """null clears (createSession's default applies), left out keeps the template's value."""
    await caravan.gql("""mutation { createResourcePreset(input: {name: "small",
        resources: [{slot: "cpu", amount: "0.5"}, {slot: "mem", amount: "128m"}]}) { name } }""")
    alice = await caravan.user("alice")
    spec = {
        "type": "BATCH",
        "driver": "EXEC",
        "startupCommand": "true",
        "preset": "small",
        "batchTimeout": "1h",
        "environ": [{"name": "MODE", "value": "train"}],
        "priority": 5,
    }
    template = await create_template(caravan, alice, spec=spec)
    kept = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "kept"}}, token=alice)
    cleared = await caravan.gql(
        FROM_TEMPLATE,
        {
            "id": template["id"],
            "overrides": {"name": "cleared", "preset": None, "batchTimeout": None, "environ": None, "priority": None},
        },
        token=alice,
    )
    before, after = [
        await caravan.store.get(d["createSessionFromTemplate"]["sessions"][0]["id"]) for d in (kept, cleared)
    ]
    assert before is not None and after is not None
    assert (Decimal(before.resources["cpu"]), before.batch_timeout, before.environ, before.priority) == (
        Decimal("0.5"),
        3600.0,
        {"MODE": "train"},
        5,
    )
    assert (Decimal(after.resources["cpu"]), after.batch_timeout, after.environ, after.priority) == (
        Decimal(DEFAULT_RESOURCES["cpu"]),
        None,
        {},
        10,
    )  # createSession's defaults
    found = await refused(
        caravan, FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "x-1", "type": None}}, alice
    )
    assert (found["code"], found["field"]) == ("INVALID_INPUT", "type")


async def test_a_deleted_preset_names_the_template_and_an_override_clearing_it_makes_it_usable(
    caravan: Caravan,
) -> None:
    await caravan.gql("""mutation { createResourcePreset(input: {name: "small",
        resources: [{slot: "cpu", amount: "0.5"}]}) { name } }""")
    alice = await caravan.user("alice")
    template = await create_template(
        caravan, alice, spec={"type": "INTERACTIVE", "driver": "EXEC", "preset": "small"}, name="notebook"
    )
    await caravan.gql('mutation { deleteResourcePreset(name: "small") }')
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "run-1"}}, token=alice)
    [error] = failed.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", "preset")
    assert "'small'" in error["message"] and "template 'notebook'" in error["message"], error["message"]
    assert "preset: null" in error["message"]
    data = await caravan.gql(
        FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "run-1", "preset": None}}, token=alice
    )
    session = await caravan.store.get(data["createSessionFromTemplate"]["sessions"][0]["id"])
    assert session is not None and Decimal(session.resources["cpu"]) == Decimal(DEFAULT_RESOURCES["cpu"])  # the default


async def test_a_template_image_meeting_an_overriding_driver_that_runs_none_is_refused(caravan: Caravan) -> None:
    """exec runs no image: a docker template's image is refused under driver: EXEC (naming the template), until the
    override clears it."""
    alice = await caravan.user("alice")
    template = await create_template(
        caravan,
        alice,
        name="boxed",
        spec={
            "type": "INTERACTIVE",
            "driver": "DOCKER",
            "image": "caravan/busybox:1",
            "kernelRoles": [{"role": "MAIN", "image": "caravan/busybox:2"}],
        },
    )
    ids = {"id": template["id"]}
    with pytest.raises(GraphQLErrors) as failed:
        await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": {"name": "as-exec", "driver": "EXEC"}}, token=alice)
    [error] = failed.value.errors
    assert (error["extensions"]["code"], error["extensions"]["field"]) == ("INVALID_INPUT", "image")
    assert "template 'boxed'" in error["message"], error["message"]
    without_image = {"name": "as-exec", "driver": "EXEC", "image": None}
    found = await refused(caravan, FROM_TEMPLATE, {**ids, "overrides": without_image}, alice)
    assert (found["code"], found["field"]) == ("INVALID_INPUT", "kernelRoles.main.image")
    role_cleared = {**without_image, "kernelRoles": [{"role": "MAIN", "image": None}]}
    data = await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": role_cleared}, token=alice)
    session = await caravan.store.get(data["createSessionFromTemplate"]["sessions"][0]["id"])
    assert session is not None and (session.driver.value, session.image, session.main_kernel.image) == ("exec", "", "")
    spec_found = await refused(
        caravan,
        CREATE_TEMPLATE,
        {"input": {"name": "t2", "spec": {"type": "INTERACTIVE", "driver": "EXEC", "image": "caravan/busybox:1"}}},
        alice,
    )
    assert (spec_found["code"], spec_found["field"]) == ("INVALID_INPUT", "spec.image")
