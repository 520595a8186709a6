"""Tools written once (OpenAI's function format), converted for every provider, so a Client whose
routes mix providers falls back mid-answer with tools, in both directions."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import streamres
from streamres import Client, Route
from streamres._providers.tools import (
    anthropic_messages,
    anthropic_tools,
    canonical_tool,
    openai_tools,
    responses_input,
    responses_tools,
)
from streamres.upstream import FaultPlan, ModelSpec, Upstream, split_tokens
from tests.helpers.streams import FAST, collect

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 °C, cloudy"},
    {"role": "user", "content": "Now write it down, and explain TCP slow start."},
]


def test_openai_tools_become_anthropic_tools() -> None:
    """function.parameters -> input_schema; tool_choice in Anthropic's words."""
    body = {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}}
    out = anthropic_tools(body)
    assert out["tools"] == [
        {
            "name": "get_weather",
            "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
            "description": "Weather in a city",
        }
    ]
    assert out["tool_choice"] == {"type": "tool", "name": "x"}
    assert anthropic_tools({"tool_choice": "required"})["tool_choice"] == {"type": "any"}
    assert anthropic_tools({"tool_choice": "auto"})["tool_choice"] == {"type": "auto"}


def test_openai_tools_become_flat_responses_tools() -> None:
    """The Responses API's function tools are flat."""
    out = responses_tools({"tools": [WEATHER], "tool_choice": "required"})
    assert out["tools"][0]["type"] == "function" and out["tools"][0]["name"] == "get_weather"
    assert "function" not in out["tools"][0] and out["tool_choice"] == "required"


def test_native_shapes_are_read_too() -> None:
    """Anthropic and Responses tools reach an OpenAI model in its shape; built-ins pass."""
    anth = {"name": "get_weather", "input_schema": {"type": "object"}}
    flat = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    assert canonical_tool(anth)["function"]["name"] == "get_weather"
    assert canonical_tool(flat)["function"]["parameters"] == {"type": "object"}
    search = {"type": "web_search_20250305", "name": "web_search"}
    assert anthropic_tools({"tools": [search]})["tools"] == [search]
    assert openai_tools({"tool_choice": {"type": "any"}})["tool_choice"] == "required"


def test_tool_turns_become_anthropic_blocks_and_responses_items() -> None:
    """tool_calls -> tool_use blocks / function_call items; tool results likewise."""
    msgs = anthropic_messages(HISTORY)
    assert msgs[1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
    ]
    assert msgs[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18 °C, cloudy"}],
    }
    items = responses_input(HISTORY)
    assert items[1] == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert items[2] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "18 °C, cloudy",
    }


def test_results_that_follow_each_other_share_one_user_turn() -> None:
    """Parallel results: one user turn of tool_result blocks (Anthropic wants alternation)."""
    two = [
        *HISTORY[:2],
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    msgs = anthropic_messages(two)
    assert len(msgs) == 3 and [b["tool_use_id"] for b in msgs[2]["content"]] == ["a", "b"]


async def test_the_embedded_upstream_refuses_the_wrong_shape_as_the_real_apis_do() -> None:
    """OpenAI-shaped tools or tool turns sent raw to /v1/messages: 400, as Anthropic answers."""
    async with Upstream() as up, httpx.AsyncClient() as http:
        body = {
            "model": "m",
            "max_tokens": 50,
            "stream": True,
            "tools": [WEATHER],
            "messages": HISTORY,
        }
        got = await http.post(f"{up.url}/v1/messages", json=body)
        assert got.status_code == 400 and "input_schema" in got.text
        raw = {"model": "m", "stream": True, "tools": [{"name": "x", "input_schema": {}}],
               "messages": HISTORY[:1]}  # fmt: skip
        got = await http.post(f"{up.url}/v1/chat/completions", json=raw)
        assert got.status_code == 400 and "function" in got.text


@pytest.mark.parametrize("provider", ["openai", "anthropic", "openai-responses"])
async def test_one_tools_argument_for_every_provider(provider: str) -> None:
    """The same OpenAI-shaped tools and tool history work on each provider's API."""
    async with Upstream() as up:
        url = up.anthropic_url if provider == "anthropic" else up.openai_url
        text, _events, done = await collect(
            streamres.stream_resilient(
                HISTORY,
                model="m",
                base_url=url,
                api_key="k",
                provider=provider,  # type: ignore[arg-type]
                tools=[WEATHER],
                tool_choice="auto",
                backoff=FAST,
            )
        )
        assert text == up.answer(HISTORY)
    assert [(c.name, sorted(json.loads(c.arguments))) for c in done.tool_calls] == [
        ("get_weather", ["city"])  # the tool's schema: {"city": string}
    ]


@pytest.mark.parametrize(("first", "second"), [("gpt", "claude"), ("claude", "gpt")])
async def test_a_mixed_provider_client_falls_back_mid_arguments_exactly(
    first: str, second: str
) -> None:
    """A fault in the middle of a tool call's arguments on one provider, the next model on the
    other provider: the answer's text is exact and the call arrives whole, in both directions."""
    async with Upstream() as probe:
        text_deltas = len(split_tokens(probe.answer(HISTORY)))
    cut = text_deltas + 2  # two pieces of the call's arguments have been sent
    models = {first: ModelSpec(faults=FaultPlan(f"reset@{cut},503*50"))}
    async with Upstream(models=models) as up:
        routes = [
            Route("gpt", base_url=up.openai_url, api_key="k"),
            Route("claude", provider="anthropic", base_url=up.anthropic_url, api_key="k"),
        ]
        async with Client(routes, backoff=FAST, fallback_after=1) as client:
            text, events, done = await collect(
                client.stream(HISTORY, model=[first, second], tools=[WEATHER])
            )
        assert text == up.answer(HISTORY)
        assert done.model == second
        assert [e.type for e in events].count("fallback") == 1
        (call,) = done.tool_calls
        assert call.name == "get_weather"
        assert call.id.startswith("toolu_" if second == "claude" else "call_")
        args = json.loads(call.arguments)
        assert list(args) == ["city"] and isinstance(args["city"], str) and args["city"]
