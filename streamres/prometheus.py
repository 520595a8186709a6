"""Optional Prometheus exposition of a client's per-model metrics.

Needs the ``prometheus`` extra (``pip install 'streamres[prometheus]'``)::

    from prometheus_client import REGISTRY
    from streamres.prometheus import register

    register(client)            # or register(client, registry=my_registry)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamres._fleet.metrics import ModelMetrics
from streamres._shell.client import Client
from streamres._shell.extras import require

__all__ = ["StreamresCollector", "register"]

require("prometheus_client", "streamres.prometheus")

from prometheus_client.core import (  # noqa: E402  (after the check that names the extra)
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

_COUNTERS = {
    "requests": "Requests sent to the model",
    "successes": "Requests that completed their answer",
    "failures": "Requests that failed (any kind)",
    "capacity_errors": "Capacity and rate-limit refusals",
    "stalls": "Streams abandoned for silence",
    "truncations": "Streams that ended without their terminal event",
    "resumes": "Requests that continued a partial answer",
    "fallbacks_from": "Times an answer moved away from this model",
    "fallbacks_to": "Times an answer moved to this model",
    "tokens_delivered": "Tokens delivered to callers",
    "tokens_wasted": "Tokens generated again after a resume and removed",
}
_GAUGES = {
    "in_flight": "Streams in flight",
    "weight": "Current load-balancing weight",
    "ttft_p50": "Median time to first token (s)",
    "ttft_p95": "95th percentile time to first token (s)",
    "latency_p50": "Median latency of successful requests (s)",
    "latency_p95": "95th percentile latency of successful requests (s)",
}
_BREAKER = {"closed": 0, "half_open": 1, "open": 2}
_HEALTH = {"healthy": 0, "degraded": 1, "degrading": 1.5, "jammed": 2}


def _last_minute(m: ModelMetrics) -> dict[str, float | None]:
    """The trend's buckets of the last minute, summed."""
    points = [p for p in m.trend if p.ago <= 60.0]
    n = sum(p.requests for p in points)
    if not n:
        return {"requests": 0.0}
    ok = sum((p.success_rate or 0.0) * p.requests for p in points)
    cap = sum((p.capacity_error_rate or 0.0) * p.requests for p in points)
    ttfts = sorted(p.ttft_p50 for p in points if p.ttft_p50 is not None)
    return {
        "requests": float(n),
        "success_ratio": ok / n,
        "capacity_error_ratio": cap / n,
        "ttft_seconds": ttfts[len(ttfts) // 2] if ttfts else None,
    }


class StreamresCollector:
    """A custom collector: reads ``client.metrics()`` at each scrape — or, with ``fleet=True``,
    ``client.fleet_metrics()``: the sum over every process sharing state through Redis (for an
    endpoint that any one of them may answer, like ``streamres proxy --workers``; a process
    that stops takes its counts with it, which Prometheus reads as a counter reset)."""

    def __init__(self, client: Client, *, fleet: bool = False) -> None:
        self._client = client
        self._fleet = fleet

    def collect(self) -> Iterator[Metric]:
        snapshot = self._client.fleet_metrics() if self._fleet else self._client.metrics()
        for name, doc in _COUNTERS.items():
            family = CounterMetricFamily(f"streamres_{name}", doc, labels=["model"])
            for key, m in snapshot.items():
                family.add_metric([key], float(getattr(m, name)))
            yield family
        for name, doc in _GAUGES.items():
            gauge = GaugeMetricFamily(f"streamres_{name}", doc, labels=["model"])
            for key, m in snapshot.items():
                value = getattr(m, name)
                if value is not None:
                    gauge.add_metric([key], float(value))
            yield gauge
        breaker = GaugeMetricFamily(
            "streamres_breaker_state", "0 closed, 1 half-open, 2 open", labels=["model"]
        )
        health = GaugeMetricFamily(
            "streamres_health", "0 healthy, 1 degraded, 1.5 degrading, 2 jammed", labels=["model"]
        )
        trend = {
            name: GaugeMetricFamily(f"streamres_last_minute_{name}", text, labels=["model"])
            for name, text in (
                ("success_ratio", "success rate over the last minute"),
                ("capacity_error_ratio", "capacity-error rate over the last minute"),
                ("ttft_seconds", "median time to first token over the last minute"),
                ("requests", "requests over the last minute"),
            )
        }
        share = GaugeMetricFamily(
            "streamres_trend_share",
            "share of new traffic the trend leaves (1: all)",
            labels=["model"],
        )
        for key, m in snapshot.items():
            breaker.add_metric([key], _BREAKER[m.breaker])
            health.add_metric([key], _HEALTH[m.health.status])
            share.add_metric([key], m.trend_share)
            for name, value in _last_minute(m).items():
                if value is not None:
                    trend[name].add_metric([key], value)
        yield breaker
        yield health
        yield share
        yield from trend.values()
        yield from self._fleet_wide()

    def _fleet_wide(self) -> Iterator[Metric]:
        """The cache's savings and shared state's reachability, when the client has them."""
        stats = self._client.cache_stats()
        if stats is not None:
            for name, value, doc in (
                ("cache_hits", stats.hits, "Answers streamed from the cache"),
                (
                    "cache_semantic_hits",
                    stats.semantic_hits,
                    "Answers streamed from the cache for a question asked in other words",
                ),
                ("cache_misses", stats.misses, "Cacheable requests not in the cache"),
                ("single_flight_joins", stats.joins, "Requests that joined one in flight"),
                ("requests_saved", stats.requests_saved, "Upstream requests not made"),
            ):
                counter = CounterMetricFamily(f"streamres_{name}", doc)
                counter.add_metric([], float(value))
                yield counter
        shared = self._client.shared_status()
        if shared is not None:
            up = GaugeMetricFamily(
                "streamres_shared_connected", "1 while shared state (Redis) is reachable"
            )
            up.add_metric([], 1.0 if shared.connected else 0.0)
            yield up
            local = CounterMetricFamily(
                "streamres_shared_local_fallbacks",
                "Slots taken with this process's own limits while Redis was away",
            )
            local.add_metric([], float(shared.local_fallbacks))
            yield local


def register(client: Client, registry: Any = None, *, fleet: bool = False) -> StreamresCollector:
    """Expose ``client``'s metrics on ``registry`` (the default registry if None); ``fleet``:
    summed over the processes sharing its state (:class:`StreamresCollector`)."""
    collector = StreamresCollector(client, fleet=fleet)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
