"""The connect pace in the shell (``_shell/connects``): streams wait for room in their server's
window, first come first served; a burst through a ``Client`` opens no more at once."""

from __future__ import annotations

import socket

import anyio
import pytest

from streamres import Client, Route, StreamError
from streamres._core.pace import START, ConnectPace
from streamres._shell.connects import Connects, Turn
from streamres.upstream import Upstream
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio

S = "http://127.0.0.1:1"


async def test_streams_wait_for_room_in_their_order() -> None:
    connects = Connects()
    connects.paces[S] = pace = ConnectPace(window=2)
    order: list[int] = []
    turns: dict[int, Turn] = {}
    most = 0

    async def one(i: int) -> None:
        nonlocal most
        turns[i] = await connects.start(S)
        order.append(i)
        most = max(most, pace.in_progress)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
            await anyio.wait_all_tasks_blocked()
        assert order == [0, 1]
        for i in range(6):
            connects.end(S, turns[i], "unknown")  # the window stays as it is
            await anyio.wait_all_tasks_blocked()
    assert order == list(range(6))
    assert most <= 2
    assert pace.waited == 4


async def test_a_waiter_that_is_cancelled_leaves_the_line_and_hands_its_room_on() -> None:
    connects = Connects()
    first = await connects.start(S)
    connects.paces[S].window = 1
    got: list[Turn] = []
    scopes: list[anyio.CancelScope] = []

    async def wait() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            got.append(await connects.start(S))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        scopes[0].cancel()  # it goes while it waits
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert not got
        connects.end(S, first, "unknown")
    assert len(got) == 1
    assert connects.paces[S].in_progress == 1
    assert not connects._waiting[S]


class _Watched(ConnectPace):
    """A connect pace that notes how many were in progress against the window at each start."""

    over = 0

    def start(self) -> int:
        got = super().start()
        self.over = max(self.over, self.in_progress - int(self.window))
        return got


async def test_a_burst_through_a_client_opens_no_more_than_the_window_at_once() -> None:
    """300 streams at once against one server: every answer exact; never more connects in
    progress than the window allowed, which starts at ``START`` — the rest waited their turn —
    and opened as connects completed quickly."""
    async with Upstream(token_delay=0.001) as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with Client(routes, backoff=FAST) as client:
            assert client._limits is not None
            pace = _Watched()
            client._limits.connects.paces[f"http://127.0.0.1:{up.port}"] = pace
            texts: list[str] = []

            async def one() -> None:
                text, _, _ = await collect(client.stream(USER))
                texts.append(text)

            async with anyio.create_task_group() as tg:
                for _ in range(300):
                    tg.start_soon(one)
        assert texts == [up.answer(USER)] * 300
        assert pace.most >= START  # the burst filled the window
        assert pace.over <= 0
        assert pace.waited > 0
        assert pace.window > START
        assert pace.in_progress == 0


async def test_a_refused_connect_halves_its_server_s_window() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    routes = [Route("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")]
    async with Client(routes, backoff=FAST, deadline=2) as client:
        with pytest.raises(StreamError):
            await collect(client.stream(USER))
        assert client._limits is not None
        (pace,) = client._limits.connects.paces.values()
    assert pace.window < START
    assert pace.in_progress == 0
