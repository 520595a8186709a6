"""Priority lanes: when slots are full, the next free one goes to the highest-priority waiter,
first come first served within a lane — in one process, and across processes on a real Redis."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamres
from streamres._core.lanes import BACKGROUND, NORMAL, Line, check_priority, parse_priority
from streamres._shell.limits import Slots
from streamres.upstream import Upstream
from tests.helpers.redis import EVERY_REDIS, connected
from tests.helpers.redis import Servers as RedisServers

pytestmark = pytest.mark.anyio


def _q(name: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question {name}: explain TCP slow start."}]


def _asked(up: Upstream) -> list[str]:
    """The questions the upstream was sent, in the order it received them."""
    return [str(r.body["messages"][-1]["content"]).split(":")[0] for r in up.requests]


# -- the line itself ----------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), max_size=40))
def test_the_line_serves_by_priority_then_arrival(waiters: list[tuple[int, bool]]) -> None:
    line: Line[int] = Line()
    tickets = [line.push(i, prio) for i, (prio, _) in enumerate(waiters)]
    for ticket, (_, leaves) in zip(tickets, waiters, strict=True):
        if leaves:
            assert line.remove(ticket)
    served = []
    while (t := line.pop()) is not None:
        served.append(t.item)
    stay = [(i, p) for i, (p, leaves) in enumerate(waiters) if not leaves]
    assert served == [i for i, _ in sorted(stay, key=lambda ip: (-ip[1], ip[0]))]
    assert len(line) == 0


def test_a_served_waiter_cannot_be_removed() -> None:
    line: Line[str] = Line()
    ticket = line.push("a", 0)
    assert line.pop() is ticket
    assert not line.remove(ticket)


def test_priorities_by_name_number_and_refusal() -> None:
    assert [parse_priority(t) for t in ("high", " Low ", "normal", "7", "-3")] == [
        10,
        -10,
        0,
        7,
        -3,
    ]
    assert check_priority("HIGH") == 10
    for bad in (True, 1.5, "urgent", None):
        with pytest.raises(ValueError, match="priority must be an integer"):
            check_priority(bad)
    with pytest.raises(ValueError, match="between -100 and 100"):
        parse_priority("1000")


# -- one process --------------------------------------------------------------------------


async def test_a_freed_slot_goes_to_the_highest_waiter_and_a_cancelled_one_hands_it_on() -> None:
    slots = Slots(1)
    await slots.acquire(0)
    order: list[str] = []

    async def wait(name: str, prio: int) -> None:
        await slots.acquire(prio)
        order.append(name)
        slots.release()

    async with anyio.create_task_group() as tg:
        for i, (name, prio) in enumerate(
            (("low1", -10), ("low2", -10), ("high", 10), ("normal", 0))
        ):
            tg.start_soon(wait, name, prio)
            with anyio.fail_after(5):  # in this order
                while slots.waiting < i + 1:
                    await anyio.lowlevel.checkpoint()
        slots.release()
    assert order == ["high", "normal", "low1", "low2"]
    assert slots.free == 1

    # A waiter served at the moment it is cancelled either takes the slot (and gives it back)
    # or hands it to the next one: it is never lost.
    await slots.acquire(0)
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def cancelled() -> None:
            with scope:
                await slots.acquire(5)
                slots.release()

        tg.start_soon(cancelled)
        tg.start_soon(wait, "next", 0)
        with anyio.fail_after(5):
            while slots.waiting < 2:
                await anyio.lowlevel.checkpoint()
        slots.release()  # served: the priority-5 waiter...
        scope.cancel()  # ...cancelled before it runs
    assert order[-1] == "next" and slots.free == 1 and slots.waiting == 0


async def test_background_work_leaves_a_slot_for_a_person() -> None:
    """Of two slots, background work takes one and waits for the other while it is the last;
    a person's request takes it at once; once two are free, background work takes one."""
    slots = Slots(2)
    await slots.acquire(BACKGROUND)
    queued = anyio.Event()

    async def background() -> None:
        await slots.acquire(BACKGROUND)
        queued.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(background)
        await _when(lambda: slots.waiting == 1)
        with anyio.fail_after(1):
            await slots.acquire(NORMAL)  # at once: the slot kept free
        assert slots.free == 0 and not queued.is_set()
        slots.release()  # the person's: one free, kept for a person
        assert not queued.is_set() and slots.free == 1
        slots.release()  # the first background answer's: two free, background goes on
    assert queued.is_set() and slots.free == 1
    single = Slots(1)
    with anyio.fail_after(1):
        await single.acquire(BACKGROUND)  # a set of one keeps nothing back


async def test_background_work_leaves_a_slot_for_a_person_across_processes(
    redis_server: Any,
) -> None:
    """The same in the fleet's line in Redis: a background answer holds one of two slots, a
    second waits on the line, and a person's answer is served past it."""
    line = "{streamres}:slots:route:m:line"
    async with Upstream(words=12) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", max_in_flight=2)
        async with (
            connected(redis_server.url, decode_responses=True) as redis,
            streamres.Client([route], shared=redis_server.url) as client,
        ):
            held = await _hold_first_slot(client, "held", "background")
            async with anyio.create_task_group() as tg:
                tg.start_soon(_answer, client, "second", "background")
                with anyio.fail_after(20):
                    while await redis.zcard(line) < 1:  # noqa: ASYNC110 (in Redis)
                        await anyio.sleep(0.05)
                with anyio.fail_after(20):
                    await _answer(client, "person", "normal")
                assert _asked(up) == ["Question held", "Question person"]
                await held.aclose()
    assert _asked(up)[-1] == "Question second"


async def _hold_first_slot(client: streamres.Client, name: str, priority: str = "normal") -> Any:
    """Start an answer and stop reading after its first text: it keeps its slot."""
    events = client.stream(_q(name), model="m", priority=priority)
    async for ev in events:
        if ev.type == "text":
            return events
    raise AssertionError("no text")


async def _answer(client: streamres.Client, name: str, priority: int | str) -> None:
    async with client.stream(_q(name), model="m", priority=priority) as events:
        async for _ in events:
            pass


async def _when(condition: Any) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.lowlevel.checkpoint()


async def test_a_person_gets_the_slot_a_batch_is_waiting_for() -> None:
    """One account slot, held by a batch answer; three more batch answers wait; a chat answer
    (high) arrives last and is served next; the batch answers follow in arrival order. Without
    lanes (everyone normal) the chat answer would come last."""
    async with Upstream(words=12) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client([route], account_limits={"acct": 1}) as client:
            limits = client._limits
            assert limits is not None
            held = await _hold_first_slot(client, "held")
            async with anyio.create_task_group() as tg:
                for i, name in enumerate(("batch1", "batch2", "batch3")):
                    tg.start_soon(_answer, client, name, "low")
                    await _when(lambda i=i: limits.waiting(route) == i + 1)
                tg.start_soon(_answer, client, "chat", "high")
                await _when(lambda: limits.waiting(route) == 4)
                await held.aclose()
    assert _asked(up) == ["Question held", "Question chat"] + [
        f"Question batch{i}" for i in (1, 2, 3)
    ]


async def test_a_bad_priority_is_refused_before_any_request() -> None:
    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            with pytest.raises(streamres.InvalidRequest, match="priority must be"):
                client.stream(_q("x"), priority="urgent")
        assert up.requests == []


# -- across processes, on a real Redis ------------------------------------------------------

BATCH = textwrap.dedent(
    """
    import sys, anyio, streamres
    from streamres._shell.shared.servers import Servers
    url, shared = sys.argv[1], sys.argv[2]
    LINE = "{streamres}:slots:account:acct:line"
    async def one(client, name):
        q = [{"role": "user", "content": f"Question {name}: explain TCP slow start."}]
        async for _ in client.stream(q, model="m", priority="low"):
            pass
    async def main():
        route = streamres.Route("m", base_url=url, api_key="k", account="acct")
        redis, enter = Servers.parse(shared).client()
        async with enter(), streamres.Client(
            [route], account_limits={"acct": 1}, shared=shared
        ) as c, anyio.create_task_group() as tg:
            for i, name in enumerate(("batch1", "batch2", "batch3")):
                tg.start_soon(one, c, name)
                with anyio.fail_after(20):  # in the line before the next one comes
                    while await redis.zcard(LINE) < i + 1:
                        await anyio.sleep(0.02)
    anyio.run(main)
    """
)


@EVERY_REDIS
async def test_lanes_hold_across_processes_sharing_redis(redis_servers: RedisServers) -> None:
    """A slot held in this process; another process queues three low-priority answers on the
    shared line; a high-priority answer arriving here after them is served first, then the
    batch in arrival order."""
    line = "{streamres}:slots:account:acct:line"
    async with Upstream(words=12) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with (
            connected(redis_servers.url, decode_responses=True) as redis,
            streamres.Client(
                [route], account_limits={"acct": 1}, shared=redis_servers.url
            ) as client,
        ):
            held = await _hold_first_slot(client, "held")
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: anyio.run_process(
                        [sys.executable, "-c", BATCH, up.openai_url, redis_servers.url],
                        check=True,
                        stderr=None,
                    )
                )
                with anyio.fail_after(20):
                    while await redis.zcard(line) < 3:  # noqa: ASYNC110 (another process's)
                        await anyio.sleep(0.05)
                tg.start_soon(_answer, client, "chat", "high")
                with anyio.fail_after(20):
                    while await redis.zcard(line) < 4:  # noqa: ASYNC110 (in Redis)
                        await anyio.sleep(0.05)
                await held.aclose()
            assert await redis.zcard(line) == 0
    assert _asked(up) == ["Question held", "Question chat"] + [
        f"Question batch{i}" for i in (1, 2, 3)
    ]


# -- through the proxy: a lane per client key, lowered by a header ---------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_the_proxy_serves_client_keys_by_their_lane() -> None:
    """Client keys with lanes (routes.toml ``priority``): the chat key's answer takes the slot
    the batch key's answers wait for; the chat key asking ``x-streamres-priority: low`` joins
    their lane, where the key with fewer answers in flight goes first (the batch key holds the
    slot and queued two); a batch key asking ``high`` stays in its lane; a bad header is a
    400."""
    from streamres.proxy import running
    from streamres.proxy.config import parse
    from streamres.upstream import FaultPlan

    # The first answer stalls (keep-alives only) until its client goes: it holds the slot.
    async with Upstream(words=12, faults=FaultPlan("stall@3"), ping_interval=0.05) as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url, "account": "a"}],
            "accounts": {"a": 1},
            "policy": {"stall_timeout": 60},
            "clients": [
                {"name": "ui", "key_env": "UI", "priority": "high"},
                {"name": "batch", "key_env": "BATCH", "priority": "low"},
            ],
        }
        config = parse(raw, {"UI": "ui-key", "BATCH": "batch-key"})
        async with running(config, port=0) as run, httpx_client() as http:
            limits = run.proxy.client._limits
            route = config.routes[0]
            assert limits is not None

            async def ask(name: str, key: str, lane: str | None = None) -> None:
                headers = {"authorization": f"Bearer {key}"}
                if lane is not None:
                    headers["x-streamres-priority"] = lane
                body = {"model": "m", "messages": _q(name)}
                r = await http.post(run.url + "/v1/chat/completions", headers=headers, json=body)
                assert r.status_code == 200, r.text

            body = {"model": "m", "messages": _q("held"), "stream": True}
            async with http.stream(
                "POST",
                run.url + "/v1/chat/completions",
                headers={"authorization": "Bearer batch-key"},
                json=body,
            ) as held:
                chunks = held.aiter_bytes()  # kept: a dropped iterator closes the response
                await chunks.__anext__()  # streaming, then stalled: it holds the slot
                async with anyio.create_task_group() as tg:
                    order = [
                        ("batch1", "batch-key", None),
                        ("batch2", "batch-key", "high"),  # never above its key's lane
                        ("polite", "ui-key", "low"),
                        ("chat", "ui-key", None),
                    ]
                    for i, (name, key, lane) in enumerate(order):
                        tg.start_soon(ask, name, key, lane)
                        await _when(lambda i=i: limits.waiting(route) == i + 1)
                    await held.aclose()
            bad = await http.post(
                run.url + "/v1/chat/completions",
                headers={"authorization": "Bearer ui-key", "x-streamres-priority": "urgent"},
                json={"model": "m", "messages": _q("bad")},
            )
            assert bad.status_code == 400 and "priority" in bad.json()["error"]["message"]
    assert _asked(up) == [
        "Question held",
        "Question chat",
        "Question polite",
        "Question batch1",
        "Question batch2",
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_a_persons_answer_does_not_wait_for_another_keys_background_work() -> None:
    """A route of two slots; key A starts two background responses (a few seconds each) and
    key B then asks a streamed question: B's first event comes within three times its time
    alone and a second — background work never takes a route's last slot — and A's answers
    still all complete."""
    from streamres.proxy import running
    from streamres.proxy.config import parse

    async with Upstream(words=60, token_delay=0.05) as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url, "max_in_flight": 2}],
            "clients": [{"name": "a", "key_env": "A"}, {"name": "b", "key_env": "B"}],
        }
        config = parse(raw, {"A": "key-a", "B": "key-b"})
        async with running(config, port=0) as run, httpx_client() as http:

            async def first_event(question: str) -> float:
                body = {"model": "m", "messages": _q(question), "stream": True}
                headers = {"authorization": "Bearer key-b"}
                began = anyio.current_time()
                url = run.url + "/v1/chat/completions"
                async with http.stream("POST", url, headers=headers, json=body) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            return anyio.current_time() - began
                raise AssertionError("no event")

            alone = await first_event("alone")
            ids = []
            for i in range(2):
                r = await http.post(
                    run.url + "/v1/responses",
                    headers={"authorization": "Bearer key-a"},
                    json={"model": "m", "input": f"Background {i}", "background": True},
                )
                assert r.status_code == 200, r.text
                ids.append(r.json()["id"])
            await _when(lambda: up.in_flight("m") >= 1)
            waited = await first_event("while A works")
            assert waited <= 3 * alone + 1.0, (waited, alone)
            await run.proxy.answers.settled()
            for answer in ids:
                got = await http.get(
                    f"{run.url}/v1/responses/{answer}", headers={"authorization": "Bearer key-a"}
                )
                assert got.json()["status"] == "completed"


def httpx_client() -> Any:
    import httpx

    return httpx.AsyncClient(timeout=30)
