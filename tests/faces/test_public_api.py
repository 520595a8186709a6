"""The public surface stays exactly what is documented."""

from __future__ import annotations

import dataclasses

import streamres

PUBLIC = {
    "CONTINUE_INSTRUCTION",
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


def test_the_pure_layers_import_nothing_of_the_shell() -> None:
    """The core, the fleet and the providers are pure: none of their modules imports the I/O
    shell, the apps, an I/O library or a logging library (the machine logs through the logger
    its shell hands it)."""
    import ast
    import pathlib

    root = pathlib.Path(streamres.__file__).parent
    forbidden = (
        "streamres._shell",
        "streamres._apps",
        "streamres.proxy",
        "streamres.chat",
        "anyio",
        "httpx",
        "structlog",
        "logging",
    )
    found = []
    for layer in ("_core", "_fleet", "_providers"):
        for path in sorted((root / layer).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                found += [
                    f"{layer}/{path.name}: {n}"
                    for n in names
                    if any(n == f or n.startswith(f + ".") for f in forbidden)
                ]
    assert found == []
