"""A continuation is the same answer, tool rounds included: an answer that breaks after the
conversation's tools ran comes back without a tool round it would not have had, and one that
breaks before its own calls keeps them once — whatever the strategy.

The conversation is a chat UI's (Open WebUI sends its 36 built-in tools with every request):
a question, the model's tool round, the tools' results, then the answer that breaks. The
embedded model reads a bare "continue" as a new turn and runs the last round again, as it was
seen to do behind a chat UI every time (``tools_on_continue="repeat"``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import streamres
from streamres.upstream import Upstream, split_tokens
from tests.helpers.chat_ui import AFTER_TOOLS, QUESTION, TOOLS
from tests.helpers.streams import collect

pytestmark = pytest.mark.anyio

STRATEGIES = ["instruct", "prefill"]


def _client(up: Upstream, provider: str, strategy: str) -> streamres.Client:
    url = up.anthropic_url if provider == "anthropic" else up.openai_url
    route = streamres.Route(
        "m", base_url=url, api_key="k", provider=provider, continuation=strategy
    )
    return streamres.Client([route])


async def _answer(
    faults: str, messages: list[dict[str, Any]], *, provider: str = "openai", strategy: str
) -> tuple[streamres.DoneEvent, Upstream]:
    async with Upstream(faults=faults, words=120) as up, _client(up, provider, strategy) as c:
        _, _, done = await collect(c.stream(messages, model="m", tools=TOOLS))
    return done, up


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fault", ["reset@30", "truncate@30"])
async def test_a_break_after_tool_results_adds_no_tool_round(
    fault: str, strategy: str, provider: str
) -> None:
    """The uncut answer to the tools' results is text only; broken mid-way and continued, it
    is the same text and still no call — the continuation's repeat of the round is not handed
    on, and the answer ends as a stop, not as a turn for tools."""
    uncut, _ = await _answer("ok", AFTER_TOOLS, provider=provider, strategy=strategy)
    assert uncut.tool_calls == () and uncut.finish_reason in ("stop", "end_turn")
    done, up = await _answer(fault, AFTER_TOOLS, provider=provider, strategy=strategy)
    assert len(up.requests) == 2  # it did break, and was continued
    assert done.text == uncut.text
    assert done.tool_calls == ()
    assert done.finish_reason == uncut.finish_reason


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_a_break_before_the_answers_own_calls_keeps_them_once(strategy: str) -> None:
    """An answer to a question is text and then calls; broken in its text, the continuation
    makes the uncut answer's calls — once, the same names and arguments."""
    uncut, _ = await _answer("ok", [QUESTION], strategy=strategy)
    assert uncut.finish_reason == "tool_calls" and uncut.tool_calls
    done, up = await _answer("reset@25", [QUESTION], strategy=strategy)
    assert len(up.requests) == 2
    assert done.text == uncut.text and done.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [
        (c.name, json.loads(c.arguments)) for c in uncut.tool_calls
    ]


async def test_a_continuation_that_only_runs_the_round_again_is_asked_without_tools() -> None:
    """The break comes after the last word: the continuation adds no text and only repeats the
    round. The round is dropped, and every later continuation (asked again, as one that ends
    at the seam is) is sent with the tools offered but ``tool_choice: "none"``: the answer
    ends whole, with no call."""
    async with Upstream() as probe:
        uncut = probe.answer(AFTER_TOOLS, words=120)
    at_end = len(split_tokens(uncut))
    done, up = await _answer(f"reset@{at_end}", AFTER_TOOLS, strategy="instruct")
    assert done.text == uncut and done.tool_calls == () and done.finish_reason == "stop"
    bodies = [r.body for r in up.requests]
    assert [b.get("tool_choice") for b in bodies] == [None, None, "none", "none"]
    assert all(len(b["tools"]) == len(TOOLS) for b in bodies)


async def test_a_partial_continuation_and_the_callers_own_instruction() -> None:
    """``continuation="partial"`` (Kimi, DashScope): the partial answer marked ``"partial":
    true``, continued exactly. ``continue_instruction``: a route's own words, and a call's
    over them, are what an instruct continuation asks with."""
    question = [QUESTION]
    async with Upstream(faults="reset@20") as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", continuation="partial")
        async with streamres.Client([route]) as client:
            _, _, done = await collect(client.stream(question, model="m"))
        assert done.text == up.answer(question) and done.join == "prefill"
        assert up.requests[1].body["messages"][-1]["partial"] is True
    for call, said in ((None, "Keep going."), ("续写。", "续写。")):
        async with Upstream(faults="reset@20", instruct="exact") as up:
            route = streamres.Route(
                "m",
                base_url=up.openai_url,
                api_key="k",
                continuation="instruct",
                continue_instruction="Keep going.",
            )
            async with streamres.Client([route]) as client:
                stream = client.stream(question, model="m", continue_instruction=call)
                _, _, done = await collect(stream)
            assert up.requests[1].body["messages"][-1] == {"role": "user", "content": said}


#: A coding agent's tools and its loop so far: the tests ran and failed, a file was edited.
AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace a file's text",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                "required": ["path", "text"],
            },
        },
    },
]
AGENT_LOOP: list[dict[str, Any]] = [
    {"role": "user", "content": "The tests fail. Fix them."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "2 failed, 40 passed"},
    {
        "role": "assistant",
        "content": "The parser drops the last line.",
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {
                    "name": "edit_file",
                    "arguments": '{"path": "parse.py", "text": "return lines"}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "ok"},
]


async def _agent_answer(
    faults: str, provider: str, tools_on_continue: Any = "plan"
) -> tuple[streamres.DoneEvent, Upstream]:
    async with (
        Upstream(
            faults=faults, words=60, after_tools="rerun", tools_on_continue=tools_on_continue
        ) as up,
        _client(up, provider, "instruct") as c,
    ):
        _, _, done = await collect(c.stream(AGENT_LOOP, model="m", tools=AGENT_TOOLS))
    return done, up


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("cut", ["text", "call"])
async def test_a_break_keeps_the_call_an_agent_makes_again_on_purpose(
    cut: str, provider: str
) -> None:
    """An agent's next answer after an edit runs the tests again — a call of an earlier round
    of the same turn. Cut mid-text or inside the call and continued as the model planned, the
    answer still ends with that call, for tools: the agent's loop goes on."""
    uncut, _ = await _agent_answer("ok", provider)
    assert [c.name for c in uncut.tool_calls] == ["run_tests"]
    assert uncut.finish_reason == "tool_calls"
    at = 15 if cut == "text" else len(split_tokens(uncut.text)) + 1
    done, up = await _agent_answer(f"reset@{at}", provider)
    assert len(up.requests) == 2  # it did break, and was continued
    assert done.text == uncut.text
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [("run_tests", {})]
    assert done.finish_reason == "tool_calls" and done.complete


async def test_a_round_repeated_by_a_continuation_is_dropped_and_said() -> None:
    """The continuation runs the last round (the edit) again instead: it is not handed on, and
    the answer says so — not complete, ``join="calls_dropped"`` — rather than passing for a
    whole answer."""
    done, up = await _agent_answer("reset@15", "openai", tools_on_continue="repeat")
    assert len(up.requests) >= 2
    assert all(c.name != "edit_file" for c in done.tool_calls)
    assert done.join == "calls_dropped" and not done.complete
