"""A ``Client`` at scale: its own load is not blamed on the server, and many streams at once
through the default settings are all exact (a small seeded version of ``streamres bench
--load``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import anyio
import pytest

import streamres
from streamres._core.policy import connect_allowance, this_side_busy
from streamres._shell.lag import HALF_LIFE, LoopLag
from streamres._shell.stream import Pools
from streamres.upstream import Upstream

Q = [{"role": "user", "content": "Explain TCP slow start."}]
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the loop's lateness is measured the same way on trio; one is enough


def test_the_loop_s_lateness_decays_and_says_when_a_timer_is_this_side_s() -> None:
    lag = LoopLag()
    lag.record(2.0, now=10.0)
    assert lag.late(10.0) == 2.0 and connect_allowance(lag.late(10.0)) == 4.0
    assert abs(lag.late(10.0 + HALF_LIFE) - 1.0) < 1e-9
    assert this_side_busy(3.0, lag.late(10.0))
    assert not this_side_busy(3.0, lag.late(10.0 + 2 * HALF_LIFE))
    lag.record(0.1, now=10.0 + HALF_LIFE)  # a smaller lateness does not hide the recent one
    assert abs(lag.late(10.0 + HALF_LIFE) - 1.0) < 1e-9


def test_a_timer_run_before_the_watcher_wakes_sees_the_loop_s_lateness() -> None:
    """The loop was blocked 1.8 s; a connect timer that fires in the same turn as the watcher's
    overdue wake-up, and runs first, sees the loop 1.8 s late — not the 0.9 s left of the
    last measurement, which would blame the server for this side's block (one run in three
    of the test below, before)."""
    lag = LoopLag()
    lag.record(1.8, now=10.0)  # the last block, measured
    lag.expect(10.05)  # the watcher sleeps again; the loop is blocked once more until 11.85
    assert lag.late(11.85) >= 1.8 - 1e-9
    assert this_side_busy(3.0, lag.late(11.85))
    lag.record(1.8, now=11.86)
    lag.expect(11.91)
    assert lag.late(11.9) <= lag.late(11.86)  # not overdue yet: the measured lateness, decaying


@contextmanager
def unanswering() -> Iterator[str]:
    """A loopback port whose listen queue is full: a connect to it never completes (the SYN
    is dropped), so it can only time out."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):  # fill the queue (its length is the backlog plus one or two)
            c = socket.socket()
            c.setblocking(False)
            with suppress(BlockingIOError):
                c.connect(("127.0.0.1", port))
            fillers.append(c)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for c in fillers:
            c.close()
        server.close()


async def test_a_connect_that_times_out_while_this_loop_is_blocked_is_not_the_server_s() -> None:
    """This process's event loop is blocked 1.8 s at a time (its own load); a connect times out
    meanwhile: the attempt is this side's failure (``client_busy``), retried on the same model,
    and the model's breaker (threshold 1) stays closed, its failures 0 — where a timeout
    without the loop's lateness would have opened it."""
    with unanswering() as url:
        route = streamres.Route("m", base_url=url, api_key="k")
        async with streamres.Client([route], breaker_threshold=1) as client:

            async def hog() -> None:
                while True:
                    await anyio.sleep(0.05)
                    # The loop is busy with this process's own work: blocking it is the point.
                    time.sleep(1.8)  # noqa: ASYNC251

            errors: list[streamres.StreamError] = []

            async def ask() -> None:
                try:
                    async for _ in client.stream(Q, deadline=14):
                        pass
                except streamres.StreamError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hog)
                await ask()
                tg.cancel_scope.cancel()
            m = client.metrics()["m"]
    (error,) = errors  # the connect never completes: the deadline ends the answer
    assert error.history and {a.outcome for a in error.history} == {"client_busy"}, error.history
    assert "too busy" in str(error)
    assert m.client_side_failures >= 1
    assert (m.failures, m.breaker) == (0, "closed")


async def test_three_hundred_streams_at_once_through_a_default_client_are_all_exact() -> None:
    """The default pool is sized for streaming (a stream holds its connection for the whole
    answer): 300 at once, every answer exact, the breaker never opened."""
    async with Upstream(token_delay=0.01, words=60) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        expected = up.answer(Q)
        texts: list[str] = []
        async with streamres.Client([route]) as client:

            async def one() -> None:
                text = ""
                async for ev in client.stream(Q, deadline=120):
                    if ev.type == "text":
                        text += ev.text
                texts.append(text)

            async with anyio.create_task_group() as tg:
                for _ in range(300):
                    tg.start_soon(one)
            m = client.metrics()["m"]
    assert texts == [expected] * 300
    assert m.failures == 0 and up.peak_in_flight("m") > 100


def test_a_stream_takes_the_least_busy_pool() -> None:
    """One stream at a time always takes the first pool (its kept-alive connection); many at
    once spread evenly; a pool given back is the next one taken."""
    pools = Pools([None] * 4)  # type: ignore[list-item]  # only the counts are used
    assert [pools.take() for _ in range(3)] == [0, 1, 2]
    pools.give(1)
    assert pools.take() == 1
    for i in (0, 1, 2):
        pools.give(i)
    assert [pools.take() for _ in range(2)] == [0, 1]  # all free again: the first ones
    pools.give(0)
    pools.give(1)
    assert pools.streams == [0, 0, 0, 0]
    assert pools.take() == 0 and pools.streams == [1, 0, 0, 0]


async def test_one_answer_after_another_reuses_one_connection() -> None:
    """A chat's answers one after another go through the same kept-alive connection, though
    the client has many pools (a round robin would open one per pool)."""
    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            for _ in range(5):
                async for _ev in client.stream(Q, model="m"):
                    pass
        assert up.connections_accepted == 1


def test_the_proxy_listens_with_the_kernel_s_longest_queue() -> None:
    """uvicorn's backlog of 2,048 drops the SYNs of a larger burst (sent again 1, 3, 7 s
    later): the proxy asks for as much as the kernel allows, never more than its connections."""
    from pathlib import Path

    from streamres.proxy.config import ServerLimits
    from streamres.proxy.server.serve import _server_settings

    where = Path("/proc/sys/net/core/somaxconn")
    if not where.exists():
        pytest.skip("the kernel's listen-queue limit is read on Linux")
    most = int(where.read_text())
    assert _server_settings(ServerLimits())["backlog"] == min(ServerLimits().connections, most)
    assert _server_settings(ServerLimits(connections=300))["backlog"] == min(300, most)
