"""The backoff formula and the retry/switch/give-up policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamres import Backoff
from streamres._core.classify import Failure
from streamres._core.policy import decide


@given(
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0, max_value=1, exclude_max=True),
    st.one_of(st.none(), st.floats(min_value=0, max_value=3600)),
)
def test_delay_stays_in_bounds(failures: int, rand: float, hint: float | None) -> None:
    """The wait is within [0, maximum], and never below a server's Retry-After."""
    b = Backoff()
    d = b.delay(failures, rand=rand, hint=hint)
    assert d >= 0
    if hint is None:
        assert d <= b.maximum
    else:
        # The jitter's ceiling, summed the way after_hint sums it (a different order of the
        # same float additions can differ in the last bit).
        assert hint <= d <= max(b.maximum, hint + (0.1 + 0.1 * hint))


def test_ceilings_grow_then_cap() -> None:
    """Ceilings run 1, 3, 9, 27, then stay at 30 s."""
    assert [Backoff().ceiling(n) for n in range(1, 7)] == [1, 3, 9, 27, 30, 30]


def test_seed_schedule() -> None:
    """The seed's 5/15/45 s schedule is one configuration away."""
    b = Backoff(initial=5, multiplier=3, maximum=45)
    assert [b.ceiling(n) for n in (1, 2, 3, 4)] == [5, 15, 45, 45]


def test_bad_configuration_is_refused() -> None:
    """A backoff that cannot work says why."""
    with pytest.raises(ValueError, match="initial > 0"):
        Backoff(initial=0)


def _decide(f: Failure, **kw: object) -> object:
    args: dict[str, object] = {
        "attempt": 1,
        "max_attempts": None,
        "model_index": 0,
        "failures": [1],
        "time_left": 100.0,
        "backoff": Backoff(),
        "rand": 0.5,
        "fallback_after": 2,
    }
    args.update(kw)
    return decide(f, **args)  # type: ignore[arg-type]


def test_permanent_gives_up() -> None:
    """A permanent error is never retried."""
    d = _decide(Failure("permanent", "bad key", 401))
    assert d.action == "give_up" and d.error == "rejected"  # type: ignore[attr-defined]


def test_hint_longer_than_time_left_fails_fast() -> None:
    """A Retry-After past the deadline gives up now instead of sleeping in vain."""
    d = _decide(Failure("capacity", "busy", 529, retry_after=30), time_left=10.0)
    assert d.action == "give_up" and d.error == "deadline"  # type: ignore[attr-defined]
    assert "30.0 s" in d.why  # type: ignore[attr-defined]


def test_hint_longer_than_time_left_switches_model_when_it_can() -> None:
    """…or moves to the next model when there is one."""
    d = _decide(Failure("capacity", "busy", 529, retry_after=30), time_left=10.0, failures=[1, 0])
    assert (d.action, d.model_index, d.delay) == ("switch", 1, 0.0)  # type: ignore[attr-defined]


def test_at_capacity_switches_at_once() -> None:
    """'Selected model is at capacity' moves to the next model on the first failure."""
    f = Failure("capacity", "Selected model is at capacity", 503, switch_model=True)
    assert _decide(f, failures=[1, 0]).action == "switch"  # type: ignore[attr-defined]
    assert _decide(Failure("capacity", "busy", 503), failures=[1, 0]).action == "retry"  # type: ignore[attr-defined]


def test_consecutive_failures_switch() -> None:
    """fallback_after consecutive failures move on; the chain wraps around."""
    d = _decide(Failure("capacity", "busy"), model_index=1, failures=[0, 2])
    assert (d.action, d.model_index) == ("switch", 0)  # type: ignore[attr-defined]


def test_a_length_refusal_goes_to_a_declared_larger_window_first() -> None:
    """Refused for its length by a model of 8k: the chain's next model declaring 4k is
    skipped (it would refuse too), the one declaring 128k goes before an undeclared one."""
    f = Failure("context_length", "maximum context length is 8192 tokens", 400)
    chain = {"failures": [1, 0, 0, 0], "too_long": [True, False, False, False]}
    d = _decide(f, **chain, windows=[8192, 4096, None, 131072])
    assert (d.action, d.model_index) == ("switch", 3)  # type: ignore[attr-defined]
    # Undeclared windows: the chain's order, as before.
    d = _decide(f, **chain)
    assert (d.action, d.model_index) == ("switch", 1)  # type: ignore[attr-defined]
    # Only windows no larger than the refusing one left: a clean refusal, nothing sent.
    d = _decide(f, failures=[1, 0], too_long=[True, False], windows=[8192, 8192])
    assert (d.action, d.error) == ("give_up", "rejected")  # type: ignore[attr-defined]
    # An undeclared model may have a larger window: it is tried.
    d = _decide(f, failures=[1, 0, 0], too_long=[True, False, False], windows=[8192, 4096, None])
    assert (d.action, d.model_index) == ("switch", 2)  # type: ignore[attr-defined]


def test_attempt_cap() -> None:
    """max_attempts is a cap, when set."""
    d = _decide(Failure("stall", "quiet"), attempt=3, max_attempts=3)
    assert d.action == "give_up" and d.error == "attempts"  # type: ignore[attr-defined]


def test_prefill_rejected_retries_immediately() -> None:
    """A refused prefill is retried at once (with the instruct strategy)."""
    d = _decide(Failure("prefill_rejected", "no prefill", 400))
    assert (d.action, d.delay) == ("retry", 0.0)  # type: ignore[attr-defined]


def test_reinterpret_refusals_by_what_was_refused() -> None:
    """A refused re-attach continues another way; a 400 to a prefill continuation means the
    server refuses prefill; a plain refusal stays permanent."""
    from streamres._core.policy import reinterpret

    refused = Failure("permanent", "not found", 404)
    assert (
        reinterpret(refused, prefill_continuation=False, replaying=True).kind
        == "replay_unavailable"
    )
    bad = Failure("permanent", "invalid", 400)
    assert reinterpret(bad, prefill_continuation=True, replaying=False).kind == "prefill_rejected"
    assert reinterpret(bad, prefill_continuation=False, replaying=False).kind == "permanent"
    busy = Failure("capacity", "busy", 529)
    assert reinterpret(busy, prefill_continuation=True, replaying=True) is busy
    d = _decide(Failure("replay_unavailable", "gone", 404))
    assert (d.action, d.delay) == ("retry", 0.0)  # type: ignore[attr-defined]


# -- rule 4: a URL that never answered ------------------------------------------------------------


def _refused(**kw: object) -> object:
    f = Failure("connection", "Cannot reach http://x — connection refused", connect=True)
    return _decide(f, reached=False, **kw)


def test_an_unreached_url_is_tried_three_times_a_second_apart_at_most() -> None:
    """Tries 1 and 2 of a URL never reached: retried on the short connect backoff (within its
    ceilings: 0.25, 0.5 s), on the same model."""
    from streamres._core.policy import CONNECT_BACKOFF, CONNECT_TRIES

    assert CONNECT_TRIES == 3
    for n, ceiling in ((1, 0.25), (2, 0.5)):
        d = _refused(failures=[n], rand=0.999)
        assert (d.action, d.model_index) == ("retry", 0)  # type: ignore[attr-defined]
        assert 0 <= d.delay <= ceiling  # type: ignore[attr-defined]
        assert d.delay == CONNECT_BACKOFF.delay(n, rand=0.999)  # type: ignore[attr-defined]


def test_an_unreached_url_moves_on_then_is_unreachable() -> None:
    """After three tries: the next model at once (it has not failed), and with no model left
    that could answer, UpstreamUnreachable naming the tries."""
    d = _refused(failures=[3, 0])
    assert (d.action, d.model_index, d.delay) == ("switch", 1, 0.0)  # type: ignore[attr-defined]
    d = _refused(failures=[3, 1], rand=0.999)
    assert (d.action, d.model_index) == ("switch", 1)  # type: ignore[attr-defined]
    assert 0 < d.delay <= 0.25  # type: ignore[attr-defined]
    d = _refused(failures=[3, 3])
    assert (d.action, d.error) == ("give_up", "unreachable")  # type: ignore[attr-defined]
    assert "(3 tries)" in d.why and "connection refused" in d.why  # type: ignore[attr-defined]
    d = _refused(failures=[3])
    assert (d.action, d.error) == ("give_up", "unreachable")  # type: ignore[attr-defined]


def test_an_unreached_url_out_of_time_is_a_deadline() -> None:
    """A connect retry that would come after the deadline: a deadline, saying why."""
    d = _refused(failures=[1], rand=0.999, time_left=0.01)
    assert (d.action, d.error) == ("give_up", "deadline")  # type: ignore[attr-defined]
    assert "connection refused" in d.why  # type: ignore[attr-defined]


def test_a_reached_url_is_patient() -> None:
    """The same refusal from a URL that answered before: the ordinary backoff, no cap of three."""
    f = Failure("connection", "Cannot reach http://x — connection refused", connect=True)
    d = _decide(f, reached=True, failures=[5])
    assert d.action == "retry" and d.delay > 1.0  # type: ignore[attr-defined]


def test_every_model_failing_with_no_time_gives_up() -> None:
    """A switch whose wait would pass the deadline: give up, every model is failing."""
    d = _decide(Failure("capacity", "busy"), failures=[2, 3], rand=0.999, time_left=0.01)
    assert (d.action, d.error, d.why) == ("give_up", "deadline", "every model is failing")  # type: ignore[attr-defined]


def test_a_retry_past_the_deadline_says_how_far_away_it_was() -> None:
    """The next retry would come after the deadline: a deadline naming the retry's wait."""
    d = _decide(Failure("capacity", "busy"), failures=[3], rand=0.999, time_left=0.5)
    assert (d.action, d.error) == ("give_up", "deadline")  # type: ignore[attr-defined]
    assert "would come after the deadline" in d.why  # type: ignore[attr-defined]


def test_a_model_switch_waits_the_backoff_of_a_model_that_failed() -> None:
    """Switching to a model that has failed before waits its backoff; to a fresh one, none."""
    d = _decide(Failure("capacity", "busy"), failures=[2, 1], rand=0.999)
    assert d.action == "switch" and d.delay > 0  # type: ignore[attr-defined]
    d = _decide(Failure("capacity", "busy"), failures=[2, 0], rand=0.999)
    assert d.action == "switch" and d.delay == 0.0  # type: ignore[attr-defined]


def test_a_deadline_is_used_not_abandoned() -> None:
    """An 8 s deadline, a capacity error at 1.3 s, the schedule's next wait 7.7 s (5/15/45 s
    with jitter): not a give-up with 6.7 s left, but a last try after half of them."""
    seed = Backoff(initial=5.0, multiplier=3.0, maximum=45.0)
    assert seed.delay(2, rand=0.999) > 6.7  # the schedule alone would overshoot
    d = _decide(Failure("capacity", "busy"), failures=[2], backoff=seed, rand=0.999, time_left=6.7)
    assert d.action == "retry" and d.delay == pytest.approx(3.35)  # type: ignore[attr-defined]
    # A Retry-After longer than half the time left is kept (the last try still fits).
    hinted = Failure("capacity", "busy", retry_after=5.0)
    d = _decide(hinted, failures=[2], backoff=seed, rand=0.999, time_left=6.7)
    assert d.action == "retry" and d.delay == 5.0  # type: ignore[attr-defined]
    # Nothing fits: then it gives up, saying why.
    d = _decide(Failure("capacity", "busy"), failures=[2], backoff=seed, time_left=1.5)
    assert (d.action, d.error) == ("give_up", "deadline")  # type: ignore[attr-defined]


@given(
    kind=st.sampled_from(["capacity", "rate_limit", "transient", "connection", "stall"]),
    failures=st.integers(1, 12),
    time_left=st.floats(2.0, 600.0),
    rand=st.floats(0.0, 0.999),
    hint=st.one_of(st.none(), st.floats(0.0, 100.0)),
    models=st.integers(1, 3),
)
def test_no_give_up_while_a_try_still_fits(
    kind: str, failures: int, time_left: float, rand: float, hint: float | None, models: int
) -> None:
    """With no permanent error, no attempt cap, and at least 2 s left, the answer is given up
    only when the server asked to wait longer than the time left allows a try."""
    from streamres._core.policy import LAST_TRY

    f = Failure(kind, "busy", retry_after=hint)  # type: ignore[arg-type]
    seed = Backoff(initial=5.0, multiplier=3.0, maximum=45.0)
    d = _decide(f, failures=[failures] * models, backoff=seed, rand=rand, time_left=time_left)
    if d.action == "give_up":  # type: ignore[attr-defined]
        assert hint is not None and time_left - hint < LAST_TRY
    else:
        assert d.delay < time_left  # type: ignore[attr-defined]
