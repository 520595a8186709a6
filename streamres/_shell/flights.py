"""Fewer requests at peak: identical requests share one stream, repeats come from the cache.
I/O shell (the store and the rules are pure: ``_core.cache``).

Single-flight: a request identical to one in flight (same messages, model chain, parameters)
does not make its own: it follows the first one's stream from its start, with its own
deadline and cancellation. The shared stream runs in the client's own task group under the
first caller's deadline (a request whose deadline ends more than a second after it starts its
own); it stops when every follower has left. A complete answer is kept (when the request may
be cached) and a repeat streams it back — at once, or at ``Cache.pace`` tokens per second —
with its done event marked ``cache="hit"``.

Near-repeats (``Cache(semantic=Semantic())``): on an exact miss, the question (the last user
message; the rest of the request must be identical) is looked up by its normalised text, then by
its embedding (``_core.semantic``), among the kept answers — a match streams its answer back
marked ``cache="semantic"`` with the matched question and its score — then among the questions
in flight, whose stream it follows (``cache="joined"``, with the match). The question's vector,
made once for the lookups, is kept with the answer when it completes.

With ``shared=`` the fleet's cache (``shared.cache``) stands behind this process's: looked in
on a miss here, written to when an answer is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from streamres._core.cache import AnswerStore, Cache, CacheStats
from streamres._core.errors import DeadlineExceeded, StreamError
from streamres._core.events import DoneEvent, Event, TextEvent, Usage
from streamres._core.semantic import Match, SemanticIndex, normalise
from streamres._shell.embedder import Embedder
from streamres._shell.shared.cache import SharedCache

__all__ = ["Flights", "Question"]


@dataclass
class Question:
    """A request's question for the semantic cache: its context's hash and its text."""

    bucket: str
    text: str
    vector: Sequence[float] | None = None
    embedded: bool = False


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
        self.semantic = cache.semantic
        self.index = SemanticIndex(cache.max_entries)
        #: Questions whose answers are being streamed now (near-repeats may follow them).
        self.in_flight = SemanticIndex(cache.max_entries)
        self.embedder = Embedder(cache.semantic.embed if cache.semantic else None)
        #: The fleet's cache, with ``shared=`` (set while shared state is running).
        self.remote: SharedCache | None = None

    def stream(
        self,
        key: str,
        keep: bool,
        deadline: float,
        start: Callable[[], AsyncIterator[Event]],
        question: Question | None = None,
    ) -> AsyncIterator[Event]:
        """The events for a request: kept, joined, or its own (shared with later joiners)."""
        now = anyio.current_time()
        if keep:
            kept = self.store.get(key, now)
            if kept is not None:
                self.stats.hits += 1
                return self._replay(kept)
            if self.remote is not None or (question is not None and self.semantic is not None):
                return self._lookup(key, deadline, start, question)
            self.stats.misses += 1
        return self._own_or_join(key, keep, deadline, start, None)

    async def _lookup(
        self,
        key: str,
        deadline: float,
        start: Callable[[], AsyncIterator[Event]],
        question: Question | None,
    ) -> AsyncIterator[Event]:
        """Kept by another process; else a question asked before in other words (answered, or
        in flight); else this request's own answer."""
        now = anyio.current_time()
        replay: AsyncIterator[Event] | None = None
        kept = await self._fetch(key)
        if kept is not None:
            self.stats.hits += 1
            replay = self._replay(kept)
        elif question is not None and self.semantic is not None:
            remote = self.remote is not None  # another process's question: its answer is there
            match = await self._find(
                self.index, question, lambda k: remote or self.store.alive(k, now)
            )
            kept = await self._fetch(match.key) if match else None
            if match is not None and kept is not None:
                self.stats.semantic_hits += 1
                replay = self._replay(kept, match)
            elif match is not None:
                self.index.discard(match.key)  # its answer is gone
        if replay is None:
            self.stats.misses += 1
            near = None
            if question is not None and self.semantic is not None and self.cache.single_flight:
                near = await self._find(
                    self.in_flight, question, lambda k: self._joinable(k, now + deadline)
                )
            replay = self._own_or_join(key, True, deadline, start, question, near)
        try:
            async for ev in replay:
                yield ev
        finally:
            await replay.aclose()  # type: ignore[attr-defined]

    async def _fetch(self, key: str) -> tuple[Event, ...] | None:
        """The answer kept under ``key``: here, else in the fleet's cache (then kept here)."""
        kept = self.store.get(key, anyio.current_time())
        if kept is None and self.remote is not None:
            kept = await self.remote.get(key)
            if kept is not None:
                self.store.put(key, kept, _size(kept), anyio.current_time())
        return kept

    async def _find(
        self, index: SemanticIndex, question: Question, alive: Callable[[str], bool]
    ) -> Match | None:
        """The question's match in ``index``: by normalised text, else by its vector (made
        once per request)."""
        assert self.semantic is not None
        match = index.same(question.bucket, question.text, alive)
        if match is None and not question.embedded:
            question.embedded = True
            question.vector = await self.embedder.embed(normalise(question.text))
        if match is None and question.vector is not None:
            match = index.closest(
                question.bucket, question.text, question.vector, self.semantic, alive
            )
        return match

    def _joinable(self, key: str, ends: float) -> bool:
        """May a request that must end by ``ends`` follow the flight under ``key``?"""
        flight = self._flying.get(key)
        return (
            flight is not None
            and not flight.answered  # an answer already given is the cache's to give again
            and flight.ends + min(1.0, 0.05 * (ends - anyio.current_time())) >= ends
        )

    def _own_or_join(
        self,
        key: str,
        keep: bool,
        deadline: float,
        start: Callable[[], AsyncIterator[Event]],
        question: Question | None,
        near: Match | None = None,
    ) -> AsyncIterator[Event]:
        """Follow the identical request in flight (or the near one ``near`` names), else start
        this one's own flight. The same deadline, asked a moment later, may join."""
        now = anyio.current_time()
        joining = near.key if near is not None else key
        if self.cache.single_flight and self._joinable(joining, now + deadline):
            flight = self._flying[joining]
            self.stats.joins += 1
            flight.followers += 1  # counted now: the flight must not stop before it is read
            return self._follow(flight, now + deadline, joined=True, match=near)
        flight = _Flight(now + deadline)
        flight.followers += 1
        if self.cache.single_flight:
            self._flying[key] = flight
            if question is not None:
                self.in_flight.add(question.bucket, key, question.text, question.vector)
        self.tg.start_soon(self._fly, key, keep, flight, start, question)
        return self._follow(flight, now + deadline, joined=False)

    async def _fly(
        self,
        key: str,
        keep: bool,
        flight: _Flight,
        start: Callable[[], AsyncIterator[Event]],
        question: Question | None,
    ) -> None:
        try:
            with flight.scope:
                events = start()
                try:
                    async for ev in events:
                        flight.events.append(ev)
                        if isinstance(ev, DoneEvent):
                            flight.answered = True
                            self._keep(key, keep, flight.events, question)
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
                self.in_flight.discard(key)

    def _keep(self, key: str, keep: bool, events: list[Event], question: Question | None) -> None:
        """A complete answer, kept for repeats (kept at its done event: the body's end may
        still be read after it)."""
        last = events[-1]
        if keep and isinstance(last, DoneEvent) and last.finish_reason in ("stop", "tool_calls"):
            kept = (*(e for e in events if e.type in _KEPT), last)
            self.store.put(key, kept, _size(kept), anyio.current_time())
            if question is not None:
                self.index.add(question.bucket, key, question.text, question.vector)
            if self.remote is not None:
                asked = (question.bucket, question.text, question.vector) if question else None
                self.remote.put(self.tg, key, kept, _size(kept), asked)

    async def _follow(
        self, flight: _Flight, ends: float, *, joined: bool, match: Match | None = None
    ) -> AsyncIterator[Event]:
        i = 0
        try:
            while True:
                while i < len(flight.events):
                    ev = flight.events[i]
                    i += 1
                    if isinstance(ev, DoneEvent):
                        yield _marked(ev, match, "joined") if joined else ev
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

    async def _replay(
        self, kept: tuple[Event, ...], match: Match | None = None
    ) -> AsyncIterator[Event]:
        started = anyio.current_time()
        pace = self.cache.pace
        for ev in kept:
            if isinstance(ev, DoneEvent):
                usage = Usage(
                    delivered_tokens=ev.usage.delivered_tokens, encoding=ev.usage.encoding
                )
                yield dataclasses.replace(
                    _marked(ev, match, "semantic" if match else "hit"),
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


def _marked(
    done: DoneEvent, match: Match | None, how: Literal["hit", "semantic", "joined"]
) -> DoneEvent:
    """The done event marked with how it was obtained (and the near question it came from)."""
    if match is None:
        return dataclasses.replace(done, cache=how)
    return dataclasses.replace(
        done, cache=how, cache_match=match.question, cache_score=round(match.score, 4)
    )


def _size(kept: tuple[Event, ...]) -> int:
    """What a kept answer counts against ``Cache.max_chars``."""
    last = kept[-1]
    return (len(last.text) if isinstance(last, DoneEvent) else 0) + 64


def _text(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextEvent))
