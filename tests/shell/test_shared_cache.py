"""The answer cache shared through a real ``redis-server``: an answer kept by one process is
a hit for the others, near-repeats included, within the fleet's bounds, and each process goes
on with its own cache when Redis goes away."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import streamres
from streamres._core.cache import decode_answer, encode_answer
from streamres._core.events import DoneEvent, TextEvent, ToolCall, ToolCallEvent, Usage
from streamres.upstream import Upstream
from tests.helpers.redis import EVERY_REDIS, RedisServer
from tests.helpers.redis import Servers as RedisServers
from tests.helpers.streams import collect

pytestmark = pytest.mark.anyio


def _q(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _client(up: Upstream, redis: RedisServers, cache: streamres.Cache) -> streamres.Client:
    return streamres.Client(
        [streamres.Route("m", base_url=up.openai_url, api_key="k")],
        shared=redis.url,
        cache=cache,
    )


async def _ask(client: streamres.Client, text: str) -> DoneEvent:
    _, _, done = await collect(client.stream(_q(text), model="m"))
    return done


async def _joined(client: streamres.Client) -> None:
    """Until the client is on the fleet's Redis (a cluster just made may refuse its first
    calls: the client starts on its own and joins within a second)."""
    assert client._shared_state is not None
    with anyio.fail_after(10):
        await client._shared_state.back()


async def _flushed(client: streamres.Client) -> None:
    assert client._flights is not None and client._flights.remote is not None
    await client._flights.remote.flushed()


def _toy(text: str) -> Sequence[float]:
    return {"how can i reset my password": [1.0, 0.1]}.get(
        text, [1.0, 0.0] if "password" in text else [0.0, 1.0]
    )


@EVERY_REDIS
async def test_an_answer_kept_by_one_process_is_a_hit_for_another(
    redis_servers: RedisServers,
) -> None:
    """Two clients (as two proxy workers) on one Redis: the second asks what the first was
    answered — no upstream request, the same text, marked a hit."""
    async with Upstream() as up:
        async with _client(up, redis_servers, streamres.Cache()) as a:
            await _joined(a)
            first = await _ask(a, "Explain TCP slow start.")
            await _flushed(a)
        async with _client(up, redis_servers, streamres.Cache()) as b:
            await _joined(b)
            again = await _ask(b, "Explain TCP slow start.")
        assert len(up.requests) == 1
        assert (
            again.text == first.text == up.answer(_q("Explain TCP slow start."))
            and again.cache == "hit"
        )


async def test_near_repeats_are_answered_across_processes(redis_server: RedisServer) -> None:
    """A question kept by one client reaches a client already running (published) and one
    started later (read at start): both answer it asked in other words from the fleet's
    cache."""
    semantic = streamres.Cache(semantic=streamres.Semantic(embed=_toy))
    async with Upstream() as up:
        async with _client(up, redis_server, semantic) as early:
            heard = anyio.Event()
            assert early._flights is not None and early._flights.remote is not None
            remote = early._flights.remote
            add = remote.on_question
            assert add is not None

            def hear(*args: Any) -> None:
                add(*args)
                heard.set()

            remote.on_question = hear
            async with _client(up, redis_server, semantic) as a:
                first = await _ask(a, "How do I reset my password?")
                await _flushed(a)
            await heard.wait()
            near = await _ask(early, "How can I reset my password?")
        async with _client(up, redis_server, semantic) as late:
            later = await _ask(late, "How can I reset my password?")
        assert len(up.requests) == 1
        for done in (near, later):
            assert (done.cache, done.cache_match, done.text) == (
                "semantic",
                "How do I reset my password?",
                first.text,
            )


async def test_the_fleets_cache_keeps_its_bounds(redis_server: RedisServer) -> None:
    """max_entries holds for the fleet: three answers with room for two, the oldest gone for
    every process; Redis holds two entries."""
    import coredis

    cache = streamres.Cache(max_entries=2)
    async with Upstream() as up:
        async with _client(up, redis_server, cache) as a:
            for text in ("one?", "two?", "three?"):
                await _ask(a, text)
                await _flushed(a)  # written in this order (writes run in the background)
        async with _client(up, redis_server, cache) as b:
            assert (await _ask(b, "three?")).cache == "hit"
            assert (await _ask(b, "one?")).cache == ""
        async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as r:
            assert await r.zcard("{streamres}:cache:index") == 2
            assert len(await r.keys("{streamres}:cache:a:*")) == 2
        assert len(up.requests) == 4


async def test_without_redis_each_process_keeps_its_own_cache(redis_server: RedisServer) -> None:
    async with Upstream() as up, _client(up, redis_server, streamres.Cache()) as a:
        redis_server.stop()
        first = await _ask(a, "Explain TCP slow start.")
        again = await _ask(a, "Explain TCP slow start.")
        assert again.cache == "hit" and again.text == first.text and len(up.requests) == 1
        status = a.shared_status()
        assert status is not None and not status.connected


def test_a_kept_answer_round_trips_as_json_and_damage_is_a_miss() -> None:
    done = DoneEvent(
        text="hi",
        finish_reason="tool_calls",
        model="m",
        attempts=2,
        resumes=1,
        usage=Usage(delivered_tokens=3, encoding="cl100k_base"),
        tool_calls=(ToolCall("c1", "f", '{"a": 1}'),),
        thinking="hmm",
    )
    kept = (TextEvent("hi"), ToolCallEvent("c1", "f", '{"a": 1}'), done)
    back = decode_answer(encode_answer(kept))
    assert back is not None and back[:2] == kept[:2]
    last = back[-1]
    assert isinstance(last, DoneEvent)
    assert (last.text, last.finish_reason, last.tool_calls, last.thinking) == (
        "hi",
        "tool_calls",
        done.tool_calls,
        "hmm",
    )
    assert (last.usage.delivered_tokens, last.usage.encoding) == (3, "cl100k_base")
    for damaged in ("", "{", "[]", '[{"type": "text", "text": "x"}]', '[{"type": "evil"}]', "null"):
        assert decode_answer(damaged) is None
