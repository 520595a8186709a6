"""Fewer requests at peak: identical requests share one stream, repeats come from the cache.
I/O shell (the store and the rules are pure: ``_core.cache``).

Single-flight: a request identical to one in flight (same messages, model chain, parameters)
does not make its own: it follows the first one's stream from its start, with its own
deadline and cancellation. The shared stream runs in the client's own task group under the
first caller's deadline (a request whose deadline ends more than a second after it starts its
own); it stops when every follower has left. A complete answer is kept (when the request may
be cached) and a repeat streams it back — at once, or at ``Cache.pace`` tokens per second —
with its done event marked ``cache="hit"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable

import anyio

from streamres._core.cache import AnswerStore, Cache, CacheStats
from streamres._core.errors import DeadlineExceeded, StreamError
from streamres._core.events import DoneEvent, Event, TextEvent, Usage

__all__ = ["Flights"]

#: Events a repeat gets again (status events belonged to the first request's trouble).
_KEPT = ("text", "thinking", "tool_call")


class _Flight:
    def __init__(self, ends: float) -> None:
        self.ends = ends
        self.events: list[Event] = []
        self.done = False
        self.error: StreamError | None = None
        self.changed = anyio.Event()
        self.followers = 0
        #: The done event is out: the rest (reading the body's end) finishes on its own.
        self.answered = False
        self.scope = anyio.CancelScope()

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class Flights:
    """A client's flights in progress and its kept answers."""

    def __init__(self, cache: Cache, tg: anyio.abc.TaskGroup) -> None:
        self.cache = cache
        self.tg = tg
        self.stats = CacheStats()
        self.store: AnswerStore[tuple[Event, ...]] = AnswerStore(
            cache.ttl, cache.max_entries, cache.max_chars
        )
        self._flying: dict[str, _Flight] = {}

    def stream(
        self,
        key: str,
        keep: bool,
        deadline: float,
        start: Callable[[], AsyncIterator[Event]],
    ) -> AsyncIterator[Event]:
        """The events for a request: kept, joined, or its own (shared with later joiners)."""
        now = anyio.current_time()
        if keep:
            kept = self.store.get(key, now)
            if kept is not None:
                self.stats.hits += 1
                return self._replay(kept)
            self.stats.misses += 1
        flight = self._flying.get(key) if self.cache.single_flight else None
        slack = min(1.0, 0.05 * deadline)  # the same deadline, asked a moment later, joins
        if (
            flight is not None
            and not flight.answered  # an answer already given is the cache's to give again
            and flight.ends + slack >= now + deadline
        ):
            self.stats.joins += 1
            flight.followers += 1  # counted now: the flight must not stop before it is read
            return self._follow(flight, now + deadline, joined=True)
        flight = _Flight(now + deadline)
        flight.followers += 1
        if self.cache.single_flight:
            self._flying[key] = flight
        self.tg.start_soon(self._fly, key, keep, flight, start)
        return self._follow(flight, now + deadline, joined=False)

    async def _fly(
        self, key: str, keep: bool, flight: _Flight, start: Callable[[], AsyncIterator[Event]]
    ) -> None:
        try:
            with flight.scope:
                events = start()
                try:
                    async for ev in events:
                        flight.events.append(ev)
                        if isinstance(ev, DoneEvent):
                            flight.answered = True
                            self._keep(key, keep, flight.events)
                        flight.wake()
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
        except StreamError as exc:
            flight.error = exc
        finally:
            flight.done = True
            flight.wake()
            if self._flying.get(key) is flight:
                del self._flying[key]

    def _keep(self, key: str, keep: bool, events: list[Event]) -> None:
        """A complete answer, kept for repeats (kept at its done event: the body's end may
        still be read after it)."""
        last = events[-1]
        if keep and isinstance(last, DoneEvent) and last.finish_reason in ("stop", "tool_calls"):
            kept = (*(e for e in events if e.type in _KEPT), last)
            self.store.put(key, kept, len(last.text) + 64, anyio.current_time())

    async def _follow(self, flight: _Flight, ends: float, *, joined: bool) -> AsyncIterator[Event]:
        i = 0
        try:
            while True:
                while i < len(flight.events):
                    ev = flight.events[i]
                    i += 1
                    if isinstance(ev, DoneEvent):
                        yield dataclasses.replace(ev, cache="joined") if joined else ev
                        return  # the rest of the flight (reading the body's end) is not ours
                    yield ev
                if flight.done:
                    if flight.error is not None:
                        raise flight.error
                    if flight.events and isinstance(flight.events[-1], DoneEvent):
                        return
                    raise StreamError(
                        "the shared stream was stopped (the client closed)",
                        partial_text=_text(flight.events),
                    )
                changed = flight.changed
                with anyio.move_on_after(max(0.0, ends - anyio.current_time())):
                    await changed.wait()
                    continue
                raise DeadlineExceeded(
                    "the deadline passed while following an identical request's stream",
                    partial_text=_text(flight.events[:i]),
                    reason="deadline",
                )
        finally:
            flight.followers -= 1
            if flight.followers == 0 and not flight.done and not flight.answered:
                flight.scope.cancel()  # nobody is listening: close the upstream stream

    async def _replay(self, kept: tuple[Event, ...]) -> AsyncIterator[Event]:
        started = anyio.current_time()
        pace = self.cache.pace
        for ev in kept:
            if isinstance(ev, DoneEvent):
                usage = Usage(
                    delivered_tokens=ev.usage.delivered_tokens, encoding=ev.usage.encoding
                )
                yield dataclasses.replace(
                    ev,
                    cache="hit",
                    attempts=0,
                    resumes=0,
                    history=(),
                    usage=usage,
                    elapsed=anyio.current_time() - started,
                )
                return
            if pace is not None and isinstance(ev, TextEvent):
                await anyio.sleep(max(1, len(ev.text) // 4) / pace)
            yield ev


def _text(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextEvent))
