"""One answer's events, kept for readers that come and go: what resuming on the person's side
is built on.

An :class:`AnswerLog` numbers an answer's events from 0 as they come. A reader follows it from
any number (``follow(after=n)``): it gets the events after ``n`` at once, then each new one as
it is logged, and stops at the end of the answer — so a page that reloads, or a connection that
drops and comes back, picks the answer up where it was and sees each event once. The text the
log holds is what a later producer continues from (``Client.stream(..., continue_from=
log.text)``) when the first one is gone: the model is asked for the rest, not for all of it.

>>> log = streamres.AnswerLog()
>>> async with anyio.create_task_group() as tg:
...     tg.start_soon(log.record, client.stream(messages))
...     async for n, ev in log.follow():     # a reader; others may come and go
...         ...

Bounded as the answer is: the library caps an answer's characters (``ReadLimits.answer``), and
the log holds that answer's events once — compactly: its text and thinking events as their text
(UTF-8) and where each ends, an event object made again when it is read (``events[n]``), so a
held character costs about a byte (UTF-8) and an event nine more.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Literal, overload

import anyio

from streamres._core.errors import StreamError
from streamres._core.events import DoneEvent, Event, TextEvent, ThinkingEvent
from streamres._shell.stream import ResilientStream

__all__ = ["AnswerLog"]


#: An event kept as an object: the object and its place (measured with tracemalloc).
EVENT_BYTES = 200


def _object_bytes(event: Event) -> int:
    """About what an event kept as an object takes: its strings as Python keeps them (1, 2 or
    4 bytes a character, by the widest) and 200 bytes an object."""
    n = EVENT_BYTES
    for name in ("text", "thinking", "arguments", "name", "message"):
        value = getattr(event, name, None)
        if isinstance(value, str) and value:
            n += sys.getsizeof(value)
    if isinstance(event, DoneEvent):
        n += sum(EVENT_BYTES + sys.getsizeof(c.arguments) for c in event.tool_calls)
    return n


class Events(Sequence[Event]):
    """A log's events: text and thinking as their text in one buffer each (UTF-8) and where
    each ends; a done event whose text is the log's without it (made again when read); any
    other event as it is."""

    def __init__(self) -> None:
        self._text = bytearray()
        self._thinking = bytearray()
        #: Per event: 1 text, 2 thinking (ending at ``_ends``), 3 a done event whose text is
        #: the log's (in ``_others`` without it), 0 another (in ``_others``).
        self._kinds = bytearray()
        self._ends = array("Q")
        self._others: dict[int, Event] = {}
        self._objects = 0  # what the others take (``_object_bytes``)

    def append(self, event: Event) -> None:
        n = len(self._kinds)
        if isinstance(event, TextEvent):
            self._text += event.text.encode()
            self._kinds.append(1)
            self._ends.append(len(self._text))
        elif isinstance(event, ThinkingEvent):
            self._thinking += event.text.encode()
            self._kinds.append(2)
            self._ends.append(len(self._thinking))
        else:
            kind = 0
            if isinstance(event, DoneEvent) and event.text and self._text == event.text.encode():
                event, kind = dataclasses.replace(event, text=""), 3
            self._kinds.append(kind)
            self._ends.append(0)
            self._others[n] = event
            self._objects += _object_bytes(event)

    def __len__(self) -> int:
        return len(self._kinds)

    @overload
    def __getitem__(self, i: int) -> Event: ...
    @overload
    def __getitem__(self, i: slice) -> list[Event]: ...
    def __getitem__(self, i: int | slice) -> Event | list[Event]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        kind = self._kinds[i]  # IndexError past the end, as a list's
        if not kind:
            return self._others[i]
        if kind == 3:
            done = self._others[i]
            assert isinstance(done, DoneEvent)
            return dataclasses.replace(done, text=self.text)
        end = self._ends[i]
        start = next((self._ends[k] for k in range(i - 1, -1, -1) if self._kinds[k] == kind), 0)
        if kind == 1:
            return TextEvent(self._text[start:end].decode())
        return ThinkingEvent(self._thinking[start:end].decode())

    def __iter__(self) -> Iterator[Event]:
        ends = {1: 0, 2: 0}
        for i, kind in enumerate(self._kinds):
            if kind in (0, 3):
                yield self[i]
                continue
            start, end = ends[kind], self._ends[i]
            ends[kind] = end
            buffer = self._text if kind == 1 else self._thinking
            piece = buffer[start:end].decode()
            yield TextEvent(piece) if kind == 1 else ThinkingEvent(piece)

    @property
    def text(self) -> str:
        return self._text.decode()

    @property
    def nbytes(self) -> int:
        """About what the events take in memory."""
        return len(self._text) + len(self._thinking) + 9 * len(self._kinds) + self._objects


class AnswerLog:
    """An answer's events, numbered, for any number of readers, in this process."""

    def __init__(self) -> None:
        self.events = Events()
        #: ``running``; ``completed`` (a done event), ``failed`` (``error``), ``stopped``.
        self.status: Literal["running", "completed", "failed", "stopped"] = "running"
        self.error: StreamError | None = None
        self._done: int | None = None  # the done event's number
        self._changed: anyio.Event | None = None

    @property
    def text(self) -> str:
        """The answer's text so far (the done event's, once it came)."""
        if self._done is None:
            return self.events.text
        done = self.events[self._done]
        assert isinstance(done, DoneEvent)
        return done.text

    @property
    def ended(self) -> bool:
        return self.status != "running"

    def append(self, event: Event) -> int:
        """Log ``event``; its number."""
        if self.ended:
            raise RuntimeError("the answer has ended: nothing more is logged")
        self.events.append(event)
        if isinstance(event, DoneEvent):
            self._done = len(self.events) - 1
            self.status = "completed"
        self._wake()
        return len(self.events) - 1

    def end(self, error: StreamError | None = None, *, stopped: bool = False) -> None:
        """The answer ends without a done event: it failed (``error``) or was ``stopped``."""
        if self.ended:
            return
        self.status = "stopped" if stopped else "failed"
        self.error = error
        self._wake()

    async def changed(self, seen: int) -> None:
        """Wait until the log has more than ``seen`` events, or has ended."""
        while len(self.events) <= seen and not self.ended:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    async def follow(self, after: int = -1) -> AsyncIterator[tuple[int, Event]]:
        """The events numbered after ``after``, then each new one, until the answer ends."""
        n = max(after, -1) + 1
        while True:
            while n < len(self.events):
                yield n, self.events[n]
                n += 1
            if self.ended:
                return
            await self.changed(n)

    async def record(self, stream: ResilientStream) -> None:
        """Read ``stream`` into the log to its end; a failure ends the log with its error
        (which carries the partial answer), never raised here."""
        try:
            async with stream as events:
                async for ev in events:
                    self.append(ev)
        except StreamError as exc:
            self.end(exc)
        finally:
            if not self.ended:  # cancelled: the reader went and nobody holds the answer
                self.end(stopped=True)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
