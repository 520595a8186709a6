"""The shared state of every stream of a client: per route a breaker, a weight, a cool-down and
metrics, plus one retry budget. Pure: every method takes ``now``; the shell does the waiting.

``record_*`` methods return the breaker transition (or ``None``) so the shell can log state
changes; nothing here logs or sleeps.

What other processes should learn of — a breaker that opened or closed, a cool-down, a weight
that moved, a deposit to or refund from the retry budget — is *news*: frozen records the fleet
keeps in :attr:`Fleet.news` while :attr:`Fleet.telling` (shared state is attached) and the
shell takes (:meth:`Fleet.take_news`) and sends. The fleet calls nothing of the shell's: the
seam is these records, as the answer machine's is its actions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from streamres._core.events import Usage
from streamres._fleet.balance import RetryBudget, Weight
from streamres._fleet.breaker import BreakerState, CircuitBreaker
from streamres._fleet.metrics import ModelMetrics, RouteStats, export, merge, snapshot
from streamres._fleet.routes import Route, fallback_order, pick_weighted
from streamres._fleet.trends import Trend

__all__ = [
    "HEALTH_KINDS",
    "MAX_COOLDOWN",
    "Budgeted",
    "Changed",
    "Fleet",
    "News",
    "Weighed",
]

#: The longest cool-down one Retry-After imposes on a model (seconds). Hints up to a day are
#: read, but a model is passed over for at most this long before it is tried again.
MAX_COOLDOWN = 300.0

#: Failure kinds that count against a model's health (breaker, weight).
HEALTH_KINDS = frozenset(
    {
        "capacity",
        "rate_limit",
        "transient",
        "connection",
        "stall",
        "truncated",
        "malformed",
        "slow",
    }
)


@dataclass(frozen=True, slots=True)
class Changed:
    """Model ``index`` refuses requests until ``until`` (this process's clock): its breaker
    opened (``open``) or a Retry-After began a cool-down (``cooldown``); or it recovered
    (``closed``)."""

    index: int
    kind: Literal["open", "cooldown", "closed"]
    until: float


@dataclass(frozen=True, slots=True)
class Weighed:
    """Model ``index``'s weight moved after a success or a failure."""

    index: int
    outcome: Literal["success", "failure"]


@dataclass(frozen=True, slots=True)
class Budgeted:
    """A retry-budget token was deposited (an answer began) or refunded (a retry not made)."""

    op: Literal["deposit", "refund"]


News = Changed | Weighed | Budgeted


@dataclass
class _RouteState:
    route: Route
    breaker: CircuitBreaker
    weight: Weight
    stats: RouteStats = field(default_factory=RouteStats)
    cooldown_until: float = 0.0
    #: Answers whose delivered tokens are counted when first needed (see ``tokens_later``).
    owed: list[Usage] = field(default_factory=list)
    #: The last minutes of outcomes (``_fleet/trends``), and the share of new traffic the
    #: trend leaves the model (×0.7 per outcome while degrading, back by a quarter of the gap
    #: per outcome once not).
    trend: Trend = field(default_factory=Trend)
    share: float = 1.0
    #: The breaker's last changes: (when, the state it went to).
    changes: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=16))


#: The least share of new traffic a degrading model keeps (it must be able to show it is
#: better), and the steps the share moves by.
_SHARE_FLOOR, _SHARE_PENALTY, _SHARE_RESTORE = 0.1, 0.7, 0.25


#: Answers whose token counts a route may owe before they are settled at once.
_MAX_OWED = 256


class Fleet:
    def __init__(
        self,
        routes: Sequence[Route],
        *,
        breaker_threshold: int = 3,
        breaker_recovery: float = 60.0,
        budget: RetryBudget | None = None,
    ) -> None:
        self.routes = tuple(routes)
        self.states = [
            _RouteState(
                r,
                CircuitBreaker(threshold=breaker_threshold, recovery=breaker_recovery),
                Weight(base=r.weight),
            )
            for r in self.routes
        ]
        self.by_key = {r.key: i for i, r in enumerate(self.routes)}
        self.budget = budget or RetryBudget()
        #: Keep news for other processes (shared state is attached: it takes them).
        self.telling = False
        #: What other processes should learn, oldest first (see the module's docstring).
        self.news: list[News] = []
        #: Reasons that apply to every model's health (e.g. shared state unavailable).
        self.notes: list[str] = []
        #: Whether a degrading model's share of new traffic follows its trend (the verdict is
        #: reported either way).
        self.steering = True
        #: Other processes' recent times to first token, by route key (shared state sets them
        #: at each sync): a model's first-output limit learns from the whole fleet.
        self.peer_ttft: dict[tuple[str, str], tuple[float, ...]] = {}

    def pace_samples(self, i: int) -> list[float]:
        """Route ``i``'s pace (text events a second) in its last successful answers."""
        return list(self.states[i].stats.pace)

    def ttft_samples(self, i: int, kind: str = "quick") -> list[float]:
        """Route ``i``'s recent times to first token for requests of ``kind``
        (``stall.request_kind``): this process's, then the fleet's."""
        own = self.states[i].stats.learnt[kind]
        return [*own, *self.peer_ttft.get((self.routes[i].key, kind), ())]

    # -- choosing -------------------------------------------------------------------------

    def chain(self, model: str | Sequence[str] | None, *, fallback: bool, rand: float) -> list[int]:
        """Route indices to try, in order, for a ``model=`` argument."""
        weights = [s.weight.current * s.share for s in self.states]
        if model is None:
            primary = pick_weighted(range(len(self.routes)), weights, rand)
        elif isinstance(model, str):
            primary = self.by_key[model]
        else:
            return [self.by_key[m] for m in model]
        return fallback_order(self.routes, primary, weights) if fallback else [primary]

    def try_acquire(self, i: int, now: float) -> bool:
        """May an attempt go to route ``i`` now (breaker closed, or this is the probe)?"""
        return self.states[i].breaker.try_acquire(now)

    def available_at(self, i: int, now: float) -> float:
        s = self.states[i]
        return max(s.breaker.available_at(now), s.cooldown_until)

    def probing(self, i: int) -> bool:
        """Is route ``i`` half-open with its one probe in flight?"""
        b = self.states[i].breaker
        return b.state == "half_open" and b.probe_out

    def cooldown_left(self, i: int, now: float) -> float:
        return max(0.0, self.states[i].cooldown_until - now)

    # -- news for other processes ---------------------------------------------------------

    def _tell(self, news: News) -> None:
        if self.telling:
            self.news.append(news)

    def take_news(self) -> list[News]:
        """The news kept since the last take, oldest first."""
        news, self.news = self.news, []
        return news

    # -- the retry budget -----------------------------------------------------------------

    def deposit(self, now: float) -> None:
        """An answer began: the retry budget earns its share of a token."""
        self.budget.deposit(now)
        self._tell(Budgeted("deposit"))

    def reserve(self, now: float) -> float:
        """A retry takes the next token: seconds until it is there (``RetryBudget.reserve``)."""
        return self.budget.reserve(now)

    def refund(self) -> None:
        """A token reserved for a retry that will not be made goes back."""
        self.budget.refund()
        self._tell(Budgeted("refund"))

    # -- recording ------------------------------------------------------------------------

    def started(self, i: int, now: float, *, resume: bool) -> None:
        s = self.states[i]
        s.breaker.record_start(now)
        stats = s.stats
        stats.started()
        stats.resumes += resume

    def succeeded(
        self,
        i: int,
        now: float,
        *,
        ttft: float | None,
        latency: float,
        asked: str = "quick",
        pace: float | None = None,
    ) -> BreakerState | None:
        """Route ``i``'s attempt succeeded (``asked``: the kind of request it was; ``pace``:
        its text events a second, once it streamed)."""
        s = self.states[i]
        before = s.breaker.state
        s.stats.succeeded(ttft=ttft, latency=latency, kind=asked, pace=pace)
        s.trend.record(now, ok=True, capacity=False, ttft=ttft)
        self._steer(s, now)
        if s.weight.current < s.weight.base:
            s.weight.success()
            self._tell(Weighed(i, "success"))
        after = s.breaker.record_success(now)
        if before != "closed":
            self._tell(Changed(i, "closed", now))
        if after != before:
            s.changes.append((now, after))
        return after if after != before else None

    def failed(
        self,
        i: int,
        now: float,
        kind: str,
        *,
        ttft: float | None,
        retry_after: float | None,
        asked: str = "quick",
    ) -> BreakerState | None:
        s = self.states[i]
        s.stats.failed(kind, ttft=ttft, asked=asked)
        if retry_after is not None:
            s.cooldown_until = max(s.cooldown_until, now + min(retry_after, MAX_COOLDOWN))
            self._tell(Changed(i, "cooldown", s.cooldown_until))
        if kind not in HEALTH_KINDS or (kind == "rate_limit" and retry_after is not None):
            # A permanent error says nothing of health; a 429 that says when to come back is a
            # quota's cool-down (kept above), not a broken model: neither moves the breaker.
            s.breaker.record_neutral()
            return None
        s.trend.record(now, ok=False, capacity=kind in ("capacity", "rate_limit"), ttft=ttft)
        self._steer(s, now)
        before = s.breaker.state
        s.weight.failure()
        self._tell(Weighed(i, "failure"))
        after = s.breaker.record_failure(now)
        if after == "open" and before != "open":
            self._tell(Changed(i, "open", s.breaker.available_at(now)))
        if after != before:
            s.changes.append((now, after))
        return after if after != before else None

    def _steer(self, s: _RouteState, now: float) -> None:
        """Move the model's share of new traffic with its trend (see ``_fleet/trends``)."""
        if self.steering and s.trend.verdict(now).degrading:
            s.share = max(_SHARE_FLOOR, s.share * _SHARE_PENALTY)
        else:
            s.share = min(1.0, s.share + (1.0 - s.share) * _SHARE_RESTORE)

    def apply(self, i: int, kind: str, until: float) -> None:
        """What another process found (shared state), in this process's clock."""
        s = self.states[i]
        if kind == "open":
            s.breaker.open_until(until)
        elif kind == "closed":
            if not (s.breaker.state == "half_open" and s.breaker.probe_out):
                s.breaker.record_success(until)
        elif kind == "cooldown":
            s.cooldown_until = max(s.cooldown_until, min(until, until + MAX_COOLDOWN))

    def set_weight(self, i: int, weight: float) -> None:
        """A weight the fleet's processes arrived at together (shared state)."""
        w = self.states[i].weight
        w.current = min(w.base, max(w.base * w.floor, weight))

    def exported(self, now: float | None = None) -> dict[str, dict[str, object]]:
        """Every route's counters as plain data, for the fleet's view (shared state); with
        ``now``, its trend too."""
        out = {}
        for s in self.states:
            if s.owed:
                self._settle(s)
            out[s.route.key] = export(s.stats)
            if now is not None:
                out[s.route.key]["trend"] = s.trend.export(now)
        return out

    def fleet_metrics(
        self, exported: list[dict[str, dict[str, object]]], now: float | None = None
    ) -> dict[str, ModelMetrics]:
        """Metrics summed over processes' :meth:`exported` data; weights, breakers and
        cool-downs are this process's (shared state keeps them the same)."""
        out = {}
        for s in self.states:
            mine = [e[s.route.key] for e in exported if s.route.key in e]
            trend = None
            if now is not None:
                trend = Trend.merged([_trend_rows(e) for e in mine], now)
            out[s.route.key] = snapshot(
                s.route.key,
                s.route.model,
                merge(mine),
                weight=s.weight.current,
                breaker=s.breaker.state,
                cooldown=max(0.0, s.cooldown_until - now) if now is not None else 0.0,
                notes=tuple(self.notes),
                trend=trend,
                now=now,
                share=s.share,
                changes=_ago(s.changes, now),
            )
        return out

    def queued(self, i: int, seconds: float) -> None:
        """An attempt waited ``seconds`` for a pooled connection (never a model failure)."""
        if seconds > 0:
            self.states[i].stats.queued_seconds += seconds

    def release(self, i: int) -> None:
        """An attempt was let through but never started: free its breaker probe."""
        self.states[i].breaker.record_neutral()

    def abandoned(self, i: int) -> None:
        """A started attempt ended without an outcome (the caller cancelled): neutral."""
        s = self.states[i]
        s.stats.in_flight -= 1
        s.breaker.record_neutral()

    def not_sent(self, i: int, *, resume: bool) -> None:
        """A started attempt was withdrawn before its request went out (another process holds
        the model's probe): as if it had never started."""
        s = self.states[i]
        s.stats.in_flight -= 1
        s.stats.requests -= 1
        s.stats.resumes -= resume
        s.breaker.record_neutral()

    def fell_back(self, from_i: int, to_i: int) -> None:
        self.states[from_i].stats.fallbacks_from += 1
        self.states[to_i].stats.fallbacks_to += 1

    def tokens(self, i: int, *, delivered: int, wasted: int) -> None:
        stats = self.states[i].stats
        stats.tokens_delivered += delivered
        stats.tokens_wasted += wasted

    def tokens_later(self, i: int, usage: Usage) -> None:
        """An answer's delivered tokens, counted when metrics are read (or its usage is)."""
        owed = self.states[i].owed
        owed.append(usage)
        if len(owed) > _MAX_OWED:
            self._settle(self.states[i])

    def _settle(self, s: _RouteState) -> None:
        for usage in s.owed:
            s.stats.tokens_delivered += usage.delivered_tokens
        s.owed.clear()

    # -- reading --------------------------------------------------------------------------

    def metrics(self, now: float | None = None) -> dict[str, ModelMetrics]:
        """Every route's metrics; with ``now``, cool-downs still running are reported."""
        for s in self.states:
            if s.owed:
                self._settle(s)
        return {
            s.route.key: snapshot(
                s.route.key,
                s.route.model,
                s.stats,
                weight=s.weight.current,
                breaker=s.breaker.state,
                cooldown=max(0.0, s.cooldown_until - now) if now is not None else 0.0,
                notes=tuple(self.notes),
                trend=s.trend if now is not None else None,
                now=now,
                share=s.share,
                changes=_ago(s.changes, now),
            )
            for s in self.states
        }


def _ago(changes: deque[tuple[float, str]], now: float | None) -> tuple[tuple[float, str], ...]:
    if now is None:
        return ()
    return tuple((round(now - at, 3), state) for at, state in changes)


def _trend_rows(figures: dict[str, object]) -> list[list[float]]:
    rows = figures.get("trend")
    return rows if isinstance(rows, list) else []
