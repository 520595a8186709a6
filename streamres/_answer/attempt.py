"""The attempt in progress: one request to one model, from the breaker's leave to its outcome.
Pure.

What an attempt holds must be given back whichever way it ends (``Answer.abandon``): the
breaker's leave (in half-open, the one probe), the in-flight count once it started, a
concurrency slot, a retry-budget ticket not yet used.
"""

from __future__ import annotations

from typing import Literal

from streamres._core.classify import Failure
from streamres._core.dedup import Deduplicator
from streamres._core.events import ToolCall
from streamres._core.inflate import Inflater
from streamres._core.sse import SSEDecoder
from streamres._fleet.routes import Route
from streamres._providers.wire import HttpRequest, StreamDecoder

__all__ = ["AttemptState"]


class AttemptState:
    """The state of the attempt in progress."""

    __slots__ = (
        "books",
        "calls",
        "chars_before",
        "decoder",
        "dedup",
        "eof",
        "fail",
        "first_content",
        "index",
        "inflater",
        "lingering",
        "number",
        "pieces",
        "reached",
        "request",
        "route",
        "slot",
        "sse",
        "started",
        "ticket",
        "tokens_before",
    )

    def __init__(self, number: int, index: int, route: Route) -> None:
        self.number = number
        self.index = index
        self.route = route
        # The breaker let this attempt through (in half-open: as the one probe). Until the
        # outcome is recorded, leaving by any path must give that back: "acquired" frees the
        # probe, "started" also takes the request off the in-flight count.
        self.books: Literal["acquired", "started", "recorded"] = "acquired"
        self.slot = False
        self.ticket = False  # a retry-budget ticket reserved, not yet used
        self.decoder: StreamDecoder | None = None
        self.dedup: Deduplicator | None = None
        self.sse: SSEDecoder | None = None
        self.inflater: Inflater | None = None
        self.request: HttpRequest | None = None
        self.fail: Failure | None = None
        self.started = 0.0
        self.first_content: float | None = None
        self.chars_before = 0
        self.tokens_before = 0
        #: Events that carried text: tokens, on a server that sends one per event.
        self.pieces = 0
        self.reached = False
        self.eof = False
        self.lingering = False
        self.calls: tuple[ToolCall, ...] = ()
