"""The OpenAI Responses API: same events, same resume, and re-attaching by replay."""

from __future__ import annotations

from typing import Any

import pytest

import streamres
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio


def stream(up: Upstream, **kw: Any) -> streamres.ResilientStream:
    args: dict[str, Any] = {
        "model": "m",
        "base_url": up.openai_url,
        "api_key": "k",
        "provider": "openai-responses",
        "backoff": FAST,
        "stall_timeout": 1.0,
    }
    args.update(kw)
    return streamres.stream_resilient(USER, **args)


async def test_clean_responses_stream(upstream: Upstream) -> None:
    """response.output_text.delta in, the exact answer out, usage from response.completed."""
    text, _, done = await collect(stream(upstream, max_tokens=4000))
    assert text == upstream.answer(USER)
    assert done.finish_reason == "stop"
    assert done.usage.output_tokens == upstream.requests[0].tokens
    req = upstream.requests[0]
    assert req.path == "/v1/responses"
    assert req.body["input"] == USER and req.body["max_output_tokens"] == 4000


async def test_response_failed_overloaded_is_resumed(upstream: Upstream) -> None:
    """response.failed with server_is_overloaded mid-text: a capacity error, resumed exactly."""
    upstream.faults.push("error@25")
    text, events, done = await collect(stream(upstream))
    assert text == upstream.answer(USER)
    assert done.history[0].outcome == "capacity"
    resume = next(e for e in events if e.type == "resume")
    assert resume.strategy == "instruct"
    assert upstream.requests[1].body["input"][-1]["content"] == streamres.CONTINUE_INSTRUCTION


@pytest.mark.parametrize("fault", ["reset@25", "stall@25", "truncate@25"])
async def test_background_response_is_re_attached_by_replay(upstream: Upstream, fault: str) -> None:
    """A background response cut mid-text is resumed by replay: nothing generated twice."""
    upstream.faults.push(fault)
    text, events, done = await collect(stream(upstream, background=True, store=True))
    assert text == upstream.answer(USER)
    _, second = upstream.requests
    assert second.path.startswith("/v1/responses/resp_")
    assert int(second.body["starting_after"]) > 0
    resume = next(e for e in events if e.type == "resume")
    assert resume.strategy == "replay"
    assert done.deduplicated_chars == 0 and done.usage.wasted_tokens == 0


async def test_replay_unavailable_falls_back_to_continuation(upstream: Upstream) -> None:
    """If the server cannot replay (404), the answer continues by a continuation request."""
    upstream.faults.push("reset@25,404")
    text, _, done = await collect(stream(upstream, background=True, store=True))
    assert text == upstream.answer(USER)
    assert [r.status for r in upstream.requests] == [200, 404, 200]
    assert upstream.requests[2].path == "/v1/responses"
    assert done.resumes == 2


async def test_selected_model_at_capacity_switches_model() -> None:
    """The Codex backend's 'Selected model is at capacity' moves to the next model at once."""
    models = {"big": ModelSpec(faults=FaultPlan("at-capacity*10"))}
    async with Upstream(models=models) as up:
        text, events, done = await collect(stream(up, model=["big", "small"]))
        assert text == up.answer(USER)
        assert done.model == "small"
        assert [e.type for e in events if e.type not in ("text", "done")] == ["fallback"]


RESPONSES_TOOLS = [
    {"type": "function", "name": n, "parameters": {"type": "object"}}
    for n in ("write_file", "notify")
]


@pytest.mark.parametrize("n_tools", [1, 2])
async def test_function_calls_cut_mid_arguments(upstream: Upstream, n_tools: int) -> None:
    """A Responses stream cut inside a function call's arguments: whole calls, once each."""
    from streamres.upstream import split_tokens

    upstream.faults.push(f"reset@{len(split_tokens(upstream.answer(USER))) + 4}")
    text, events, done = await collect(stream(upstream, tools=RESPONSES_TOOLS[:n_tools]))
    calls = [e for e in events if e.type == "tool_call"]
    assert [c.name for c in calls] == ["write_file", "notify"][:n_tools]
    assert all(c.id.startswith("call_") for c in calls)
    assert text == upstream.answer(USER)
    assert done.finish_reason == "tool_calls"
    assert len(done.tool_calls) == n_tools
