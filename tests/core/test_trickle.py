"""The pace floor: how slow a stream that still produces may be (``_core/trickle``)."""

from __future__ import annotations

import pytest

from streamres._core.trickle import LEARN_PACE_AFTER, PaceFloor, PaceWatch, learnt_pace


def test_the_floor_is_the_higher_of_the_two_that_apply() -> None:
    floor = PaceFloor(relative=0.25, absolute=2.0)
    assert floor.floor(learnt=100.0) == 25.0
    assert floor.floor(learnt=4.0) == 2.0  # a slow model: the absolute floor
    assert floor.floor(learnt=None) == 2.0  # nothing learnt yet
    assert PaceFloor().floor(learnt=None) is None  # relative only, nothing learnt: no floor


@pytest.mark.parametrize(
    "bad", [{"relative": 0}, {"relative": 1.5}, {"absolute": -1}, {"window": 0}]
)
def test_a_bad_floor_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="PaceFloor"):
        PaceFloor(**bad)


def test_a_pace_is_learnt_once_enough_answers_say_it() -> None:
    assert learnt_pace([50.0] * (LEARN_PACE_AFTER - 1)) is None
    assert learnt_pace([10.0, 50.0, 60.0, 55.0, 1000.0]) == 55.0  # the median


def test_a_trickle_is_told_after_a_whole_window_and_a_steady_stream_never() -> None:
    """One event a second against a floor of five over four seconds: told at the first
    judgement after the window; ten a second is never told."""
    watch = PaceWatch(floor=5.0, window=4.0)
    told = [watch.output(float(t), 1) for t in range(12)]
    assert told[:4] == [None] * 4
    assert told[4] is not None and told[4] < 2  # about one a second
    steady = PaceWatch(floor=5.0, window=4.0)
    assert all(steady.output(t / 10, 1) is None for t in range(200))


def test_a_burst_then_a_trickle_is_told_once_the_burst_leaves_the_window() -> None:
    watch = PaceWatch(floor=5.0, window=2.0)
    assert watch.output(0.0, 100) is None  # a burst
    told = [watch.output(0.5 * t, 1) for t in range(1, 12)]
    assert any(t is not None for t in told[4:])
