"""One held answer: its events, encoded in the client's API and numbered for readers that come
and go, and what its producer and the answer store keep about it (:mod:`.held` holds many)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

import streamres
from streamres.proxy.answers.blocks import Blocks
from streamres.proxy.answers.shared import error_from, event_from, event_json
from streamres.proxy.faces.inbound import Call
from streamres.proxy.faces.outbound import Writer, answer_usage, responses_usage

__all__ = ["HELD_BYTES", "Full", "Held", "Ledger", "Status", "added_ms", "within"]

#: A held answer before its events: itself, its writer, its log, its request's parts besides
#: their text (tracemalloc); its request weighs about 1.25 bytes a byte besides.
HELD_BYTES = 6_000


def _items_bytes(ev: streamres.Event, api: str) -> int:
    """What a Responses answer keeps of an event besides its log: a done event's text in its
    output item (which its response object shares)."""
    return sys.getsizeof(ev.text) if api == "responses" and ev.type == "done" else 0


def added_ms(wall: float, done: streamres.DoneEvent, waited: float) -> float:
    """Milliseconds the proxy added to an answer: its time from the request's arrival to its
    end, less the time its attempts spent with the upstream (each from its request to its end)
    and the backoff between them. What is left is the proxy's own work — reading the request,
    setting the answer up, writing it — and a wait for a route's slot."""
    with_upstream = sum(a.seconds for a in done.history)
    return max(0.0, (wall - with_upstream - waited) * 1000)


@contextlib.contextmanager
def within(context: Any) -> Iterator[None]:
    """Run the block in the OpenTelemetry ``context`` (``None``: as it is)."""
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


class Full(Exception):
    """No room for another answer: ``status`` 429 (the key's own bound) or 503 (the
    proxy's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Ledger:
    """The bytes held answers weigh, in all and by client key, counted as they grow: making
    room costs nothing while there is room. Past ``limit`` as an answer grows, ``over`` is
    told (the store makes room: answers in flight grow past what was free when they began)."""

    total: int = 0
    by_owner: dict[str | None, int] = field(default_factory=dict)
    limit: int | None = None
    over: Callable[[str | None], None] | None = None

    def add(self, owner: str | None, n: int) -> None:
        self.total += n
        self.by_owner[owner] = self.by_owner.get(owner, 0) + n
        if n > 0 and self.limit is not None and self.total > self.limit and self.over:
            self.over(owner)


Status = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]


@dataclass(eq=False)
class Held:
    """One answer and what its readers need."""

    writer: Writer
    call: Call
    #: The client key that started it (``None``: the proxy has no keys).
    owner: str | None
    #: ``Client.stream``'s arguments for it (the chain, the lane, the cache scope, …).
    chain: list[str]
    kwargs: dict[str, Any]
    tenant: str | None
    #: When its deadline passes (anyio's clock): a producer started again keeps it.
    deadline_at: float
    #: The caller's trace context (its ``traceparent``), which the answer's span continues.
    context: Any = None
    log: streamres.AnswerLog = field(default_factory=streamres.AnswerLog)
    #: The encoded SSE events, kept compactly (a comment alone carries the number of the
    #: event before it, so it is replayed after that one).
    blocks: Blocks = field(default_factory=Blocks)
    #: What it keeps of its events besides its log and its blocks (``weight``).
    events_bytes: int = 0
    #: The weight its ledger was last told.
    counted: int = 0
    #: When its request came (``time.perf_counter``; ``None``: not timed, as a copy of
    #: another process's or a parked answer), the backoff it waited, and at its end what the
    #: proxy added to it (:func:`added_ms`).
    began: float | None = None
    waited: float = 0.0
    added: float | None = None
    #: Its response head may be sent: the first content came (status events wait before it).
    started: bool = False
    pending: list[streamres.Event] = field(default_factory=list)
    readers: int = 0
    #: Readers that came, the first included.
    reads: int = 0
    status: Status = "in_progress"
    parked: bool = False
    ended_at: float | None = None
    final: dict[str, Any] | None = None
    #: With shared state: what is still to be written to Redis (events as JSON, and their
    #: bytes); ``None``: not written there (no Redis, or a shadow of another process's).
    outbox: list[tuple[dict[str, Any] | None, bytes]] | None = None
    #: A shadow: another process produces the answer; this one follows its log in Redis.
    shadow: bool = False
    #: Blocks written to Redis (``None``: not written there; readers may have them all).
    durable: int | None = None
    _moved: anyio.Event | None = None
    #: A shadow's place in the answer's log in Redis (the last entry applied).
    entry: str = "0"
    #: Library events in the answer's log in Redis: written (its producer), applied (a shadow).
    logged: int = 0
    #: Its client key's slot in flight (``Slot``), given back when it stops running.
    slot: Any = None
    #: Where its weight is counted while the answer store holds it.
    ledger: Ledger | None = None
    #: Its keeper (the task writing it to Redis) runs; when it last wrote (anyio's clock).
    keeping: bool = False
    renewed: float = 0.0
    #: This process wrote the answer's end to Redis (it writes it again if Redis loses it).
    written: bool = False
    #: Another process took the answer on (this one stalled past its lease): this copy stops,
    #: and its readers read on from ``successor``, a shadow of the shared log.
    lost: bool = False
    successor: Held | None = None
    #: Copies whose readers read this one on (their readers count as this one's).
    moved_from: list[Held] = field(default_factory=list)
    _scope: anyio.CancelScope | None = None
    _stopping: bool = False
    _lingers: int = 0

    @property
    def id(self) -> str:
        return self.writer.id

    @property
    def producing(self) -> bool:
        return self._scope is not None

    @property
    def writes(self) -> bool:
        """This process writes the answer to Redis (it produces it, or parked it)."""
        return self.outbox is not None

    def read_anywhere(self) -> bool:
        """Someone reads it, here or through a copy that moved to it."""
        return bool(self.readers or any(h.readers for h in self.moved_from))

    def deadline_left(self) -> float:
        return self.deadline_at - anyio.current_time()

    @property
    def weight(self) -> int:
        """Bytes it holds in memory: itself and its request, its blocks and its log (the text
        of each, once encoded and once as UTF-8, and a few bytes an event), its other events as
        objects, the text item a Responses answer's writer has open."""
        kept = self.blocks.nbytes + self.log.events.nbytes + self.events_bytes
        return HELD_BYTES + self.call.size * 5 // 4 + kept + self.writer.open_text

    def weigh(self) -> None:
        """Tell its ledger what it weighs now."""
        if self.ledger is not None:
            w = self.weight
            self.ledger.add(self.owner, w - self.counted)
            self.counted = w

    @property
    def last_number(self) -> int:
        """The number of the last event held (-1: none yet)."""
        return self.blocks.last_number

    def after(self, number: int, start: int = 0) -> tuple[bytes, int]:
        """The held events after ``number`` from block ``start`` on, and where they end."""
        blocks = self.blocks
        i = blocks.after(number) if start == 0 and number >= 0 else start
        end = self.visible()
        while i < end and blocks.had(i, number):
            i += 1  # a reader ahead of this copy (it read on from another): not what it has
        return blocks.join(i, end), max(i, end)

    def visible(self) -> int:
        """How many blocks readers may have: all — or, written to Redis, those Redis has (a
        reader never holds an event another process could not give it again)."""
        return len(self.blocks) if self.durable is None else self.durable

    def read_all(self, i: int) -> bool:
        """Has a reader at block ``i`` had the whole answer, which has ended here?"""
        n = len(self.blocks)
        return self.successor is None and self.log.ended and i >= n and self.visible() == n

    def notify(self) -> None:
        """Something changed for the readers (an event, the end, a write to Redis)."""
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    async def moved(self) -> None:
        """Wait for the next :meth:`notify`."""
        if self._moved is None:
            self._moved = anyio.Event()
        await self._moved.wait()

    def _keep(self, data: bytes) -> None:
        self.blocks.keep(data)
        self.weigh()

    def _logged(self, ev: streamres.Event) -> None:
        self.log.append(ev)
        self.events_bytes += _items_bytes(ev, self.call.api)
        self.weigh()

    def add(self, ev: streamres.Event) -> None:
        """An event of the answer: encoded, kept, logged (which wakes the readers)."""
        w = self.writer
        if (ev.type == "text" or ev.type == "thinking") and self.started:
            plain = w.delta(ev.type, ev.text)
            if plain is not None:  # kept as its text; its bytes made when read (or written)
                frame, number, text = plain
                self.blocks.delta(frame, number, text)
                if self.outbox is not None:
                    self.outbox.append((event_json(ev), frame.block(number, text)))
                self._logged(ev)
                self.notify()
                return
        content = ev.type in ("text", "thinking", "tool_call", "done")
        if ev.type == "retry" or ev.type == "resume":
            self.waited += ev.delay
        elif ev.type == "done" and self.began is not None:
            self.added = added_ms(time.perf_counter() - self.began, ev, self.waited)
        if not content and not self.started and not w.status_events:
            self.pending.append(ev)  # status before any content: sent with the head
            self._out(ev, b"")
            self._logged(ev)
            self.notify()
            return
        data = self._open()
        if ev.type == "text":
            data += w.text(ev.text)
        elif ev.type == "thinking":
            data += w.thinking(ev.text)
        elif ev.type == "tool_call":
            data += w.tool_call(ev)
        elif ev.type == "done":
            data += w.done(ev)
        else:
            data += w.status(ev)
        self._keep(data)
        self._out(ev, data)
        if ev.type == "done":
            self.status = "incomplete" if ev.finish_reason == "length" else "completed"
            if self.call.api == "responses":
                self.final = w.snapshot(self.status)
                self.final["usage"] = responses_usage(*answer_usage(ev))
        self._logged(ev)
        self.notify()

    def _open(self) -> bytes:
        """The answer's start (and the status events before it), once."""
        if self.started:
            return b""
        self.started = True
        for ev in self.pending:  # the head names the model the answer went to
            self.writer.moved(ev)
        data = self.writer.start() + b"".join(self.writer.status(ev) for ev in self.pending)
        self.pending.clear()
        return data

    def fail(self, exc: streamres.StreamError) -> None:
        """The answer gave up: an error event after its partial (or, before any text, the
        error its first reader answers with)."""
        if self.started or self.writer.status_events:  # its readers have had the head
            data = self._open() + self.writer.failed(exc)
            self._keep(data)
            self._out(None, data)
        self.status = "failed"
        if self.call.api == "responses":
            self.final = self.writer.snapshot("failed", exc)
        self.log.end(exc)
        self.notify()

    def stopped(self) -> None:
        # Stopped before its first text: an empty answer, ended.
        data = self._open() + self.writer.stopped()
        self._keep(data)
        self._out(None, data)
        self.status = "cancelled"
        if self.call.api == "responses":
            self.final = self.writer.snapshot("cancelled")
        self.log.end(stopped=True)
        self.notify()

    def _out(self, ev: streamres.Event | None, data: bytes) -> None:
        if self.outbox is not None:
            self.outbox.append((None if ev is None else event_json(ev), data))

    def snapshot(self) -> dict[str, Any]:
        """The Responses API's response object, as it stands."""
        if self.final is not None:
            return self.final
        return self.writer.snapshot("in_progress" if self.started else "queued")

    def apply(self, entries: list[Any], me: str | None) -> bool:
        """Log entries from Redis (``(id, fields)``), applied to this copy: each event
        encoded again, which must give its producer's bytes (``False`` when it did not).
        Events this copy has already (its own — ``me``, the writer it is — a write sent
        again, or an answer written again whole) are skipped by number."""
        same = True
        outbox, self.outbox = self.outbox, None  # what others wrote is not written again
        try:
            for entry_id, fields in entries:
                self.entry = entry_id
                if self.log.ended or (outbox is not None and fields.get("w") == me):
                    continue  # the copy that writes it has what it wrote, acknowledged or not
                events = json.loads(fields.get("e") or "[]")
                skip = self.logged - int(fields.get("at", self.logged))
                before = len(self.blocks)
                for obj in events[max(0, skip) :]:
                    self.add(event_from(obj))
                self.logged += max(0, len(events) - max(0, skip))
                end = fields.get("end")
                if end == "failed":
                    error = json.loads(fields.get("error") or "{}")
                    self.fail(error_from(error, self.log.text))
                elif end == "cancelled":
                    self.stopped()
                elif end is not None and not self.log.ended:  # ended without its done event
                    self.fail(streamres.StreamError("the answer ended", partial_text=self.log.text))
                made = self.blocks.join(before, len(self.blocks)).decode("utf-8")
                checked = fields.get("b") or not events  # a rest written again: no bytes
                if skip == 0 and checked and made != fields.get("b", ""):
                    same = False
        finally:
            self.outbox = outbox
            if self.durable is not None:
                self.durable = len(self.blocks)
        return same
