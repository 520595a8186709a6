"""Reading a response: one read's SSE events through the provider's decoder and the
de-duplicator into the caller's events, and what the model did besides writing text
(reasoning, tool calls). Pure.

:class:`Reader` does one answer's reading for its machine: it delivers what the read brought
(within the answer's bounds) and says whether the attempt ends with it — complete, failed, cut
at a bound, or a continuation that missed its seam. The machine moves on from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

from streamres._answer.attempt import AttemptState, Exchange
from streamres._answer.delivery import Delivery
from streamres._answer.memory import Memory
from streamres._answer.options import Options
from streamres._answer.seam import Seam
from streamres._core.classify import (
    Failure,
    classify_not_a_stream,
    classify_response,
    failure,
)
from streamres._core.events import Event, TextEvent, ThinkingEvent, ToolCall, ToolCallEvent
from streamres._core.inflate import InflateError
from streamres._core.logs import Log
from streamres._core.policy import this_side_busy
from streamres._core.redact import redact_url
from streamres._core.sse import SSEDecoder
from streamres._core.stall import StallTimer
from streamres._core.trickle import PaceWatch
from streamres._providers.tools import calls_already_run, is_call_already_run
from streamres._providers.wire import DECODE_ERRORS, StreamDecoder

__all__ = ["ERROR_BODY_LIMIT", "Ended", "Reader", "decode", "side"]

#: Bytes of a body that is not an event stream kept to classify it.
ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Ended:
    """The read ended the attempt: ``fail`` says how (``None``: complete)."""

    fail: Failure | None


@dataclass(slots=True)
class Reader:
    """One answer's reading: what each read delivers, and whether the attempt ends."""

    opts: Options
    delivery: Delivery
    stall: StallTimer
    seam: Seam
    memory: Memory
    log: Log
    #: The calls the conversation already ran since the user's last words (read once, for
    #: the first continuation that calls a tool).
    _ran: frozenset[tuple[str, str]] | None = field(default=None, init=False)
    #: The attempt's pace against its floor (``trickle``), when the answer has one.
    pace: PaceWatch | None = field(default=None, init=False)

    def deliver(self, text: str, out: list[Event]) -> None:
        """What of ``text`` fits the answer's bounds is delivered (``out``: the caller's
        events)."""
        if text := self.delivery.add(text):
            out.append(TextEvent(text))

    def chunk(
        self, attempt: AttemptState, data: bytes, out: list[Event], now: float
    ) -> Ended | None:
        """Bytes of the event stream came (the per-token path)."""
        exchange = attempt.sent
        exchange.received += len(data)
        sse, inflater = exchange.sse, exchange.inflater
        try:
            events = sse.feed(data if inflater.identity else inflater.feed(data))
        except InflateError as exc:
            return Ended(failure("malformed", str(exc)))
        return self.take(attempt, exchange, events, out, now)

    def eof(self, attempt: AttemptState, out: list[Event], now: float) -> Ended:
        """The body ended: what its last bytes held, and the attempt ends."""
        exchange = attempt.sent
        attempt.body_ended()
        try:
            exchange.inflater.close()
        except InflateError as exc:
            return Ended(failure("malformed", str(exc)))
        ended = self.take(attempt, exchange, exchange.sse.close(), out, now)
        assert ended is not None  # the end of the body ends the attempt
        return ended

    def silence(self, attempt: AttemptState, now: float, *, late: float) -> Ended | None:
        """The read timer fired before the deadline. A silence while the event loop ran at
        least half the limit ``late`` may be this side's (policy rule 9): waited out again
        (``None``), not resumed — a new request would only add to the load that made it
        late."""
        stall = self.stall
        if this_side_busy(stall.limit(), late):
            stall.wait_more(now)
            self.log.debug("streamres.stall_waited", late=round(late, 3))
            return None
        silence = failure("stall", f"no output for {stall.limit():.3g} s")
        if attempt.first_content is None:
            # Nothing yet: the model is slow to start for its history (``first_output``).
            silence = dataclasses.replace(silence, error_type="first_output")
        return Ended(silence)

    def take(
        self,
        attempt: AttemptState,
        exchange: Exchange,
        events: list[tuple[str, bytes]],
        out: list[Event],
        now: float,
    ) -> Ended | None:
        """One read's SSE events through the provider's decoder, the de-duplicator and the
        stall timer, into events for the caller (``out``)."""
        decoder, dedup = exchange.decoder, exchange.dedup
        pieces, ending, fail = decode(exchange.sse, decoder, events, eof=attempt.eof)
        if decoder.side or decoder.generating:
            side(attempt, self.delivery, decoder, self.stall, out, now)
        if not pieces and dedup is not None and not dedup.resolved:
            text = dedup.poll(now=now)  # a hold that ran out
            if text:
                self.deliver(text, out)
        if pieces:
            attempt.output(now, len(pieces))
            self.stall.output(now)
            text = pieces[0] if len(pieces) == 1 else "".join(pieces)
            if dedup is not None and not dedup.resolved:
                text = dedup.feed(text, now=now)
                if dedup.missed:
                    attempt.ending(complete=False)
                    return Ended(self.seam.missed(attempt.route, self.memory))
            if text:
                self.deliver(text, out)
        slow = self.pace.output(now, len(pieces)) if pieces and self.pace is not None else None
        if attempt.calls:
            calls = attempt.take_calls()
            if dedup is not None:  # a continuation
                calls = self._not_run_before(calls, attempt)
            self.delivery.call(calls)
            for call in calls:
                out.append(ToolCallEvent(call.id, call.name, call.arguments))
        if ending:
            attempt.ending(complete=fail is None)
            return Ended(fail)
        if self.delivery.cut:
            return self._cut_off(attempt)
        if slow is not None and self.pace is not None:
            attempt.ending(complete=False)
            why = (
                f"the stream slowed to {slow:.2g} tokens/s, below its floor of "
                f"{self.pace.floor:.2g} (over {self.pace.window:g} s)"
            )
            return Ended(failure("slow", why))
        return None

    def _not_run_before(
        self, calls: tuple[ToolCall, ...], attempt: AttemptState
    ) -> tuple[ToolCall, ...]:
        """A continuation's calls, less those of the conversation's last tool round: a model
        asked to go on may take "continue" for a new turn and run the last round again — a
        round the answer would not have had, which the caller would run twice. Calls of
        earlier rounds stay (an agent runs its tests again after an edit); a dropped call
        marks the answer ``join="calls_dropped"``, not complete."""
        if self._ran is None:
            self._ran = calls_already_run(self.opts.messages)
        kept = tuple(c for c in calls if not is_call_already_run(c.name, c.arguments, self._ran))
        if len(kept) < len(calls):
            self.seam.repeated_calls()
            self.delivery.join_as("calls_dropped")
            self.log.info(
                "streamres.tool_round_repeated",
                model=attempt.route.key,
                dropped=[c.name for c in calls if c not in kept],
                hint="the continuation called the last tool round again (same names and "
                "arguments); those calls are not handed on and the answer is marked "
                "join=calls_dropped",
            )
        return kept

    def _cut_off(self, attempt: AttemptState) -> Ended:
        """The answer reached a bound (``ReadLimits.answer``, ``max_tokens``): it ends here,
        complete with ``finish_reason="length"``; the rest of the stream is not read."""
        attempt.ending(complete=False)
        bound = (
            f"max_tokens={self.opts.max_tokens}"
            if self.delivery.cut == "max_tokens"
            else f"ReadLimits.answer={self.opts.read_limits.answer}"
        )
        self.log.warning(
            "streamres.answer_cut",
            model=attempt.route.key,
            chars=self.delivery.chars,
            bound=bound,
            hint="the server kept sending past the answer's bound; it ends as length",
        )
        return Ended(None)

    def finish(
        self, attempt: AttemptState, fail: Failure | None, out: list[Event], now: float
    ) -> Failure | None:
        """The attempt ended (``fail``: how): a continuation's held text is decided and
        delivered; one that missed its seam fails. Returns how it ended."""
        exchange = attempt.sent
        dedup = exchange.dedup
        if dedup is not None and fail is None and not dedup.resolved:
            text = dedup.finish(now=now)
            if text:
                self.deliver(text, out)
            if dedup.missed:
                fail = self.seam.missed(attempt.route, self.memory)
        if self.delivery.chars - attempt.chars_before:
            self.delivery.keep_signed_thinking(exchange.decoder.signed_thinking)
        return fail


def classify_body(exchange: Exchange, data: bytes, *, wall: float) -> Failure:
    """What the start of a body that is not an event stream says (``wall``: the wall-clock
    time, for Retry-After dates)."""
    with contextlib.suppress(InflateError):  # unreadable: classified as it came
        data = exchange.inflater.feed(data)[:ERROR_BODY_LIMIT]
    text = data.decode("utf-8", "replace")
    status, headers = exchange.status, exchange.headers
    url = redact_url(exchange.request.url)
    if status >= 400:
        return classify_response(status, headers, text, now=wall, url=url)
    return classify_not_a_stream(status, headers, text, url=url, now=wall)


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
    attempt: AttemptState,
    delivery: Delivery,
    decoder: StreamDecoder,
    stall: StallTimer,
    out: list[Event],
    now: float,
) -> None:
    """Reasoning and tool calls: the model is working (the stall timer restarts). Reasoning
    comes before the text it leads to (``out`` has it now); tool calls end the turn, so they
    go after this read's text (kept in ``attempt.calls``)."""
    stall.output(now)
    decoder.generating = False
    for kind, value in decoder.side:
        if kind == "thinking":
            if value := delivery.think(value):
                out.append(ThinkingEvent(value))
        else:
            attempt.calls_made(value)
    decoder.side.clear()
    if decoder.calls and sum(c.size for c in decoder.calls.values()) > delivery.room:
        delivery.calls_too_long()
