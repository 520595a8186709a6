"""The attempt in progress: one request to one model, from the breaker's leave to its outcome.
Pure.

What an attempt holds must be given back whichever way it ends (:meth:`AttemptState.give_back`):
the breaker's leave (in half-open, the one probe), the in-flight count once it was sent, a
concurrency slot, a retry-budget ticket not yet used. Once its request is built, the request
and what reads its response are its :class:`Exchange`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from streamres._answer.memory import Slots
from streamres._answer.states import ProtocolError
from streamres._core.classify import Failure
from streamres._core.dedup import Deduplicator
from streamres._core.events import Attempt, ToolCall
from streamres._core.inflate import Inflater
from streamres._core.logs import Log
from streamres._core.sse import SSEDecoder
from streamres._core.stall import RequestKind
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route
from streamres._providers.wire import HttpRequest, StreamDecoder

__all__ = ["AttemptState", "Exchange"]


@dataclass(slots=True)
class Exchange:
    """An attempt's request, and what reads its response: the SSE decoder, the provider's
    decoder, the de-duplicator of a continuation, and the body's decompression."""

    request: HttpRequest
    decoder: StreamDecoder
    dedup: Deduplicator | None
    sse: SSEDecoder
    inflater: Inflater = field(default_factory=lambda: Inflater(None))
    #: The response's head, once it came.
    status: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The ``X-Conversation-Id`` the request carried (llama.cpp keeps its stream), or "".
    conversation: str = ""
    #: Bytes of the body read so far (a llama.cpp replay goes on from there).
    received: int = 0


#: Text events an attempt must have streamed for its pace to be learnt from.
PACE_EVENTS = 20


class AttemptState:
    """The state of the attempt in progress."""

    __slots__ = (
        "asked",
        "books",
        "calls",
        "chars_before",
        "ended_at",
        "eof",
        "exchange",
        "fail",
        "first_content",
        "held",
        "index",
        "lingering",
        "number",
        "pieces",
        "reached",
        "route",
        "sent_at",
        "slot",
        "ticket",
        "tokens_before",
    )

    def __init__(self, number: int, index: int, route: Route) -> None:
        self.number = number
        self.index = index
        self.route = route
        # The breaker let this attempt through (in half-open: as the one probe). Until the
        # outcome is recorded, leaving by any path must give that back: "acquired" frees the
        # probe, "sent" also takes the request off the in-flight count.
        self.books: Literal["acquired", "sent", "recorded"] = "acquired"
        self.slot = False
        self.ticket = False  # a retry-budget ticket reserved, not yet used
        self.exchange: Exchange | None = None
        #: What kind of request it is, for its first-output wait (``stall.request_kind``).
        self.asked: RequestKind = "quick"
        self.sent_at = 0.0
        self.first_content: float | None = None
        self.chars_before = 0
        self.tokens_before = 0
        #: Events that carried text: tokens, on a server that sends one per event.
        self.pieces = 0
        #: The route's server had answered before (in this process): the patient policy.
        self.reached = False
        self.eof = False
        #: The answer is whole but the server is still sending the body's end.
        self.lingering = False
        self.calls: tuple[ToolCall, ...] = ()
        #: How it ended (``None``: complete), and when; set once, by :meth:`end`.
        self.fail: Failure | None = None
        self.ended_at = 0.0
        #: Text a continuation's de-duplicator still held when the attempt ended.
        self.held = ""

    @property
    def sent(self) -> Exchange:
        """The exchange of an attempt whose request was built."""
        if self.exchange is None:
            raise ProtocolError("the attempt has no request yet")
        return self.exchange

    def send(
        self, exchange: Exchange, now: float, *, chars: int, tokens: int, reached: bool
    ) -> None:
        """The request goes out, the answer ``chars`` characters (``tokens`` counted) long."""
        self.exchange = exchange
        self.sent_at = now
        self.chars_before, self.tokens_before = chars, tokens
        self.reached = reached
        self.books = "sent"

    def hold_ticket(self) -> None:
        """A retry-budget ticket is this attempt's until its turn comes (or it ends)."""
        self.ticket = True

    def claim(self) -> None:
        """The ticket's turn came; the attempt may take its slot."""
        self.ticket = False

    def took_slot(self) -> None:
        self.slot = True

    def head(self, status: int, headers: Mapping[str, str], *, inflate_limit: int) -> None:
        """The response's head came (``InflateError``: its encoding cannot be read)."""
        exchange = self.sent
        exchange.status, exchange.headers = status, headers
        exchange.inflater = Inflater(headers.get("content-encoding"), limit=inflate_limit)

    def body_ended(self) -> None:
        self.eof = True

    def ending(self, *, complete: bool) -> None:
        """The read ends the attempt (``complete``: the answer is whole): the body's end is
        read after the done event only for a whole answer whose body has not ended."""
        self.lingering = complete and not self.eof

    def output(self, now: float, pieces: int) -> None:
        """``pieces`` events of text came."""
        self.pieces += pieces
        if self.first_content is None:
            self.first_content = now

    def calls_made(self, calls: tuple[ToolCall, ...]) -> None:
        """Whole tool calls came (handed on after this read's text)."""
        self.calls = calls

    def take_calls(self) -> tuple[ToolCall, ...]:
        """Whole tool calls that came with this read (each handed on once)."""
        calls, self.calls = self.calls, ()
        return calls

    def pace(self, now: float) -> float | None:
        """Text events a second from the first to ``now``, for an attempt that streamed long
        enough to say (``PACE_EVENTS`` events, half a second)."""
        first = self.first_content
        if first is None or self.pieces < PACE_EVENTS or now - first < 0.5:
            return None
        return self.pieces / (now - first)

    def end(self, fail: Failure | None, now: float) -> None:
        self.fail, self.ended_at = fail, now

    def dropped(self) -> str:
        """What of this attempt's text was never delivered: repeats removed, and what was
        still held when it ended (taken from the de-duplicator once)."""
        dedup = self.sent.dedup
        if dedup is None:
            return ""
        if not dedup.resolved:
            self.held = dedup.abandon()
        return dedup.stats.dropped + self.held

    def counted_by_server(self) -> bool:
        """The answer is this one attempt, complete, and its server counted its output."""
        return (
            self.number == 1 and self.fail is None and self.sent.decoder.output_tokens is not None
        )

    def ttft(self) -> float | None:
        """Seconds from sending to the first output, if any came."""
        return None if self.first_content is None else self.first_content - self.sent_at

    def record(
        self,
        outcome: Failure | None,
        *,
        chars: int,
        input_tokens: int | None,
        output_tokens: int | None,
        estimated: bool,
    ) -> Attempt:
        """The history entry of this attempt, ended with ``outcome`` (``None``: complete),
        having added ``chars`` characters."""
        kind, message, status = (
            ("ok", "", None)
            if outcome is None
            else (outcome.kind, outcome.message, outcome.status_code)
        )
        stats = self.exchange.dedup.stats if self.exchange and self.exchange.dedup else None
        return Attempt(
            self.number,
            self.route.model,
            kind,
            message,
            status,
            chars=chars,
            seconds=self.ended_at - self.sent_at,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            estimated=estimated,
            repeated_chars=len(stats.dropped) if stats else 0,
            held_chars=stats.held_chars if stats else 0,
            hold_seconds=stats.hold_seconds if stats else 0.0,
        )

    def not_sent(self, fleet: Fleet, until: float) -> None:
        """Another process holds this half-open model's probe: the attempt is not made, and
        the model is refused here until ``until``."""
        fleet.not_sent(self.index, resume=bool(self.chars_before))
        self.books = "recorded"
        fleet.apply(self.index, "open", until)

    def report(
        self, fleet: Fleet, slots: Slots | None, fail: Failure | None, now: float, log: Log
    ) -> Route | None:
        """The attempt's outcome goes to the fleet (breaker, weight, metrics) and its slot
        back; the route whose slot waits for the body's end to be read, if any."""
        index, route = self.index, self.route
        weight = fleet.states[index].weight.current
        ttft = self.ttft()
        if fail is None:
            latency = now - self.sent_at
            moved = fleet.succeeded(
                index, now, ttft=ttft, latency=latency, asked=self.asked, pace=self.pace(now)
            )
        else:
            moved = fleet.failed(
                index, now, fail.kind, ttft=ttft, retry_after=fail.retry_after, asked=self.asked
            )
        if moved is not None:
            log.info(f"streamres.breaker_{moved}", model=route.key)
        if fail is not None and fail.retry_after is not None:
            log.info(
                "streamres.cooldown_started", model=route.key, seconds=round(fail.retry_after, 3)
            )
        self.books = "recorded"
        if fleet.states[index].weight.current != weight:
            log.debug(
                "streamres.weight_changed",
                model=route.key,
                weight=round(fleet.states[index].weight.current, 4),
            )
        after_drain = None
        if slots is not None:
            if self.slot and self.lingering:
                # The answer is whole but the server is still sending the body's end: the
                # request is in flight (for a provider's quota too) until the shell has read
                # it; the slot goes back then (``Answer.abandon``).
                after_drain = route
            elif self.slot:
                slots.release(route)
            self.slot = False
            slots.notify()  # an outcome is recorded: streams waiting on a probe wake
        return after_drain

    def give_back(self, fleet: Fleet, slots: Slots | None) -> None:
        """What the attempt holds goes back: the breaker's leave and the in-flight count
        (unless its outcome is recorded), a ticket not yet used, its slot."""
        if self.books == "acquired":
            fleet.release(self.index)
        elif self.books == "sent":  # cancelled, or an error raised mid-attempt
            fleet.abandoned(self.index)
        self.books = "recorded"
        if self.ticket:
            fleet.refund()
            self.ticket = False
        if slots is not None:
            if self.slot:
                slots.release(self.route)
                self.slot = False
            slots.notify()
