"""One read of an event stream: its SSE events through the provider's decoder, and what the
model did besides writing text (reasoning, tool calls). Pure."""

from __future__ import annotations

from streamres._answer.attempt import AttemptState
from streamres._answer.delivery import Delivery
from streamres._core.classify import Failure, failure
from streamres._core.events import Event, ThinkingEvent
from streamres._core.sse import SSEDecoder
from streamres._core.stall import StallTimer
from streamres._providers.wire import DECODE_ERRORS, StreamDecoder

__all__ = ["decode", "side"]


def decode(
    sse: SSEDecoder, decoder: StreamDecoder, events: list[tuple[str, bytes]], *, eof: bool
) -> tuple[list[str], bool, Failure | None]:
    """The text pieces of one read's events, whether the attempt ends with this read, and how
    (``None``: complete, or not ending)."""
    if sse.overflow is not None:
        decoder.error = failure("malformed", sse.overflow)
    pieces: list[str] = []
    try:
        for name, data in events:
            piece = decoder.feed(name, data)
            if piece:
                pieces.append(piece)
            if decoder.error is not None or decoder.terminal:
                break
    except DECODE_ERRORS as exc:
        decoder.error = failure(
            "malformed",
            f"an event of an unexpected shape from the server "
            f"({type(exc).__name__}: {str(exc)[:200]})",
        )
    ending = decoder.error is not None or decoder.terminal or eof
    # Decided before the side channel is drained: whole tool calls may end a turn that had
    # no finish reason.
    return pieces, ending, decoder.end_failure() if ending else None


def side(
    at: AttemptState,
    d: Delivery,
    decoder: StreamDecoder,
    stall: StallTimer,
    out: list[Event],
    now: float,
) -> None:
    """Reasoning and tool calls: the model is working (the stall timer restarts). Reasoning
    comes before the text it leads to (``out`` has it now); tool calls end the turn, so they
    go after this read's text (kept in ``at.calls``)."""
    stall.output(now)
    decoder.generating = False
    for kind, value in decoder.side:
        if kind == "thinking":
            if value := d.fit(value):
                d.thinking.append(value)
                out.append(ThinkingEvent(value))
        else:
            at.calls = value
    decoder.side.clear()
    if decoder.calls and sum(c.size for c in decoder.calls.values()) > d.room:
        d.cut = "characters"  # tool-call arguments past the bound: no call is whole
