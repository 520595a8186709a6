"""The connect pace (``_core/pace``): a window of connects in progress per server."""

from __future__ import annotations

from streamres._core.pace import CEILING, FAST, FLOOR, START, ConnectPace


def test_a_new_server_takes_start_connects_at_once_and_no_more() -> None:
    pace = ConnectPace()
    for _ in range(int(START)):
        assert pace.room()
        pace.start()
    assert not pace.room()
    assert pace.most == START


def test_each_quick_connect_opens_the_window_by_one_up_to_the_ceiling() -> None:
    pace = ConnectPace()
    for _ in range(10):
        pace.end(pace.start(), "connected", FAST / 2)
    assert pace.window == START + 10
    for _ in range(int(CEILING)):
        pace.end(pace.start(), "connected", 0.001)
    assert pace.window == CEILING
    assert pace.in_progress == 0


def test_an_overflow_halves_the_window_once_however_many_connects_it_dropped() -> None:
    pace = ConnectPace()
    rounds = [pace.start() for _ in range(40)]  # one burst: all in the same round
    for r in rounds:
        pace.end(r, "failed")
    assert pace.window == START / 2
    # A connect started after the halving that fails too: a new sign, halved again.
    pace.end(pace.start(), "failed")
    assert pace.window == START / 4


def test_the_window_never_closes_below_its_floor() -> None:
    pace = ConnectPace()
    for _ in range(20):
        pace.end(pace.start(), "failed")
    assert pace.window == FLOOR
    assert pace.room()


def test_a_slow_or_unknown_connect_moves_nothing() -> None:
    """Slow: perhaps the server's queue, perhaps this side's loop — neither grown nor cut;
    cancelled (unknown): nothing learnt."""
    pace = ConnectPace()
    pace.end(pace.start(), "connected", FAST * 4)
    pace.end(pace.start(), "unknown")
    assert pace.window == START
    assert pace.in_progress == 0
