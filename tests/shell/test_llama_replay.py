"""Exact before approximate: a stream from a server that keeps it (llama.cpp's, here the
embedded upstream speaking as one: ``Upstream(replay=True)``) is read on from the byte where it
broke — no continuation prompt, no second generation — and a generation nobody will read is
stopped. Only when re-attaching fails does a continuation start."""

from __future__ import annotations

import json
from typing import Any

import pytest

import streamres
from streamres.upstream import Upstream, split_tokens
from tests.helpers.chat_ui import QUESTION, TOOLS
from tests.helpers.streams import collect

pytestmark = pytest.mark.anyio

Q = [{"role": "user", "content": "Explain TCP slow start."}]


def _client(up: Upstream, **route: Any) -> streamres.Client:
    return streamres.Client(
        [streamres.Route("m", base_url=up.openai_url, api_key="k", **route)], stall_timeout=1
    )


def _paths(up: Upstream) -> list[tuple[str, int]]:
    return [(r.path, r.status) for r in up.requests]


@pytest.mark.parametrize("fault", ["reset@1", "reset@30", "reset@80", "stall@30"])
async def test_a_broken_stream_is_read_on_from_where_it_broke(fault: str) -> None:
    """Dropped (or silent) mid-answer: the answer is the uncut one, from one generation — the
    second request reads the same stream again from the byte the first one reached."""
    async with Upstream(faults=fault, replay=True, stall_seconds=3) as up, _client(up) as c:
        _, events, done = await collect(c.stream(Q, model="m"))
    assert done.text == up.answer(Q) and done.join == "none"
    assert _paths(up) == [("/v1/chat/completions", 200), ("/v1/stream", 200)]
    post, get = up.requests
    sent = post.headers["x-conversation-id"]
    assert get.body["conv_id"] == sent and int(get.body["from"]) > 0
    resumes = [e for e in events if e.type == "resume"]
    assert [r.strategy for r in resumes] == ["replay"]
    assert up.stopped == []  # read to its end: nothing to stop


async def test_a_tool_call_cut_in_its_arguments_is_completed_by_the_replay() -> None:
    """The break falls inside a tool call's arguments: the replayed bytes finish the same call
    (its id too: the same generation) through the broken attempt's own decoder."""
    async with Upstream(replay=True) as up, _client(up) as c:
        _, _, uncut = await collect(c.stream([QUESTION], model="m", tools=TOOLS))
    cut = len(split_tokens(uncut.text)) + 2
    async with Upstream(faults=f"reset@{cut}", replay=True) as up, _client(up) as c:
        _, _, done = await collect(c.stream([QUESTION], model="m", tools=TOOLS))
    assert _paths(up) == [("/v1/chat/completions", 200), ("/v1/stream", 200)]
    assert done.text == uncut.text and done.finish_reason == "tool_calls"
    assert done.tool_calls == uncut.tool_calls
    assert all(json.loads(c.arguments) for c in done.tool_calls)


async def test_a_stream_the_server_no_longer_has_is_continued() -> None:
    """Re-attaching is refused (404: expired): the answer goes on by a continuation, exact
    (the server continues the same turn), and the missing session needs no stop."""
    async with Upstream(faults="reset@30,404", replay=True) as up, _client(up) as c:
        _, _, done = await collect(c.stream(Q, model="m"))
    assert done.text == up.answer(Q)
    assert _paths(up) == [
        ("/v1/chat/completions", 200),
        ("/v1/stream", 404),
        ("/v1/chat/completions", 200),
    ]
    assert up.requests[2].body["messages"][-1]["role"] == "assistant"  # a continuation
    assert up.stopped == []


async def test_a_busy_replay_is_stopped_and_the_answer_continued() -> None:
    """Re-attaching meets a 503: the generation is stopped (``DELETE``) and the answer goes on
    by a continuation."""
    async with Upstream(faults="reset@30,503", replay=True) as up, _client(up) as c:
        _, _, done = await collect(c.stream(Q, model="m"))
    assert done.text == up.answer(Q)
    conversation = up.requests[0].headers["x-conversation-id"]
    assert up.stopped == [conversation]
    assert [p for p, _ in _paths(up)] == [
        "/v1/chat/completions",
        "/v1/stream",
        "/v1/stream",  # the stop
        "/v1/chat/completions",
    ]


async def test_an_answer_abandoned_mid_stream_stops_its_generation() -> None:
    """The caller stops reading: a server that keeps streams would otherwise run the
    generation to its end for nobody; it is told to stop, once, before the stream closes."""
    async with Upstream(replay=True, token_delay=0.01) as up, _client(up) as c:
        async with c.stream(Q, model="m") as events:
            async for ev in events:
                if ev.type == "text":
                    break
        assert up.stopped == [up.requests[0].headers["x-conversation-id"]]


async def test_each_attempt_has_its_own_conversation() -> None:
    """A continuation (the replay refused) is a new generation: it carries a new id."""
    async with Upstream(faults="reset@30,404", replay=True) as up, _client(up) as c:
        await collect(c.stream(Q, model="m"))
    first, _, again = up.requests
    assert first.headers["x-conversation-id"] != again.headers["x-conversation-id"]


async def test_a_server_that_keeps_no_stream_is_continued() -> None:
    """Another server ignores the header: its break is continued, as always, and no re-attach
    is tried."""
    async with Upstream(faults="reset@30") as up, _client(up) as c:
        _, _, done = await collect(c.stream(Q, model="m"))
    assert done.text == up.answer(Q)
    assert [p for p, _ in _paths(up)] == ["/v1/chat/completions"] * 2


async def test_replay_off_sends_no_conversation_and_continues() -> None:
    """``replay=False`` on the route: no ``X-Conversation-Id``, and a break on llama.cpp's
    server is continued (its own prefill), never re-attached to."""
    async with Upstream(faults="reset@30", replay=True) as up, _client(up, replay=False) as c:
        _, _, done = await collect(c.stream(Q, model="m"))
    assert done.text == up.answer(Q)
    assert [p for p, _ in _paths(up)] == ["/v1/chat/completions"] * 2
    assert all("x-conversation-id" not in r.headers for r in up.requests)
