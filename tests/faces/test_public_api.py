"""The public surface stays exactly what is documented."""

from __future__ import annotations

import dataclasses

import streamres

PUBLIC = {
    "CONTINUE_INSTRUCTION",
    "AnswerLog",
    "Attempt",
    "AttemptsExhausted",
    "Backoff",
    "BatchProgress",
    "BatchSummary",
    "Cache",
    "CacheStats",
    "Client",
    "DeadlineExceeded",
    "DoneEvent",
    "Event",
    "FallbackEvent",
    "Health",
    "InvalidRequest",
    "MissingExtra",
    "ModelMetrics",
    "RequestRejected",
    "ResilientStream",
    "ResumeEvent",
    "RetryBudget",
    "RetryEvent",
    "PaceFloor",
    "ReadLimits",
    "Route",
    "Semantic",
    "SharedStatus",
    "StatusEvent",
    "StreamError",
    "TextEvent",
    "ThinkingEvent",
    "ToolCall",
    "ToolCallEvent",
    "UpstreamUnreachable",
    "Usage",
    "run_batch",
    "stream_resilient",
}


def test_all_is_exactly_the_public_names() -> None:
    """__all__ lists the public names, and each exists."""
    assert set(streamres.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(streamres, name) is not None


def test_error_tree() -> None:
    """Every error is a StreamError; the timeout and bad-input ones fit standard handlers."""
    for cls in (
        streamres.InvalidRequest,
        streamres.RequestRejected,
        streamres.DeadlineExceeded,
        streamres.AttemptsExhausted,
    ):
        assert issubclass(cls, streamres.StreamError)
    assert issubclass(streamres.DeadlineExceeded, TimeoutError)
    assert issubclass(streamres.InvalidRequest, ValueError)
    err = streamres.DeadlineExceeded("late", partial_text="abc")
    assert err.partial_text == "abc"
    assert "3 characters were delivered first" in str(err)


def test_events_are_frozen_and_typed() -> None:
    """Events are frozen dataclasses whose type field names them."""
    ev = streamres.TextEvent("hi")
    assert ev.type == "text"
    try:
        ev.text = "x"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:  # pragma: no cover
        raise AssertionError("TextEvent is not frozen")
    for cls in (streamres.RetryEvent, streamres.ResumeEvent, streamres.FallbackEvent):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert {"message", "attempt", "reason", "tokens_so_far", "type"} <= fields


def test_a_done_event_converts_copies_and_pickles_with_its_usage() -> None:
    """dataclasses.asdict, copy.deepcopy and pickle work on a done event, counts included, also
    when its usage was still to be counted."""
    import copy
    import dataclasses
    import pickle

    owed = streamres.Usage(estimated=True, later=lambda: ("approximate", 7))
    done = streamres.DoneEvent(
        text="x", finish_reason="stop", model="m", attempts=1, resumes=0, usage=owed
    )
    assert dataclasses.asdict(done)["usage"].delivered_tokens == 7
    assert copy.deepcopy(done) == done
    assert pickle.loads(pickle.dumps(done)).usage.output_tokens == 7
