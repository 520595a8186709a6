"""Trends and the early warning: a model's last minutes of success, time to first token and
capacity errors, a ``degrading`` verdict when they move together, and traffic moved away before
the breaker opens — driven with a simulated clock through the pure fleet."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamres
from streamres._fleet.fleet import Fleet
from streamres._fleet.trends import BUCKET, SPAN, Trend


def _fleet() -> Fleet:
    return Fleet(
        [
            streamres.Route("a", base_url="http://a/v1"),
            streamres.Route("b", base_url="http://b/v1"),
        ],
        breaker_threshold=3,
        breaker_recovery=30.0,
    )


def _second(fleet: Fleet, now: float, *, fail: float, ttft: float, rng: random.Random) -> None:
    """Two requests to model a in one second: each a capacity error with probability
    ``fail``, else a success whose first token took ``ttft``."""
    for k in range(2):
        t = now + k * 0.5
        if not fleet.try_acquire(0, t):
            continue
        fleet.started(0, t, resume=False)
        if rng.random() < fail:
            fleet.failed(0, t, "capacity", ttft=None, retry_after=None)
        else:
            fleet.succeeded(0, t, ttft=ttft, latency=ttft + 1.0)


def test_a_model_goes_healthy_degrading_jammed_and_back_with_its_traffic_following() -> None:
    fleet, rng = _fleet(), random.Random(3)
    seen: list[tuple[float, str, float]] = []
    warned: tuple[str, ...] = ()
    # 0-180 s healthy; 180-240 s sliding (a quarter refused, first token 3x slower);
    # 240-260 s at capacity; then recovered.
    for now in range(0, 420):
        if now < 180:
            fail, ttft = 0.0, 0.2
        elif now < 240:
            fail, ttft = 0.25, 0.6
        elif now < 260:
            fail, ttft = 1.0, 0.6
        else:
            fail, ttft = 0.0, 0.2
        _second(fleet, float(now), fail=fail, ttft=ttft, rng=rng)
        m = fleet.metrics(float(now) + 1)["a"]
        seen.append((now, m.health.status, m.trend_share))
        if m.health.status == "degrading" and not warned:
            warned = m.health.reasons
    statuses = [s for _, s, _ in seen]
    order = [s for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s]
    # healthy → degrading → jammed → … → healthy (degraded may come between, never before
    # the warning: the warning comes first)
    assert order[0] == "healthy" and order[-1] == "healthy"
    first_degrading = statuses.index("degrading")
    first_jammed = statuses.index("jammed")
    assert 180 <= first_degrading < first_jammed, order
    assert "jammed" not in statuses[:first_degrading]
    # The share of new traffic fell while degrading, before the breaker opened, and came back.
    share_at_jam = seen[first_jammed][2]
    assert share_at_jam < 0.5
    assert seen[-1][2] > 0.95
    # The warning says which signals moved together, against the minutes before.
    moved = [r for r in warned if "in the last minute" in r]
    assert len(moved) >= 2, warned


def test_traffic_moves_to_the_other_model_while_one_is_degrading() -> None:
    """``model=None`` picks by weight × the trend's share: while a is degrading, b gets most new
    answers, before a's breaker has opened."""
    fleet, rng = _fleet(), random.Random(1)
    for now in range(0, 230):
        fail, ttft = (0.0, 0.2) if now < 180 else (0.3, 0.7)
        _second(fleet, float(now), fail=fail, ttft=ttft, rng=rng)
    m = fleet.metrics(231.0)["a"]
    assert m.health.status == "degrading" and m.breaker == "closed"
    picks = [fleet.chain(None, fallback=False, rand=rng.random())[0] for _ in range(1000)]
    assert picks.count(1) > 700  # b, the healthy one


@given(st.lists(st.tuples(st.floats(0, 1000), st.booleans(), st.booleans()), max_size=300))
def test_a_trend_is_bounded_and_counts_only_its_span(
    outcomes: list[tuple[float, bool, bool]],
) -> None:
    trend = Trend()
    outcomes.sort()
    for now, ok, capacity in outcomes:
        trend.record(now, ok=ok, capacity=capacity and not ok, ttft=0.1 if ok else None)
    if not outcomes:
        assert trend.series(0.0) == ()
        return
    now = outcomes[-1][0]
    series = trend.series(now)
    assert len(series) <= SPAN / BUCKET
    in_span = [o for o in outcomes if o[0] // BUCKET > (now // BUCKET) - SPAN / BUCKET]
    assert sum(p.requests for p in series) == len(in_span)
    assert all(0.0 <= (p.success_rate or 0.0) <= 1.0 for p in series)


def test_trends_merge_across_processes() -> None:
    a, b = Trend(), Trend()
    for t in range(0, 120):
        a.record(float(t), ok=True, capacity=False, ttft=0.2)
        b.record(float(t), ok=t % 2 == 0, capacity=t % 2 == 1, ttft=0.4 if t % 2 == 0 else None)
    damaged: list[list[float]] = [["bad"]]  # type: ignore[list-item]  # another version's
    merged = Trend.merged([a.export(120.0), b.export(120.0), damaged], 120.0)
    series = merged.series(120.0)
    assert sum(p.requests for p in series) == 240
    total_ok = sum((p.success_rate or 0) * p.requests for p in series)
    assert total_ok == pytest.approx(180)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steady_noise_is_not_a_warning(seed: int) -> None:
    """Ten minutes at a steady 2 % of capacity errors and a jittery first token: never
    degrading (the warning is for signals that move, not for a model's usual noise)."""
    rng = random.Random(seed)
    fleet = Fleet([streamres.Route("a", base_url="http://a/v1")], breaker_threshold=1000)
    for tick in range(1200):
        now = tick / 2
        fleet.started(0, now, resume=False)
        if rng.random() < 0.02:
            fleet.failed(0, now, "capacity", ttft=None, retry_after=None)
        else:
            fleet.succeeded(0, now, ttft=0.2 * rng.uniform(0.8, 1.2), latency=2.0)
        assert fleet.metrics(now)["a"].health.status != "degrading", now
