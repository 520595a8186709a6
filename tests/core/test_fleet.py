"""Breakers, weights, retry budget, model order and health: pure, with an injected clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamres import Route
from streamres._fleet.balance import RetryBudget, Weight
from streamres._fleet.breaker import CircuitBreaker
from streamres._fleet.metrics import RouteStats, assess
from streamres._fleet.routes import fallback_order, pick_weighted


def test_breaker_opens_after_threshold() -> None:
    """Three consecutive failures open the circuit; fewer do not."""
    b = CircuitBreaker(threshold=3, recovery=60)
    assert b.record_failure(0) == "closed"
    assert b.record_failure(1) == "closed"
    assert b.record_failure(2) == "open"
    assert not b.try_acquire(30)
    assert b.available_at(30) == 62


def test_success_resets_the_count() -> None:
    """A success in between starts the count again."""
    b = CircuitBreaker(threshold=3)
    b.record_failure(0)
    b.record_failure(0)
    b.record_success(0)
    b.record_failure(0)
    assert b.state == "closed"


def test_one_stream_at_a_time_three_failures_in_a_row_still_open() -> None:
    """The seed's rule where traffic is light: a chat's model answering every 10 s for ten
    minutes, then failing three times in a row, is opened — it has seen too few attempts of
    late to judge by rate."""
    b = CircuitBreaker(threshold=3)
    for t in range(0, 600, 10):
        b.record_start(t)
        b.record_success(t + 2)
    assert b.failure_rate(600) is None  # about 6 attempts remembered, under 20
    assert [b.record_failure(600 + t) for t in range(3)] == ["closed", "closed", "open"]


def test_the_tail_of_a_burst_is_still_judged_by_rate() -> None:
    """5,000 streams at once, then, 80 s on, the dozen still going: three failures in a row
    among twenty attempts of the last seconds do not open the circuit — the burst is still
    remembered, so the rate decides (15 %), not the failures in a row."""
    b = CircuitBreaker(threshold=3)
    for k in range(5000):
        b.record_start(k / 5000)
    for k in range(5000):
        b.record_success(3 + k / 5000)
    states = []
    for k in range(20):
        t = 80 + k * 0.5
        b.record_start(t)
        states.append(b.record_failure(t + 0.1) if 10 <= k < 13 else b.record_success(t + 0.1))
    assert "open" not in states
    dead = CircuitBreaker(threshold=3)  # the same tail on a model that stopped answering
    for k in range(5000):
        dead.record_start(k / 5000)
        dead.record_success(3 + k / 5000)
    for k in range(3):
        dead.record_start(80 + k)
        dead.record_failure(80 + k + 0.1)
    assert dead.state == "open"


def _busy(b: CircuitBreaker, fail_every: int, seconds: float, per_second: int) -> list[str]:
    """Many streams at once: ``per_second`` start every second for ``seconds``, each ending
    a second after it started; one in ``fail_every`` fails — and fails fast (a refused
    connection), so the failures of each second all come first, in a row."""
    states: list[str] = []
    n = int(seconds * per_second)
    for sec in range(int(seconds) + 1):
        if sec < seconds:
            for k in range(per_second):
                b.record_start(sec + k / per_second / 10)
        if sec == 0:
            continue  # the first ends come a second after the first starts
        fails = per_second // fail_every
        for k in range(min(per_second, n - (sec - 1) * per_second)):
            now = sec + k / per_second
            if k < fails:
                states.append(b.record_failure(now - 0.99))  # fast: just after it started
            else:
                states.append(b.record_success(now))
    return states


def test_a_busy_model_failing_one_answer_in_five_stays_closed() -> None:
    """A thousand streams a second, a fifth of them refused at once: two hundred failures in
    a row come round every second — before any success of that second — yet four answers in
    five succeed; the circuit stays closed. Failures in a row alone open it in the first
    second."""
    b = CircuitBreaker(threshold=3)
    assert "open" not in _busy(b, fail_every=5, seconds=60, per_second=1000)
    rate = b.failure_rate(61)
    assert rate is not None and 0.15 < rate < 0.25
    assert "open" in _busy(CircuitBreaker(threshold=3, volume=math.inf), 5, 2, 1000)  # no rate


def test_a_busy_model_failing_most_answers_opens_within_a_few_failures() -> None:
    """An outage on a busy model (every attempt refused) opens it at its third failure; a
    model going from one answer in five failing to three in four opens within the window."""
    b = CircuitBreaker(threshold=3)
    for k in range(1000):
        b.record_start(k / 1000)
        if b.record_failure(k / 1000 + 0.001) == "open":
            break
    assert k == 2
    b = CircuitBreaker(threshold=3)
    _busy(b, fail_every=5, seconds=30, per_second=100)  # a fifth failing for 30 s
    t, opened = 31.0, None
    for k in range(2000):  # then three in four fail
        t += 0.01
        b.record_start(t)
        if (b.record_failure(t) if k % 4 else b.record_success(t)) == "open":
            opened = t
            break
    assert opened is not None and opened - 31 < b.window  # the window catches up


def test_half_open_lets_one_probe_through() -> None:
    """After the recovery time exactly one request goes; its outcome decides."""
    b = CircuitBreaker(threshold=1, recovery=10)
    b.record_failure(0)
    assert b.try_acquire(10)
    assert b.state == "half_open"
    assert not b.try_acquire(10.5)
    assert b.record_success(11) == "closed"
    assert b.try_acquire(11) and b.try_acquire(11)


def test_failed_probe_reopens() -> None:
    """A failed probe opens the circuit again for a full recovery period."""
    b = CircuitBreaker(threshold=1, recovery=10)
    b.record_failure(0)
    assert b.try_acquire(10)
    assert b.record_failure(12) == "open"
    assert not b.try_acquire(21)
    assert b.try_acquire(22)


def test_neutral_outcome_frees_the_probe() -> None:
    """A permanent error on the probe says nothing about health: another probe may go."""
    b = CircuitBreaker(threshold=1, recovery=10)
    b.record_failure(0)
    assert b.try_acquire(10)
    b.record_neutral()
    assert b.state == "half_open"
    assert b.try_acquire(10)


@given(st.lists(st.tuples(st.sampled_from(["acquire", "ok", "fail", "neutral"]), st.floats(0, 5))))
def test_never_more_than_one_probe(ops: list[tuple[str, float]]) -> None:
    """Whatever happens, half-open never lets a second request out before an outcome."""
    b = CircuitBreaker(threshold=2, recovery=3)
    now, probes = 0.0, 0
    for op, dt in ops:
        now += dt
        if op == "acquire":
            if b.try_acquire(now) and b.state == "half_open":
                probes += 1
        else:
            if op == "ok":
                b.record_success(now)
            elif op == "fail":
                b.record_failure(now)
            else:
                b.record_neutral()
            probes = 0
        assert probes <= 1


@given(st.lists(st.booleans()), st.floats(min_value=0.01, max_value=100))
def test_weights_stay_in_bounds(outcomes: list[bool], base: float) -> None:
    """Weights never reach zero and never exceed their base."""
    w = Weight(base=base)
    for ok in outcomes:
        value = w.success() if ok else w.failure()
        assert base * w.floor <= value <= base


def test_weight_penalty_and_slow_restore() -> None:
    """x0.7 per failure; a success restores a quarter of the gap."""
    w = Weight(base=1.0)
    assert w.failure() == 0.7
    assert abs(w.failure() - 0.49) < 1e-9
    assert abs(w.success() - (0.49 + 0.51 * 0.25)) < 1e-9


def test_retry_budget() -> None:
    """Retries are bounded by a fraction of first attempts plus a floor rate."""
    b = RetryBudget(ratio=0.2, floor=1.0, cap=2.0, balance=2.0)
    assert b.withdraw(0) and b.withdraw(0)
    assert not b.withdraw(0)
    assert b.wait(0) == 1.0
    b.deposit(0.5)  # +0.5 refill +0.2 deposit
    assert abs(b.wait(0.5) - 0.3) < 1e-9
    assert b.withdraw(0.8)


def test_a_burst_of_first_attempts_banks_the_retries_it_paid_for() -> None:
    """2,000 first attempts at once earn 400 retries at 20 %, and the bank keeps them (a fixed
    cap of 10 kept 10): 400 retries go at once, the 401st waits."""
    b = RetryBudget()
    for _ in range(2000):
        b.deposit(0.0)
    waits = [b.reserve(0.0) for _ in range(401)]
    assert max(waits[:400]) < 1e-6 and waits[400] > 0.5  # (sums of 0.2 are not exact)


def test_the_bank_shrinks_back_when_the_traffic_goes() -> None:
    """A minute after the burst, with no first attempts, the cap is 10 again."""
    b = RetryBudget()
    b.deposit(0.0, attempts=2000)
    assert b.limit == 400
    b.wait(60.0)
    assert b.limit == 10 and b.balance <= 10


@pytest.mark.parametrize("rate", [10, 100, 1000])
def test_a_storm_cannot_multiply_the_load_beyond_the_ratio(rate: int) -> None:
    """Every request fails and would retry at once: over a minute at ``rate`` first attempts a
    second, the retries granted stay within 20 % of the first attempts, plus the floor's one a
    second and the starting balance."""
    b = RetryBudget()
    granted = first = 0
    for tick in range(60 * rate):
        now = tick / rate
        b.deposit(now)
        first += 1
        while b.withdraw(now):
            granted += 1
    assert granted <= 0.2 * first + 60 * 1.0 + 10 + 1e-6
    assert granted >= 0.2 * first * 0.95  # and what was paid for is there


def test_budget_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"RetryBudget\.ratio"):
        RetryBudget(ratio=-1)
    with pytest.raises(ValueError, match=r"RetryBudget\.window"):
        RetryBudget(window=0)


def test_fallback_order_prefers_the_smaller_sibling() -> None:
    """Same family smaller (closest first), then other families by weight, then the pool."""
    routes = [
        Route("big", family="f", size=3),
        Route("mid", family="f", size=2),
        Route("small", family="f", size=1),
        Route("other-a", family="g"),
        Route("other-b"),
        Route("huge", family="f", size=9),
    ]
    weights = [1.0, 1.0, 1.0, 0.3, 0.9, 1.0]
    assert fallback_order(routes, 0, weights) == [0, 1, 2, 4, 3, 5]
    assert fallback_order(routes, 2, weights) == [2, 4, 3, 0, 1, 5]


def test_weighted_pick() -> None:
    """A weighted pick lands in proportion to weight."""
    assert pick_weighted([0, 1], [1.0, 3.0], 0.2) == 0
    assert pick_weighted([0, 1], [1.0, 3.0], 0.3) == 1


def _stats(outcomes: str, latency: float = 1.0) -> RouteStats:
    s = RouteStats()
    for o in outcomes:
        s.started()
        if o == "o":
            s.succeeded(ttft=0.1, latency=latency)
        else:
            s.failed("capacity" if o == "c" else "connection", ttft=None)
    return s


def test_health_views() -> None:
    """Healthy, degraded, jammed — with the reasons."""
    assert assess(_stats("o" * 20), "closed").status == "healthy"
    degraded = assess(_stats("o" * 37 + "ccc"), "closed")
    assert degraded.status == "degraded"
    assert any("capacity" in r for r in degraded.reasons)
    assert assess(_stats("o" * 10 + "c" * 11), "closed").status == "jammed"
    assert assess(_stats("o" * 5), "open").status == "jammed"
    s = _stats("o" * 40, latency=1.0)
    for _ in range(12):
        s.started()
        s.succeeded(ttft=0.1, latency=5.0)
    for _ in range(3):
        s.started()
        s.failed("capacity", ttft=None)
    trend = assess(s, "closed")
    assert trend.status == "jammed"
    assert "latency rising" in trend.reasons


def test_health_with_too_few_requests_says_so() -> None:
    """Two requests, one failed: healthy, with the reason it is not judged yet (not a bare
    "healthy" next to 50 % success)."""
    from streamres._fleet.metrics import RouteStats, assess

    stats = RouteStats()
    stats.started()
    stats.succeeded(ttft=0.1, latency=1.0)
    stats.started()
    stats.failed("capacity", ttft=None)
    health = assess(stats, "closed")
    assert health.status == "healthy"
    assert health.reasons == ("too few requests to judge (2 of 5)",)


def test_the_fleets_figures_merge_and_damaged_ones_are_left_out() -> None:
    """Two processes' figures of a model: counters summed, samples pooled, health judged over
    both processes' recent requests; figures that do not read are left out, never raised."""
    from streamres._fleet.metrics import RouteStats, export, merge

    a, b = RouteStats(), RouteStats()
    for stats, ok in ((a, True), (b, False), (b, False)):
        stats.started()
        if ok:
            stats.succeeded(ttft=0.1, latency=0.5)
        else:
            stats.failed("capacity", ttft=None)
    damaged = [{"requests": "many"}, {"recent": [[True]]}, {"ttft": 5}, "not a dict"]
    merged = merge([export(a), *damaged, export(b)])  # type: ignore[list-item]
    assert (merged.requests, merged.successes, merged.capacity_errors) == (3, 1, 2)
    assert list(merged.ttft) == [0.1] and len(merged.recent) == 3


def test_the_fleet_keeps_news_for_other_processes_only_while_telling() -> None:
    """What other processes should learn is kept as records, in order, while shared state is
    attached (``telling``): a cool-down, a weight that moved, the breaker opening, a recovery,
    the budget's deposits and refunds. Without it nothing is kept (no list grows unread)."""
    from streamres._fleet.fleet import Budgeted, Changed, Fleet, Weighed

    fleet = Fleet([Route("m", base_url="http://u.test/v1")], breaker_threshold=1)
    fleet.deposit(0.0)
    fleet.failed(0, 1.0, "capacity", ttft=None, retry_after=None)
    assert fleet.news == [] and fleet.take_news() == []
    fleet = Fleet([Route("m", base_url="http://u.test/v1")], breaker_threshold=1)
    fleet.telling = True
    fleet.deposit(0.0)
    fleet.failed(0, 1.0, "capacity", ttft=None, retry_after=2.0)
    fleet.refund()
    assert fleet.take_news() == [
        Budgeted("deposit"),
        Changed(0, "cooldown", 3.0),
        Weighed(0, "failure"),
        Changed(0, "open", 61.0),
        Budgeted("refund"),
    ]
    assert fleet.news == []
    fleet.succeeded(0, 62.0, ttft=0.1, latency=1.0)
    assert fleet.take_news() == [Weighed(0, "success"), Changed(0, "closed", 62.0)]
