"""Reads bounded by a deadline that moves, without a cancel scope per read. I/O shell.

Real servers send one event per TCP write, so a stream of 2,000 tokens is 2,000 reads, and
whatever a read costs besides the bytes is paid 2,000 times. A fresh ``anyio.move_on_after``
around each read costs about as much as decoding the event (most of the gap to bare
httpx-sse, measured). So each stream keeps one :class:`ReadTimer`:

- on asyncio, a single timer callback at the current deadline; a read only updates
  ``deadline``. When the callback fires early (the deadline moved on), it re-arms itself at
  the new one; when it fires during a read past the deadline, it cancels the task, and the read
  reports :data:`TIMEOUT` after taking back exactly that cancellation (any other cancellation
  propagates). Outside a read, the timer never touches the task: a caller's code between two
  events can never be cancelled by it — the reason a cancel scope must not span a ``yield``.
- on trio, a native cancel scope per read (cheap there); elsewhere anyio's.

The clock is the event loop's own (``loop.time`` / ``trio.current_time``), read without the
backend lookup ``anyio.current_time`` makes on every call.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import anyio
import sniffio

__all__ = ["TIMEOUT", "ReadTimer", "clock"]


class _Timeout:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TIMEOUT"


#: What :meth:`ReadTimer.read` returns when the deadline passed first.
TIMEOUT: Final = _Timeout()


def clock() -> Callable[[], float]:
    """The running event loop's clock (the one cancel-scope deadlines are measured in)."""
    backend = sniffio.current_async_library()
    if backend == "asyncio":
        return asyncio.get_running_loop().time
    if backend == "trio":
        import trio

        return trio.current_time
    return anyio.current_time


class ReadTimer:
    """Bounds reads of one stream by a deadline. ``read(body, deadline)`` returns the next
    chunk, ``None`` at the end of the body, or :data:`TIMEOUT`."""

    def __new__(cls) -> ReadTimer:
        if cls is ReadTimer:
            backend = sniffio.current_async_library()
            if backend == "asyncio":
                return object.__new__(_AsyncioTimer)
            if backend == "trio":
                return object.__new__(_TrioTimer)
            return object.__new__(_ScopeTimer)
        return object.__new__(cls)

    async def read(self, body: AsyncIterator[bytes], deadline: float) -> bytes | _Timeout | None:
        raise NotImplementedError

    def close(self) -> None:
        """The stream is over: drop the pending timer, if any."""


class _AsyncioTimer(ReadTimer):
    __slots__ = ("_deadline", "_fired", "_handle", "_loop", "_reading", "_task")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self._deadline = math.inf
        self._reading = False
        self._fired = False

    def _fire(self) -> None:
        self._handle = None
        if not self._reading:
            return  # between reads: the next read arms the timer again
        if self._loop.time() < self._deadline:  # the deadline moved on since it was armed
            self._handle = self._loop.call_at(self._deadline, self._fire)
            return
        self._fired = True
        self._task.cancel()

    async def read(self, body: AsyncIterator[bytes], deadline: float) -> bytes | _Timeout | None:
        # The task of *this* read: a caller may pull each event from a new task
        # (``asyncio.wait_for(anext(stream), ...)`` does), and only this one may be cancelled.
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._deadline = deadline
        handle = self._handle
        if handle is None or handle.when() > deadline:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(deadline, self._fire)
        self._reading = True
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if not self._fired:
                raise
            self._fired = False
            if self._task.uncancel() > 0:
                raise  # cancelled by someone else as well: that one goes on
            return TIMEOUT
        finally:
            self._reading = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _TrioTimer(ReadTimer):
    __slots__ = ("_scope",)

    def __init__(self) -> None:
        import trio

        self._scope: Any = trio.CancelScope

    async def read(self, body: AsyncIterator[bytes], deadline: float) -> bytes | _Timeout | None:
        with self._scope(deadline=deadline):
            try:
                return await body.__anext__()
            except StopAsyncIteration:
                return None
        return TIMEOUT


class _ScopeTimer(ReadTimer):
    __slots__ = ()

    async def read(self, body: AsyncIterator[bytes], deadline: float) -> bytes | _Timeout | None:
        with anyio.CancelScope(deadline=deadline):
            try:
                return await body.__anext__()
            except StopAsyncIteration:
                return None
        return TIMEOUT
