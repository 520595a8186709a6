"""Each model's signals over the last minutes, and the early warning they give. Pure.

Theory of operation. Operators watch three signals per model — success rate, time to first
token, the rate of "at capacity" — and when they move together the pool is about to give out
(seed §4.3): shift traffic *before* it does. A :class:`Trend` keeps, per model, the outcomes of
the last :data:`SPAN` seconds in buckets of :data:`BUCKET` seconds (bounded: a fixed number of
buckets, a fixed number of time-to-first-token samples in each), with ``now`` passed in.

:meth:`Trend.verdict` compares the last minute (:data:`RECENT`) with the minutes before it:

- **success falling** — the last minute's success rate at least 5 points under the earlier one;
- **capacity errors rising** — their share at least 5 points over the earlier one;
- **time to first token rising** — the last minute's median at least 1.25 × the earlier one.

Two or more of them together, each side with at least :data:`JUDGE` requests, is
**degrading**. It is not jammed (the breaker and the last 20 requests decide that): it is the
warning before it. The balancer acts on it gradually (``Fleet``): while a model is degrading,
each of its outcomes multiplies its share of new traffic by 0.7 (never under 0.1); once it is
not, each outcome wins back a quarter of the gap — the seed's ×0.7 rule, applied to a trend.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["BUCKET", "JUDGE", "RECENT", "SPAN", "Point", "Trend", "Verdict"]

#: Seconds per bucket, seconds of history kept, seconds that count as "the last minute".
BUCKET, SPAN, RECENT = 10.0, 300.0, 60.0
#: Requests each side of the comparison needs before a trend is read.
JUDGE = 20
#: Time-to-first-token samples kept per bucket.
_SAMPLES = 32


@dataclass
class _Bucket:
    index: int
    requests: int = 0
    successes: int = 0
    capacity: int = 0
    ttft: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Point:
    """One bucket of a model's history: ``ago`` seconds before now (its start)."""

    ago: float
    requests: int
    success_rate: float | None
    capacity_error_rate: float | None
    ttft_p50: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    degrading: bool
    reasons: tuple[str, ...] = ()


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class Trend:
    """A model's outcomes over the last :data:`SPAN` seconds, by :data:`BUCKET`."""

    def __init__(self) -> None:
        self._buckets: deque[_Bucket] = deque(maxlen=int(SPAN / BUCKET))

    def _bucket(self, now: float) -> _Bucket:
        index = int(now // BUCKET)
        if not self._buckets or self._buckets[-1].index < index:
            self._buckets.append(_Bucket(index))
        return self._buckets[-1]

    def record(self, now: float, *, ok: bool, capacity: bool, ttft: float | None) -> None:
        b = self._bucket(now)
        b.requests += 1
        b.successes += ok
        b.capacity += capacity
        if ttft is not None and len(b.ttft) < _SAMPLES:
            b.ttft.append(ttft)

    def _live(self, now: float) -> list[_Bucket]:
        oldest = int(now // BUCKET) - int(SPAN / BUCKET) + 1
        return [b for b in self._buckets if b.index >= oldest]

    def series(self, now: float) -> tuple[Point, ...]:
        """The buckets with requests, oldest first."""
        return tuple(
            Point(
                ago=round(now - b.index * BUCKET, 3),
                requests=b.requests,
                success_rate=_rate(b.successes, b.requests),
                capacity_error_rate=_rate(b.capacity, b.requests),
                ttft_p50=statistics.median(b.ttft) if b.ttft else None,
            )
            for b in self._live(now)
        )

    def verdict(self, now: float) -> Verdict:
        split = int((now - RECENT) // BUCKET)
        recent = [b for b in self._live(now) if b.index > split]
        before = [b for b in self._live(now) if b.index <= split]
        return judge(recent, before)

    # -- many processes --------------------------------------------------------------------

    def export(self, now: float) -> list[list[float]]:
        """The buckets as plain data, each ``[seconds ago, requests, successes, capacity
        errors, ttft median or -1]``, for the fleet's view (shared state)."""
        return [
            [
                round(now - b.index * BUCKET, 3),
                b.requests,
                b.successes,
                b.capacity,
                statistics.median(b.ttft) if b.ttft else -1.0,
            ]
            for b in self._live(now)
        ]

    @classmethod
    def merged(cls, exported: list[list[list[float]]], now: float) -> Trend:
        """Many processes' :meth:`export` as one trend, in this process's clock."""
        trend = cls()
        rows: dict[int, _Bucket] = {}
        for figures in exported:
            for row in figures:
                try:
                    ago, requests, successes, capacity, ttft = (float(x) for x in row)
                except (TypeError, ValueError):
                    continue  # another version's, or damaged: left out
                index = int((now - ago) // BUCKET)
                b = rows.setdefault(index, _Bucket(index))
                b.requests += int(requests)
                b.successes += int(successes)
                b.capacity += int(capacity)
                if ttft >= 0:
                    b.ttft.append(ttft)
        for index in sorted(rows)[-int(SPAN / BUCKET) :]:
            trend._buckets.append(rows[index])
        return trend


def judge(recent: list[_Bucket], before: list[_Bucket]) -> Verdict:
    """Degrading when two signals move together (see the module)."""
    n_recent = sum(b.requests for b in recent)
    n_before = sum(b.requests for b in before)
    if n_recent < JUDGE or n_before < JUDGE:
        return Verdict(False)
    ok_now = sum(b.successes for b in recent) / n_recent
    ok_then = sum(b.successes for b in before) / n_before
    cap_now = sum(b.capacity for b in recent) / n_recent
    cap_then = sum(b.capacity for b in before) / n_before
    ttft_now = [t for b in recent for t in b.ttft]
    ttft_then = [t for b in before for t in b.ttft]
    reasons = []
    if ok_now <= ok_then - 0.05:
        reasons.append(f"success {ok_now:.0%} in the last minute, {ok_then:.0%} before")
    if cap_now >= cap_then + 0.05:
        reasons.append(f"capacity errors {cap_now:.0%} in the last minute, {cap_then:.0%} before")
    if ttft_now and ttft_then:
        p_now, p_then = statistics.median(ttft_now), statistics.median(ttft_then)
        if p_then > 0 and p_now >= 1.25 * p_then:
            reasons.append(
                f"time to first token {p_now * 1000:.0f} ms in the last minute, "
                f"{p_then * 1000:.0f} ms before"
            )
    return Verdict(len(reasons) >= 2, tuple(reasons) if len(reasons) >= 2 else ())
