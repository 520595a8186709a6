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
