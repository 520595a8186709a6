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
the log holds that answer's events once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import anyio

from streamres._core.errors import StreamError
from streamres._core.events import DoneEvent, Event, TextEvent
from streamres._shell.stream import ResilientStream

__all__ = ["AnswerLog"]


class AnswerLog:
    """An answer's events, numbered, for any number of readers, in this process."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        #: ``running``; ``completed`` (a done event), ``failed`` (``error``), ``stopped``.
        self.status: Literal["running", "completed", "failed", "stopped"] = "running"
        self.error: StreamError | None = None
        self._text: list[str] = []
        self._changed: anyio.Event | None = None

    @property
    def text(self) -> str:
        """The answer's text so far (the done event's, once it came)."""
        if len(self._text) > 1:
            self._text[:] = ["".join(self._text)]
        return self._text[0] if self._text else ""

    @property
    def ended(self) -> bool:
        return self.status != "running"

    def append(self, event: Event) -> int:
        """Log ``event``; its number."""
        if self.ended:
            raise RuntimeError("the answer has ended: nothing more is logged")
        self.events.append(event)
        if isinstance(event, TextEvent):
            self._text.append(event.text)
        elif isinstance(event, DoneEvent):
            self._text[:] = [event.text]
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
