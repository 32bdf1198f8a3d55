"""Session templates through the real gateway (real Redis; no scheduler): who may use and write which, checks on
write, and sessions created from a template with overrides."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from common.users import Role
from gateway.graphql.schema import schema
from scheduler.known_groups import record_resource_groups
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


async def create_template(caravan: Caravan, token: str, spec: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
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
    assert template["spec"]["kernelRoles"] == [{"role": "SUB", "image": None,
                                                "resources": [{"slot": "mem", "amount": "128m"}]}]
    overrides = {"name": "run-1", "environ": [{"name": "LEVEL", "value": "2"}],
                 "resources": [{"slot": "cpu", "amount": "0.25"}], "clusterSize": 2,
                 "kernelRoles": [{"role": "MAIN", "resources": [{"slot": "mem", "amount": "96m"}]}]}
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": overrides}, token=alice)
    [created] = data["createSessionFromTemplate"]["sessions"]
    session = await caravan.store.get(created["id"])
    assert session is not None and (session.name, session.owner_id, session.status.value) == ("run-1", "alice", "PENDING")
    assert session.environ == {"MODE": "train", "LEVEL": "2"}
    main, sub = session.kernels
    mib = 1024 * 1024
    assert (main.hostname, Decimal(main.resources["cpu"]), Decimal(main.resources["mem"])) == ("main1", Decimal("0.25"), 96 * mib)
    assert (sub.hostname, Decimal(sub.resources["cpu"]), Decimal(sub.resources["mem"])) == ("sub1", Decimal("0.25"), 128 * mib)


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
        for query, variables in ((TEMPLATE, ids), (DELETE_TEMPLATE, ids), (UPDATE_TEMPLATE, {**ids, "input": {"name": "x"}}),
                                 (FROM_TEMPLATE, {**ids, "overrides": {"name": "stolen"}})):
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
    data = await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": {"name": "max-run", "project": "physics"}}, token=member)
    [made] = data["createSessionFromTemplate"]["sessions"]
    made_session = await caravan.store.get(made["id"])
    assert made_session is not None and (made_session.owner_id, made_session.project) == ("max", "physics")
    for query, variables in ((UPDATE_TEMPLATE, {**ids, "input": {"name": "mine now"}}), (DELETE_TEMPLATE, ids)):
        assert await refused(caravan, query, variables, member) == {"code": "FORBIDDEN", "field": "id"}
    assert (await refused(caravan, TEMPLATE, ids, outsider))["code"] == "NOT_FOUND"
    await record_resource_groups(caravan.store.redis, caravan.store.keys, ["gpu"])  # a node pool the scheduler saw
    spec = {**CLUSTER_SPEC, "clusterSize": 2, "resourceGroup": "gpu"}
    updated = await caravan.gql(UPDATE_TEMPLATE, {**ids, "input": {"spec": spec}}, token=admin)
    assert (updated["updateSessionTemplate"]["spec"]["clusterSize"], updated["updateSessionTemplate"]["spec"]["resourceGroup"]) == (2, "gpu")
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
    found = await refused(caravan, CREATE_TEMPLATE, {"input": {"name": "root", "spec": raw, "scope": "PROJECT",
                                                               "project": "physics"}}, admin)
    assert (found["code"], found["field"]) == ("FORBIDDEN", "spec.driver")
    template = await create_template(caravan, ADMIN_TOKEN, spec=raw, scope="PROJECT", project="physics", name="root")
    ids = {"id": template["id"]}
    for token in (member, admin):
        found = await refused(caravan, FROM_TEMPLATE, {**ids, "overrides": {"name": "as-root"}}, token)
        assert (found["code"], found["field"]) == ("FORBIDDEN", "driver")
        exec_instead = {"name": "not-root", "driver": "EXEC"}  # overriding the driver is the way to use it
        assert (await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": exec_instead}, token=token))
    assert await caravan.store.session_ids(owner_id="max") and await caravan.store.session_ids(owner_id="ada")
    data = await caravan.gql(FROM_TEMPLATE, {**ids, "overrides": {"name": "by-super", "project": "physics"}})
    [made] = data["createSessionFromTemplate"]["sessions"]
    made_session = await caravan.store.get(made["id"])
    assert made_session is not None and made_session.driver.value == "raw_exec"


async def test_a_template_may_name_a_preset_and_explicit_resources_win(caravan: Caravan) -> None:
    await caravan.gql("""mutation { createResourcePreset(input: {name: "small", sharedMemory: "8m",
        resources: [{slot: "cpu", amount: "0.5"}, {slot: "mem", amount: "128m"}]}) { name } }""")
    alice = await caravan.user("alice")
    spec = {"type": "INTERACTIVE", "driver": "EXEC", "preset": "small", "resources": [{"slot": "mem", "amount": "96m"}]}
    template = await create_template(caravan, alice, spec=spec)
    data = await caravan.gql(FROM_TEMPLATE, {"id": template["id"], "overrides": {"name": "preset-run"}}, token=alice)
    session = await caravan.store.get(data["createSessionFromTemplate"]["sessions"][0]["id"])
    assert session is not None
    assert {k: Decimal(v) for k, v in session.resources.items()} == {"cpu": Decimal("0.5"), "mem": 96 * 1024 * 1024}
    assert session.shared_memory == str(8 * 1024 * 1024)


def test_every_create_session_option_can_be_overridden() -> None:
    create = schema.get_type_by_name("CreateSessionInput")
    overrides = schema.get_type_by_name("SessionOverridesInput")
    assert create is not None and overrides is not None
    names = {f.graphql_name or f.python_name for f in overrides.fields}  # type: ignore[union-attr]
    missing = {f.graphql_name or f.python_name for f in create.fields} - names  # type: ignore[union-attr]
    assert not missing, f"SessionOverridesInput lacks {missing}"
