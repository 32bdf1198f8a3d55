"""``/metrics`` of the inference endpoints: the endpoint control plane's latest reading of HAProxy's counters
(``stores.endpoint_access.EndpointStats``), read from Redis at each scrape, one series per endpoint (``session``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stores.endpoint_access import EndpointStats

GAUGES = (
    ("requests_per_second", "Requests per second over the last sample interval."),
    ("in_flight", "Requests being served by a replica or queued for one."),
    ("held", "Requests the activator holds, waiting for a routable replica."),
    ("replicas_routable", "Replicas in the endpoint's HAProxy backend."),
    ("avg_response_ms", "HAProxy's average time to the answer's headers, last 1024 requests (ms)."),
    ("avg_total_ms", "HAProxy's average total time of a request, last 1024 requests (ms)."),
    ("p50_ms", "Median time to the answer's headers over the last 1024 requests (ms)."),
    ("p99_ms", "99th percentile of the time to the answer's headers over the last 1024 requests (ms)."),
)
COUNTERS = (
    ("requests", "requests_total", "Requests the endpoint received (since this HAProxy started)."),
    ("errors", "errors_total", "5xx answers, failed connections and responses (since this HAProxy started)."),
)


class EndpointCollector(Collector):
    def __init__(self) -> None:
        self.stats: dict[str, EndpointStats] = {}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, description in GAUGES:
            gauge = GaugeMetricFamily(f"caravan_endpoint_{name}", description, labels=["session"])
            for session_id, stats in sorted(self.stats.items()):
                value = getattr(stats, name)
                if value is not None:
                    gauge.add_metric([session_id], float(value))
            yield gauge
        for name, field, description in COUNTERS:
            counter = CounterMetricFamily(f"caravan_endpoint_{name}", description, labels=["session"])
            for session_id, stats in sorted(self.stats.items()):
                counter.add_metric([session_id], float(getattr(stats, field)))
            yield counter
