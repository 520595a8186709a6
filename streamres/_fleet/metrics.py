"""Per-model metrics and health (seed 4.3: per model, never only in total). Pure.

Counters are cumulative; time to first token and latency keep the last 512 samples (p50/p95);
health compares the last 20 requests with the model's whole history. Success falling, latency
rising and capacity errors rising *together* means the pool is about to give out (seed 4.3):
that, an open circuit, or fewer than half of the recent requests succeeding, is **jammed**;
two of them moving together over the last minute against the minutes before (``_fleet/trends``)
is **degrading** — the early warning; any one of the signals alone is **degraded**.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from streamres._fleet.trends import Point, Trend, Verdict

__all__ = ["Health", "ModelMetrics", "RouteStats", "assess", "export", "merge"]

_RECENT = 20
_SAMPLES = 512
#: Times to first token kept per request kind, for first-output limits (recent ones matter).
_LEARNT = 64
_CAPACITY_KINDS = frozenset({"capacity", "rate_limit"})


@dataclass(frozen=True, slots=True)
class Health:
    status: Literal["healthy", "degraded", "degrading", "jammed"]
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """A snapshot of one model's metrics (``Client.metrics()``)."""

    name: str
    model: str
    requests: int
    successes: int
    failures: int
    success_rate: float | None
    capacity_errors: int
    capacity_error_rate: float | None
    stalls: int
    truncations: int
    resumes: int
    fallbacks_from: int
    fallbacks_to: int
    ttft_p50: float | None
    ttft_p95: float | None
    latency_p50: float | None
    latency_p95: float | None
    tokens_delivered: int
    tokens_wasted: int
    in_flight: int
    queued_seconds: float
    #: Seconds left of a cool-down a server asked for (Retry-After), 0 when none.
    cooldown: float
    weight: float
    breaker: str
    health: Health
    #: The last minutes, oldest first, in buckets (``_fleet/trends``): requests, success rate,
    #: capacity-error rate and median time to first token of each.
    trend: tuple[Point, ...] = ()
    #: The share of new traffic the trend leaves this model (1.0; less while degrading).
    trend_share: float = 1.0
    #: The breaker's last changes in this process, oldest first: (seconds ago, new state).
    breaker_changes: tuple[tuple[float, str], ...] = ()
    #: Attempts that failed on this side, not the server's: this process's event loop was too
    #: busy to see the server answer in time (``client_busy``). Not in ``failures``, nor in
    #: the success rate, the breaker or the weight.
    client_side_failures: int = 0


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class RouteStats:
    """Mutable counters of one route."""

    requests: int = 0
    successes: int = 0
    failures: int = 0
    capacity_errors: int = 0
    stalls: int = 0
    truncations: int = 0
    resumes: int = 0
    fallbacks_from: int = 0
    fallbacks_to: int = 0
    tokens_delivered: int = 0
    tokens_wasted: int = 0
    in_flight: int = 0
    #: Attempts that failed on this side (``client_busy``), apart from the server's failures.
    client_side: int = 0
    #: Seconds attempts spent waiting for a pooled connection or a concurrency slot.
    queued_seconds: float = 0.0
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    #: Times to first token by request kind (``stall.request_kind``), which first-output
    #: limits are learnt from: a quick request's says nothing of a reasoning one's.
    learnt: dict[str, deque[float]] = field(
        default_factory=lambda: {k: deque(maxlen=_LEARNT) for k in ("quick", "reasoning")}
    )
    latency: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    #: Text events a second of its last successful answers (``trickle``: its learnt pace).
    pace: deque[float] = field(default_factory=lambda: deque(maxlen=_LEARNT))
    #: (succeeded, capacity error, latency or None) of the last requests.
    recent: deque[tuple[bool, bool, float | None]] = field(
        default_factory=lambda: deque(maxlen=_RECENT)
    )

    def started(self) -> None:
        self.requests += 1
        self.in_flight += 1

    def _first(self, ttft: float | None, kind: str) -> None:
        if ttft is not None:
            self.ttft.append(ttft)
            self.learnt[kind].append(ttft)

    def succeeded(
        self, *, ttft: float | None, latency: float, kind: str = "quick", pace: float | None = None
    ) -> None:
        self.in_flight -= 1
        self.successes += 1
        self._first(ttft, kind)
        if pace is not None:
            self.pace.append(pace)
        self.latency.append(latency)
        self.recent.append((True, False, latency))

    def failed(self, kind: str, *, ttft: float | None, asked: str = "quick") -> None:
        """An attempt failed (``kind``: how; ``asked``: the kind of request it was)."""
        self.in_flight -= 1
        if kind == "client_busy":  # this side's failure: the server's figures stay as they were
            self.requests -= 1
            self.client_side += 1
            return
        self.failures += 1
        capacity = kind in _CAPACITY_KINDS
        self.capacity_errors += capacity
        self.stalls += kind == "stall"
        self.truncations += kind == "truncated"
        self._first(ttft, asked)
        self.recent.append((False, capacity, None))


#: Recent requests needed before health is judged from them.
_JUDGE = 5


def assess(
    stats: RouteStats, breaker: str, cooldown: float = 0.0, verdict: Verdict | None = None
) -> Health:
    """Healthy, degraded, degrading or jammed, and why."""
    reasons: list[str] = []
    if breaker == "open":
        return Health("jammed", ("circuit open after consecutive failures",))
    if cooldown > 0:
        reasons.append(f"cooling down for {cooldown:.0f} s as the server asked (Retry-After)")
    recent = list(stats.recent)
    if len(recent) < _JUDGE:
        if verdict is not None and verdict.degrading:
            return Health("degrading", verdict.reasons + tuple(reasons))
        if reasons:
            return Health("degraded", tuple(reasons))
        # Healthy until shown otherwise, and saying so: 1 of 2 failed is not yet a trend.
        return Health("healthy", (f"too few requests to judge ({len(recent)} of {_JUDGE})",))
    ok_recent = sum(r[0] for r in recent) / len(recent)
    cap_recent = sum(r[1] for r in recent) / len(recent)
    done = stats.successes + stats.failures
    ok_all = stats.successes / done if done else 1.0
    cap_all = stats.capacity_errors / done if done else 0.0
    lat_recent = _quantile([r[2] for r in recent if r[2] is not None], 0.5)
    lat_all = _quantile(list(stats.latency), 0.5)
    success_down = ok_recent < 0.9 and ok_recent <= ok_all
    capacity_up = cap_recent > 0.1 and cap_recent >= cap_all
    latency_up = (
        lat_recent is not None
        and lat_all is not None
        and lat_all > 0
        and lat_recent > 1.5 * lat_all
    )
    if success_down:
        reasons.append(f"success {ok_recent:.0%} over the last {len(recent)} requests")
    if capacity_up:
        reasons.append(f"capacity errors {cap_recent:.0%} of recent requests")
    if latency_up:
        reasons.append("latency rising")
    if ok_recent < 0.5 or (success_down and capacity_up and latency_up):
        return Health("jammed", tuple(reasons))
    if verdict is not None and verdict.degrading:
        return Health("degrading", verdict.reasons + tuple(reasons))
    if reasons:
        return Health("degraded", tuple(reasons))
    return Health("healthy")


def snapshot(
    name: str,
    model: str,
    stats: RouteStats,
    *,
    weight: float,
    breaker: str,
    cooldown: float = 0.0,
    notes: tuple[str, ...] = (),
    trend: Trend | None = None,
    now: float | None = None,
    share: float = 1.0,
    changes: tuple[tuple[float, str], ...] = (),
) -> ModelMetrics:
    done = stats.successes + stats.failures
    verdict = trend.verdict(now) if trend is not None and now is not None else None
    health = assess(stats, breaker, cooldown, verdict)
    if notes:
        health = Health(health.status, health.reasons + notes)
    if stats.client_side:
        side = (
            f"{stats.client_side} attempts failed on this side (its event loop too busy to see "
            "the server answer in time), not counted against the model"
        )
        health = Health(health.status, (*health.reasons, side))
    ttft, latency = list(stats.ttft), list(stats.latency)
    return ModelMetrics(
        name=name,
        model=model,
        requests=stats.requests,
        successes=stats.successes,
        failures=stats.failures,
        success_rate=stats.successes / done if done else None,
        capacity_errors=stats.capacity_errors,
        capacity_error_rate=stats.capacity_errors / done if done else None,
        stalls=stats.stalls,
        truncations=stats.truncations,
        resumes=stats.resumes,
        fallbacks_from=stats.fallbacks_from,
        fallbacks_to=stats.fallbacks_to,
        ttft_p50=_quantile(ttft, 0.5),
        ttft_p95=_quantile(ttft, 0.95),
        latency_p50=_quantile(latency, 0.5),
        latency_p95=_quantile(latency, 0.95),
        tokens_delivered=stats.tokens_delivered,
        tokens_wasted=stats.tokens_wasted,
        in_flight=stats.in_flight,
        queued_seconds=stats.queued_seconds,
        cooldown=cooldown,
        weight=weight,
        breaker=breaker,
        health=health,
        trend=trend.series(now) if trend is not None and now is not None else (),
        trend_share=share,
        breaker_changes=changes,
        client_side_failures=stats.client_side,
    )


#: Samples of time to first token and latency a process shares for the fleet's view.
_SHARED_SAMPLES = 128

_COUNTERS = (
    "requests",
    "successes",
    "failures",
    "capacity_errors",
    "stalls",
    "truncations",
    "resumes",
    "fallbacks_from",
    "fallbacks_to",
    "tokens_delivered",
    "tokens_wasted",
    "in_flight",
    "client_side",
)


def export(stats: RouteStats) -> dict[str, object]:
    """One route's counters and recent samples as plain JSON data, for the fleet's view."""
    out: dict[str, object] = {name: getattr(stats, name) for name in _COUNTERS}
    out["queued_seconds"] = stats.queued_seconds
    out["ttft"] = list(stats.ttft)[-_SHARED_SAMPLES:]
    for kind, samples in stats.learnt.items():
        out[f"ttft_{kind}"] = list(samples)[-_SHARED_SAMPLES:]
    out["latency"] = list(stats.latency)[-_SHARED_SAMPLES:]
    out["recent"] = [list(r) for r in stats.recent]
    return out


def merge(exported: list[dict[str, object]]) -> RouteStats:
    """Many processes' :func:`export` of one route as one: counters summed, samples pooled,
    and health judged over every process's recent requests together. A process's figures
    that do not read (another version's, or damaged) are left out."""
    total = RouteStats()
    recent: list[tuple[bool, bool, float | None]] = []
    for figures in exported:
        data: Any = figures  # JSON from another process: read with care
        try:
            counts = {name: int(data.get(name, 0)) for name in _COUNTERS}
            queued = float(data.get("queued_seconds", 0.0))
            samples = {
                name: [float(x) for x in data.get(name) or []] for name in ("ttft", "latency")
            }
            rows = [
                (bool(r[0]), bool(r[1]), None if r[2] is None else float(r[2]))
                for r in data.get("recent") or []
            ]
        except (TypeError, ValueError, IndexError, AttributeError):
            continue
        for name, value in counts.items():
            setattr(total, name, getattr(total, name) + value)
        total.queued_seconds += queued
        for name, values in samples.items():
            getattr(total, name).extend(values)
        recent.extend(rows)
    total.recent = deque(recent, maxlen=max(_RECENT, len(recent)))
    return total
