"""``usage`` over GraphQL, ``/usage.csv`` and the Prometheus counters: who sees whose usage, the numbers, the errors
(real Redis and gateway; sessions ended through the session store, as the follower ends them)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from domain.users import Role
from tests.gateway.test_metrics import sample, scrape
from tests.harness import Caravan, GraphQLErrors
from tests.stores.test_usage import T0, new_session, run_and_end

USAGE = """
query Usage($from: Date!, $to: Date!, $groupBy: [UsageGroupBy!], $tz: String! = "UTC") {
  usage(from: $from, to: $to, groupBy: $groupBy, timeZone: $tz) {
    timeZone groupBy
    rows { day user project resourceGroup sessionType seconds kernelSeconds
           slots { slot resourceSeconds hours } utilization { metric averagePercent } }
  }
}
"""
DAY1, DAY2 = T0.date().isoformat(), (T0.date() + timedelta(days=1)).isoformat()


async def ended_sessions(caravan: Caravan) -> None:
    await run_and_end(caravan.store, new_session(owner="alice", project="p1"), T0, 3600)  # 23:00-00:00
    await run_and_end(caravan.store, new_session(owner="bob", project="p2", kernels=2), T0, 7200)  # 23:00-01:00


async def test_each_viewer_sees_only_the_usage_they_may(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("p1",))
    bob = await caravan.user("bob", projects=("p2",))
    p2_admin = await caravan.user("p2-admin", Role.ADMIN, projects=("p2",))
    await ended_sessions(caravan)
    variables = {"from": DAY1, "to": DAY2, "groupBy": ["USER"]}

    async def users(token: str | None = None) -> dict[str, float]:
        data = await caravan.gql(USAGE, variables, **({"token": token} if token else {}))
        return {row["user"]: row["seconds"] for row in data["usage"]["rows"]}

    assert await users(alice) == {"alice": 3600}
    assert await users(bob) == {"bob": 7200}
    assert await users(p2_admin) == {"bob": 7200}
    assert await users() == {"alice": 3600, "bob": 7200}  # the superadmin

    data = await caravan.gql(USAGE, {"from": DAY1, "to": DAY2, "groupBy": ["PROJECT", "DAY"]})
    rows = {(r["project"], r["day"]): r for r in data["usage"]["rows"]}
    assert set(rows) == {("p1", DAY1), ("p2", DAY1), ("p2", DAY2)}
    bob_day2 = rows[("p2", DAY2)]
    assert bob_day2["seconds"] == 3600 and bob_day2["kernelSeconds"] == 7200
    slots = {s["slot"]: s for s in bob_day2["slots"]}
    assert slots["cpu"]["resourceSeconds"] == "3600" and slots["cpu"]["hours"] == 1.0  # 2 kernels × 0.5 cpu × 1 h
    assert slots["sim.shares"]["resourceSeconds"] == "1800"  # 2 × 0.25 shares × 1 h
    assert slots["mem"]["resourceSeconds"] == str(2 * 268435456 * 3600)


async def test_a_bad_period_is_a_typed_error(caravan: Caravan) -> None:
    for variables, field in [
        ({"from": DAY2, "to": DAY1}, "to"),
        ({"from": DAY1, "to": DAY1, "tz": "Nowhere/Land"}, "timeZone"),
    ]:
        try:
            await caravan.gql(USAGE, variables)
        except GraphQLErrors as exc:
            assert exc.codes == ["INVALID_INPUT"] and exc.errors[0]["extensions"]["field"] == field
        else:
            raise AssertionError(f"{variables} was accepted")


async def test_the_csv_export_is_the_same_report_and_errors_are_json(caravan: Caravan) -> None:
    alice = await caravan.user("alice", projects=("p1",))
    await ended_sessions(caravan)
    url = caravan.url.replace("/graphql", "/usage.csv")
    query = {"from": DAY1, "to": DAY2, "groupBy": "project,user"}
    response = await caravan.http.get(url, params=query, headers={"Authorization": f"Bearer {alice}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["user"], r["project"], r["seconds"], r["cpu_seconds"], r["cpu_hours"]) for r in table] == [
        ("alice", "p1", "3600", "1800", "0.5000")
    ]
    refused = await caravan.http.get(url, params=query)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
    bad = await caravan.http.get(
        url, params={**query, "groupBy": "colour"}, headers={"Authorization": f"Bearer {alice}"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "groupBy"
    bad = await caravan.http.get(
        url, params={**query, "from": "yesterday"}, headers={"Authorization": f"Bearer {alice}"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "from"


async def test_prometheus_counts_resource_seconds_by_slot_and_project(caravan: Caravan) -> None:
    await ended_sessions(caravan)
    samples = await scrape(caravan)
    assert sample(samples, "caravan_usage_resource_seconds_total", slot="cpu", project="p1") == 1800
    assert sample(samples, "caravan_usage_resource_seconds_total", slot="cpu", project="p2") == 7200
    assert sample(samples, "caravan_usage_session_seconds_total", project="p2") == 7200
