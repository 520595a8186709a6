"""Tool calls and thinking blocks, resumed safely (loopback, both providers, asyncio and trio)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import streamres
from streamres.upstream import Upstream, split_tokens
from tests.helpers.streams import FAST, USER, collect, url_for

pytestmark = pytest.mark.anyio

FILE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": FILE}}
    for n in ("write_file", "notify")
]
ANTHROPIC_TOOLS = [{"name": n, "input_schema": FILE} for n in ("write_file", "notify")]


def tools(provider: str, n: int = 1) -> list[dict[str, Any]]:
    return (OPENAI_TOOLS if provider == "openai" else ANTHROPIC_TOOLS)[:n]


def stream(up: Upstream, provider: str, **kw: Any) -> streamres.ResilientStream:
    args: dict[str, Any] = {
        "model": "m",
        "base_url": url_for(up, provider),
        "api_key": "k",
        "provider": provider,
        "backoff": FAST,
        "stall_timeout": 2.0,
    }
    args.update(kw)
    return streamres.stream_resilient(USER, **args)


def text_deltas(up: Upstream) -> int:
    return len(split_tokens(up.answer(USER)))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("into_args", [0, 3])
async def test_fault_inside_tool_arguments(provider: str, into_args: int) -> None:
    """A break inside (or right after the name of) a call yields one whole call, never a part."""
    async with Upstream() as up:
        up.faults.push(f"reset@{text_deltas(up) + into_args}")
        text, events, done = await collect(stream(up, provider, tools=tools(provider)))
        calls = [e for e in events if e.type == "tool_call"]
        assert len(calls) == 1
        assert calls[0].name == "write_file"
        kinds = [e.type for e in events]
        assert kinds.index("tool_call") > max(i for i, k in enumerate(kinds) if k == "text")
        assert sorted(json.loads(calls[0].arguments)) == ["content", "path"]
        assert text == up.answer(USER)
        assert done.tool_calls == (
            streamres.ToolCall(calls[0].id, calls[0].name, calls[0].arguments),
        )
        assert done.finish_reason == "tool_calls"
        assert done.resumes == 1
        first_request_tools = up.requests[0].body["tools"]
        assert first_request_tools == tools(provider)  # passed through in the provider's format


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_parallel_calls_are_all_or_nothing(provider: str) -> None:
    """Two calls in one turn, a break inside the second: both arrive once, after recovery."""
    async with Upstream() as up:
        up.faults.push(f"reset@{text_deltas(up) + 14}")
        _, events, done = await collect(stream(up, provider, tools=tools(provider, 2)))
        kinds = [e.type for e in events if e.type != "text"]
        assert kinds.index("resume") < kinds.index("tool_call")
        calls = [e for e in events if e.type == "tool_call"]
        assert [c.name for c in calls] == ["write_file", "notify"]
        assert all(json.loads(c.arguments) for c in calls)
        assert len(done.tool_calls) == 2


async def test_tool_call_without_arguments_is_never_reported() -> None:
    """A stream that ends cleanly after a call's name (no arguments) is not a call with {}."""
    async with Upstream() as up:
        up.faults.push(f"truncate@{text_deltas(up)}")
        _, events, done = await collect(stream(up, "openai", tools=tools("openai")))
        calls = [e for e in events if e.type == "tool_call"]
        assert len(calls) == 1 and json.loads(calls[0].arguments) != {}
        assert done.history[0].outcome == "truncated"


THINKING = {"thinking": {"type": "enabled", "budget_tokens": 1024}}


@pytest.mark.parametrize("cut", [5, 40])
async def test_anthropic_thinking_resumes_without_a_400(cut: int) -> None:
    """Cut inside the thinking block (5) or mid-text (40): no 400 from an upstream that checks
    signatures and refuses prefill with thinking on; the answer is exact."""
    async with Upstream() as up:
        thinking_deltas = 30
        up.faults.push(f"reset@{cut if cut < thinking_deltas else thinking_deltas + cut}")
        text, events, done = await collect(stream(up, "anthropic", **THINKING))
        assert text == up.answer(USER)
        assert all(r.status == 200 for r in up.requests), [r.status for r in up.requests]
        assert any(e.type == "thinking" for e in events)
        assert done.thinking and "The user wants an answer" in done.thinking
        assert text not in done.thinking and done.thinking not in text
        last = up.requests[-1].body["messages"]
        if cut > thinking_deltas:  # text was shown: the signed block went back, byte for byte
            assistant = last[-2]["content"]
            assert assistant[0]["type"] == "thinking" and assistant[0]["signature"]
            assert assistant[-1] == {"type": "text", "text": text[: len(assistant[-1]["text"])]}
            assert last[-1]["content"] == streamres.CONTINUE_INSTRUCTION


async def test_reasoning_content_is_streamed_apart_and_never_sent_back() -> None:
    """OpenAI-compatible reasoning (DeepSeek's reasoning_content): thinking events; on resume
    the reasoning is not sent back (the server would answer 400)."""
    async with Upstream() as up:
        up.faults.push("reset@60")
        text, events, done = await collect(stream(up, "openai", reasoning_effort="low"))
        assert text == up.answer(USER)
        assert [e for e in events if e.type == "thinking"]
        assert all(r.status == 200 for r in up.requests)
        assert done.thinking


async def test_long_thinking_is_not_a_stall() -> None:
    """Reasoning that streams longer than stall_timeout keeps the stream alive: it is output."""
    async with Upstream(token_delay=0.02, words=10) as up:  # ~30 thinking deltas: 0.6 s first
        text, _, done = await collect(stream(up, "anthropic", stall_timeout=0.3, **THINKING))
        assert text == up.answer(USER)
        assert done.attempts == 1
