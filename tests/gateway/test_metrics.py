"""/metrics: request counters and latency by operation and status; sessions and queues read at scrape time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import GatewayWith, post
from tests.harness import CREATE, Caravan

BATCH = {"name": "metered", "type": "BATCH", "driver": "EXEC", "startupCommand": "exit 0"}


async def scrape(caravan: Caravan) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await caravan.http.get(caravan.url.replace("/graphql", "/metrics"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_after_a_few_requests(gateway_with: GatewayWith) -> None:
    async with gateway_with() as caravan:  # no scheduler: the session stays PENDING in its queue
        before = await scrape(caravan)
        for _ in range(3):
            await caravan.gql("{ viewer { id } }")
        await caravan.gql(CREATE, {"input": BATCH})
        assert (await post(caravan, "{")).status_code == 400
        assert (await post(caravan, "{ nope }")).status_code == 400

        after = await scrape(caravan)
        requests = "caravan_graphql_requests_total"
        assert sample(after, requests, operation="query", status="200") == 3
        assert sample(after, requests, operation="mutation", status="200") == 1
        assert sample(after, requests, operation="none", status="400") == 1  # did not parse
        assert sample(after, requests, operation="query", status="400") == 1  # parsed, did not validate
        latency = "caravan_graphql_request_duration_seconds_count"
        assert sample(after, latency, operation="query", status="200") == 3
        assert sample(after, "caravan_graphql_request_duration_seconds_sum", operation="query", status="200") > 0

        assert sample(before, "caravan_queue_depth_total") == 0
        assert sample(after, "caravan_queue_depth", resource_group="default") == 1
        assert sample(after, "caravan_queue_depth_total") == 1
        assert sample(after, "caravan_sessions", status="PENDING") == 1
        assert sample(after, "caravan_sessions", status="RUNNING") == 0
        assert sample(after, "caravan_sessions_live") == 1
        assert sample(after, "caravan_metrics_store_up") == 1
