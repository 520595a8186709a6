"""The stream's read timer: each read bounded by a deadline that moves, nothing else touched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from streamres._shell.timer import TIMEOUT, ReadTimer, clock

pytestmark = pytest.mark.anyio
_open: list[Body] = []


@pytest.fixture(autouse=True)
def _close_bodies() -> object:
    yield
    for body in _open:
        body.send.close()
        body.recv.close()
    _open.clear()


class Body:
    """An async byte iterator the test feeds."""

    def __init__(self) -> None:
        self.send, self.recv = anyio.create_memory_object_stream[bytes | None](16)
        _open.append(self)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        got = await self.recv.receive()
        if got is None:
            raise StopAsyncIteration
        return got


async def test_a_read_past_its_deadline_times_out() -> None:
    """Nothing comes before the deadline: TIMEOUT, at the deadline."""
    now = clock()
    timer, body = ReadTimer(), Body()
    start = now()
    assert await timer.read(body, start + 0.05) is TIMEOUT
    assert now() - start >= 0.05
    timer.close()


async def test_a_read_returns_data_and_the_end() -> None:
    """Data before the deadline comes back as it is; the end of the body is None."""
    now = clock()
    timer, body = ReadTimer(), Body()
    body.send.send_nowait(b"abc")
    body.send.send_nowait(None)
    assert await timer.read(body, now() + 5) == b"abc"
    assert await timer.read(body, now() + 5) is None
    timer.close()


async def test_the_timer_never_cancels_between_reads() -> None:
    """A read that ended in time, then the caller's own work past that deadline: untouched
    (the reason a cancel scope must not span a generator's yield)."""
    now = clock()
    timer, body = ReadTimer(), Body()
    body.send.send_nowait(b"x")
    assert await timer.read(body, now() + 0.05) == b"x"
    await anyio.sleep(0.15)  # the caller's code, past the deadline: not cancelled
    body.send.send_nowait(b"y")
    assert await timer.read(body, now() + 5) == b"y"
    timer.close()


async def test_a_deadline_that_moved_later_is_kept() -> None:
    """A first read armed the timer early; a later read with a later deadline gets its data
    although the first deadline passed meanwhile (the timer re-arms instead of firing)."""
    now = clock()
    timer, body = ReadTimer(), Body()
    body.send.send_nowait(b"a")
    assert await timer.read(body, now() + 0.05) == b"a"

    async def later() -> None:
        await anyio.sleep(0.2)
        body.send.send_nowait(b"b")

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        assert await timer.read(body, now() + 5) == b"b"
    timer.close()


async def test_the_callers_own_cancellation_goes_through() -> None:
    """A caller's timeout shorter than the read's deadline cancels the read, as it should."""
    now = clock()
    timer, body = ReadTimer(), Body()
    with anyio.move_on_after(0.05) as scope:
        await timer.read(body, now() + 5)
    assert scope.cancelled_caught
    timer.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_reads_from_new_tasks_each_cancel_their_own(anyio_backend: str) -> None:
    """Each event pulled from a new task (``asyncio.wait_for`` does that): the timeout ends
    that task's read, and the task that first read is left alone."""
    now = clock()
    timer, body = ReadTimer(), Body()
    body.send.send_nowait(b"1")
    assert await asyncio.wait_for(timer.read(body, now() + 5), 5) == b"1"
    assert await asyncio.wait_for(timer.read(body, now() + 0.05), 5) is TIMEOUT
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.1)  # the first task is not cancelled later either
    timer.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timeout_leaves_no_pending_cancellation(anyio_backend: str) -> None:
    """After a TIMEOUT, the task is not marked as cancelling: later waits run normally."""
    now = clock()
    timer, body = ReadTimer(), Body()
    assert await timer.read(body, now() + 0.02) is TIMEOUT
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    async with asyncio.timeout(1):
        await asyncio.sleep(0.01)
    timer.close()
