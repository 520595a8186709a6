"""What an answer keeps of a llama.cpp stream that broke: read it again, or stop it."""

from __future__ import annotations

from streamres._answer.attempt import Exchange
from streamres._answer.reattach import Reattach, Session
from streamres._core.classify import Failure, failure
from streamres._core.sse import SSEDecoder
from streamres._providers.openai import OpenAIDecoder
from streamres._providers.wire import HttpRequest


def _exchange(status: int = 200, received: int = 1234) -> Exchange:
    req = HttpRequest("http://llama/v1/chat/completions", {"X-Conversation-Id": "c-1"})
    ex = Exchange(req, OpenAIDecoder(), None, SSEDecoder(), conversation="c-1")
    ex.status, ex.received = status, received
    return ex


def _ended(
    fail: Failure | None, *, status: int = 200, eof: bool = False, again: bool = False
) -> Reattach:
    r = Reattach(background=False)
    if again:  # the attempt was itself a re-attach, after a stall
        _ended_into(r, failure("stall", "silent"), status=200, eof=False, replayed=False)
    _ended_into(r, fail, status=status, eof=eof, replayed=again)
    return r


def _ended_into(
    r: Reattach, fail: Failure | None, *, status: int, eof: bool, replayed: bool
) -> None:
    r.attempt_ended(_exchange(status), 0, fail, replayed=replayed, keeps_streams=True, eof=eof)


def test_a_dropped_or_silent_stream_is_read_again_from_its_byte() -> None:
    for kind in ("connection", "stall"):
        r = _ended(failure(kind, "broke"))
        known = r.on(0)
        assert known is not None and known.session == Session(0, "c-1") and known.after == 1234
        assert r.stops == []


def test_what_cannot_be_read_again_is_stopped() -> None:
    """A body that ended (its last event gone), a stream that never began, a failure of
    another kind, a second silence in a row: stopped, not re-attached to."""
    cases = [
        _ended(failure("truncated", "ended"), eof=True),
        _ended(failure("stall", "no headers"), status=0),
        _ended(failure("malformed", "garbled")),
        _ended(failure("stall", "silent again"), again=True),
    ]
    for r in cases:
        assert r.on(0) is None and r.take_stops() == [Session(0, "c-1")]


def test_a_whole_answer_or_a_connect_that_failed_leaves_nothing_to_stop() -> None:
    refused = Failure("connection", "refused", connect=True)
    for fail in (None, refused):
        r = _ended(fail)
        assert r.on(0) is None and r.stops == []


def test_moving_to_another_model_or_leaving_stops_the_session() -> None:
    r = _ended(failure("connection", "broke"))
    r.going_to(1)
    assert r.on(0) is None and r.take_stops() == [Session(0, "c-1")]
    r = _ended(failure("connection", "broke"))
    r.abandoned(None, 0, keeps_streams=True)
    assert r.take_stops() == [Session(0, "c-1")]
