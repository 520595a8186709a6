"""Fewer requests at peak: single-flight and the exact cache."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import streamres
from streamres._core.cache import AnswerStore, Cache, cache_key
from streamres.upstream import Upstream
from tests.helpers.streams import USER, collect

pytestmark = pytest.mark.anyio


def _routes(up: Upstream) -> list[streamres.Route]:
    return [streamres.Route("m", base_url=up.openai_url, api_key="k")]


async def _ask(client: streamres.Client, **kw: Any) -> tuple[str, streamres.DoneEvent]:
    text, _, done = await collect(client.stream(USER, model="m", **kw))
    return text, done


async def test_identical_requests_in_flight_make_one_upstream_request() -> None:
    """Five identical requests at once: one upstream stream; each caller gets the whole answer
    from its own start; four are marked as joined."""
    async with (
        Upstream(token_delay=0.005) as up,
        streamres.Client(_routes(up), cache=Cache()) as client,
    ):
        results: list[tuple[str, streamres.DoneEvent]] = []

        async def one() -> None:
            results.append(await _ask(client))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(one)
        assert len(up.requests) == 1
        assert all(text == up.answer(USER) == done.text for text, done in results)
        assert sorted(done.cache for _, done in results) == [
            "",
            "joined",
            "joined",
            "joined",
            "joined",
        ]
        stats = client.cache_stats()
        assert stats is not None and stats.joins == 4 and stats.requests_saved == 4


async def test_a_repeated_request_streams_from_the_cache() -> None:
    """The same question again: no request; the same text streamed, the done event marked."""
    async with Upstream() as up, streamres.Client(_routes(up), cache=Cache()) as client:
        first, done1 = await _ask(client)
        again, done2 = await _ask(client)
        assert len(up.requests) == 1
        assert again == first == up.answer(USER)
        assert (done1.cache, done2.cache, done2.attempts) == ("", "hit", 0)
        stats = client.cache_stats()
        assert stats is not None and (stats.hits, stats.misses) == (1, 1)


async def test_sampled_requests_and_tools_are_not_kept_unless_asked() -> None:
    """temperature > 0 asks for a new sample, tools may act on a changed world: not kept by
    default; kept when the cache says so."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    async with Upstream() as up, streamres.Client(_routes(up), cache=Cache()) as client:
        await _ask(client, temperature=0.7)
        await _ask(client, temperature=0.7)
        await _ask(client, tools=[tool])
        await _ask(client, tools=[tool])
        assert len(up.requests) == 4
    async with (
        Upstream() as up,
        streamres.Client(
            _routes(up), cache=Cache(include_sampled=True, include_tools=True)
        ) as client,
    ):
        await _ask(client, temperature=0.7)
        await _ask(client, temperature=0.7)
        await _ask(client, tools=[tool])
        await _ask(client, tools=[tool])
        assert len(up.requests) == 2


async def test_a_follower_that_leaves_does_not_stop_the_others() -> None:
    """One of two callers sharing a stream stops early: the other still gets the whole answer;
    when the last one leaves, the upstream stream is closed."""
    async with (
        Upstream(token_delay=0.01) as up,
        streamres.Client(_routes(up), cache=Cache()) as client,
    ):
        first = client.stream(USER, model="m")
        second = client.stream(USER, model="m")
        async with first:
            async for ev in first:
                if ev.type == "text":
                    break
        text, _, _ = await collect(second)
        assert text == up.answer(USER) and len(up.requests) == 1
        third = client.stream([{"role": "user", "content": "Another question"}], model="m")
        async with third:
            async for ev in third:
                if ev.type == "text":
                    break
        with anyio.fail_after(2):
            await up.wait_streams_done()


async def test_a_follower_keeps_its_own_deadline() -> None:
    """A joiner whose deadline is shorter than the answer: DeadlineExceeded for it alone, with
    what it had; the first caller gets the whole answer."""
    async with (
        Upstream(token_delay=0.02) as up,
        streamres.Client(_routes(up), cache=Cache()) as client,
    ):
        got: dict[str, Any] = {}

        async def first() -> None:
            got["first"] = await _ask(client)

        async def short() -> None:
            try:
                await _ask(client, deadline=0.3)
            except streamres.DeadlineExceeded as exc:
                got["short"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(short)
        assert got["first"][0] == up.answer(USER)
        err = got["short"]
        assert err.partial_text and up.answer(USER).startswith(err.partial_text)


def test_the_store_bounds_entries_size_and_time() -> None:
    """TTL, entry and size bounds hold; the least recently used go first."""
    store: AnswerStore[str] = AnswerStore(ttl=10.0, max_entries=2, max_size=100)
    store.put("a", "A", 10, now=0.0)
    store.put("b", "B", 10, now=0.0)
    assert store.get("a", now=1.0) == "A"  # a is now the most recent
    store.put("c", "C", 10, now=1.0)
    assert store.get("b", now=1.0) is None and len(store) == 2
    assert store.get("a", now=10.5) is None  # expired
    store.put("big", "X", 95, now=2.0)
    assert store.size <= 100 and store.get("c", now=2.0) is None
    store.put("huge", "Y", 101, now=2.0)
    assert store.get("huge", now=2.0) is None


def test_a_key_is_the_request_itself() -> None:
    """Same messages, chain and parameters: the same key; any difference: another."""
    k = cache_key(USER, ["m"], None, {"temperature": 0})
    assert k == cache_key([dict(m) for m in USER], ["m"], None, {"temperature": 0})
    assert k != cache_key(USER, ["m", "n"], None, {"temperature": 0})
    assert k != cache_key(USER, ["m"], 100, {"temperature": 0})
    assert k != cache_key(USER, ["m"], None, {"temperature": 0.1})


async def test_cache_savings_are_prometheus_metrics() -> None:
    """The cache's hits, misses, joins and requests saved appear at a scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    from streamres.prometheus import register

    async with Upstream() as up, streamres.Client(_routes(up), cache=Cache()) as client:
        await _ask(client)
        await _ask(client)
        registry = CollectorRegistry()
        register(client, registry)
        text = generate_latest(registry).decode()
    assert "streamres_cache_hits_total 1.0" in text
    assert "streamres_requests_saved_total 1.0" in text


async def test_answers_are_shared_only_within_a_cache_scope() -> None:
    """cache_scope: the same question from two scopes makes two requests (at once or later),
    from one scope one; a scope that is not a string is refused at the call."""
    async with (
        Upstream(token_delay=0.005) as up,
        streamres.Client(_routes(up), cache=Cache()) as client,
    ):
        async with anyio.create_task_group() as tg:  # in flight together: no joining across
            for scope in ("team-a", "team-b"):
                tg.start_soon(collect, client.stream(USER, model="m", cache_scope=scope))
        assert len(up.requests) == 2
        text, _, done = await collect(client.stream(USER, model="m", cache_scope="team-a"))
        assert text == up.answer(USER) and done.cache == "hit" and len(up.requests) == 2
        with pytest.raises(streamres.InvalidRequest, match="cache_scope"):
            client.stream(USER, model="m", cache_scope=7)  # type: ignore[arg-type]
