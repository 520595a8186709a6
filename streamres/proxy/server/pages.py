"""The operator's pages: the model names a client may ask for, every model's health (JSON,
and a stream of it), Prometheus metrics, and who may see them. I/O shell."""

from __future__ import annotations

import base64
import bisect
import hmac
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio

import streamres
from streamres._shell.apps import install_hint
from streamres.proxy.config import Config
from streamres.proxy.server import asgi
from streamres.proxy.server.asgi import Receive, Scope, Send

__all__ = ["Added", "Pages"]

#: Upper bounds (milliseconds) of the buckets what the proxy added is counted in.
BUCKETS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


class Added:
    """What the proxy added to its answers (milliseconds each): a histogram, as Prometheus
    keeps one."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_MS) + 1)
        self.total = 0.0

    def observe(self, ms: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_MS, ms)] += 1
        self.total += ms

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts by upper bound in seconds, as ``HistogramMetricFamily`` takes."""
        out, seen = [], 0
        for bound, n in zip([*BUCKETS_MS, float("inf")], self.counts, strict=True):
            seen += n
            out.append(("+Inf" if bound == float("inf") else repr(bound / 1000), float(seen)))
        return out


class Pages:
    """The operator's pages of one proxy (its client and configuration)."""

    def __init__(
        self, client: streamres.Client, config: Config, held: Callable[[], tuple[int, int]]
    ) -> None:
        self.client = client
        self.config = config
        self._metrics: Any = None
        #: What the proxy added to each answer (the answers say it as they end).
        self.added = Added()
        #: The answers held now, and what they weigh (bytes).
        self.held = held

    def operator(self, scope: Scope) -> bool:
        """May this request see the health pages and metrics? Always without client keys (a
        private proxy) or with ``public_health``; else with the operator key, as a bearer
        token or as the password of HTTP Basic (what a browser sends for the board)."""
        config = self.config
        if not config.clients or config.public_health:
            return True
        if not config.operator_key:
            return False
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = token.strip()
        if scheme.lower() == "basic":
            try:
                given = base64.b64decode(given, validate=True).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(config.operator_key.encode(), given.encode())

    def models(self) -> dict[str, Any]:
        """The names a client may ask for: the fallback chains first (what a person picking a
        model wants: an answer that survives), then the single models, each in the config's
        order."""
        models = self.config.models
        names = sorted(models, key=lambda name: len(models[name]) < 2)
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "streamres"}
                for name in names
            ],
        }

    def health(self) -> dict[str, Any]:
        """Every model's health, with its reasons and the figures behind them."""
        models = {}
        for name, m in self.client.fleet_metrics().items():
            models[name] = {
                "model": m.model,
                "status": m.health.status,
                "reasons": list(m.health.reasons),
                "breaker": m.breaker,
                "weight": round(m.weight, 3),
                "requests": m.requests,
                "success_rate": m.success_rate,
                "capacity_errors": m.capacity_errors,
                "stalls": m.stalls,
                # Attempts that failed on the proxy's side (its loop too busy), not the model's.
                "client_side_failures": m.client_side_failures,
                "resumes": m.resumes,
                "in_flight": m.in_flight,
                "ttft_p50": m.ttft_p50,
                "latency_p95": m.latency_p95,
                "trend_share": round(m.trend_share, 3),
                "trend": [
                    {
                        "ago": p.ago,
                        "requests": p.requests,
                        "success_rate": p.success_rate,
                        "capacity_error_rate": p.capacity_error_rate,
                        "ttft_p50": p.ttft_p50,
                    }
                    for p in m.trend
                ],
                "breaker_changes": [{"ago": ago, "state": st} for ago, st in m.breaker_changes],
            }
        shared = self.client.shared_status()
        return {
            "models": models,
            "aliases": self.config.models,
            # Shared state (``--redis``): where, and whether this proxy reaches it now.
            "shared": None
            if shared is None
            else {
                "url": shared.url,
                "connected": shared.connected,
                "local_fallbacks": shared.local_fallbacks,
            },
            "time": time.time(),
        }

    async def health_stream(self, receive: Receive, send: Send) -> None:
        await asgi.start(send, 200, "text/event-stream")
        async with anyio.create_task_group() as tg:
            tg.start_soon(asgi.watch_disconnect, receive, tg.cancel_scope)
            while True:
                data = json.dumps(self.health()).encode()
                await asgi.piece(send, b"data: " + data + b"\n\n")
                await anyio.sleep(1.0)

    async def prometheus(self, send: Send) -> None:
        try:
            from prometheus_client import CollectorRegistry, generate_latest
        except ImportError:
            message = "/metrics needs prometheus-client, which is not installed: " + (
                install_hint("prometheus_client")
            )
            await asgi.json_response(send, 501, {"error": {"message": message}})
            return
        if self._metrics is None:
            from streamres.prometheus import register

            self._metrics = CollectorRegistry()
            register(self.client, self._metrics, fleet=True)  # any worker may be scraped
            self._metrics.register(_ProxyCollector(self))
        body = generate_latest(self._metrics)
        await asgi.respond(send, 200, body, "text/plain; version=0.0.4; charset=utf-8")


class _ProxyCollector:
    """This proxy process's own metrics: what it added to its answers, what it holds."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        added = self.pages.added
        yield HistogramMetricFamily(
            "streamres_proxy_added_seconds",
            "Time the proxy added to an answer: its own, outside waiting on the upstream",
            buckets=added.buckets(),
            sum_value=added.total / 1000,
        )
        count, weight = self.pages.held()
        yield GaugeMetricFamily(
            "streamres_proxy_answers_held", "Answers this process holds for readers", count
        )
        yield GaugeMetricFamily(
            "streamres_proxy_answers_held_bytes",
            "What the answers held weigh in memory (what [answers] max_bytes bounds)",
            weight,
        )
