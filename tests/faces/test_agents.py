"""Coding agents' requests through the proxy, on a route of each API: what Claude Code and Codex
send at their defaults (recorded from Claude Code 2.1.197 and Codex 0.171.0, shortened) is
served, every field translated, left out and said, or refused before any request — never
passed as given to an API that does not define it; token counts answered; errors worded as the
client's API words them.

The real clients run against the proxy in ``test_agent_clients.py``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import Upstream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the proxy serves on asyncio (uvicorn)


#: Claude Code's first request at its defaults (``claude -p``), shortened: a mid-conversation
#: system message (its agent types), adaptive thinking with an effort, context management.
CLAUDE_CODE: dict[str, Any] = {
    "model": "claude-opus-4-8",
    "max_tokens": 64000,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are a Claude agent."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say hi in two sentences."}]},
        {"role": "system", "content": "Available agent types for the Agent tool: claude."},
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ],
    "tool_choice": {"type": "none"},
    "metadata": {"user_id": '{"device_id":"d1","session_id":"s1"}'},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}

#: Codex's first request at its defaults (``wire_api = "responses"``), shortened.
CODEX: dict[str, Any] = {
    "model": "agent",
    "stream": True,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
        },
    ],
    "tools": [
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Agents that work beside you",
            "tools": [
                {
                    "type": "function",
                    "name": "spawn_agent",
                    "description": "Start an agent",
                    "strict": False,
                    "parameters": {
                        "type": "object",
                        "properties": {"message": {"type": "string"}},
                        "required": ["message"],
                        "additionalProperties": False,
                    },
                }
            ],
        },
        {
            "type": "function",
            "name": "exec_command",
            "description": "Run a command",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
                "additionalProperties": False,
            },
        },
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0a1b",
    "client_metadata": {"x-codex-installation-id": "i1"},
}


def _config(up: Upstream, **more: Any) -> Any:
    raw = {
        "routes": [
            {"name": "chat", "model": "up-chat", "base_url": up.openai_url, "thinks": True},
            {"name": "plain", "model": "up-plain", "base_url": up.openai_url},
            {
                "name": "claude",
                "model": "up-claude",
                "provider": "anthropic",
                "base_url": up.anthropic_url,
                "api_key_env": "UP_KEY",
            },
            {
                "name": "resp",
                "model": "up-resp",
                "provider": "openai-responses",
                "base_url": up.openai_url,
                "api_key_env": "UP_KEY",
            },
        ],
        "models": {"claude-opus-4-8": ["chat"], "agent": ["chat"]},
        **more,
    }
    return parse(raw, {"UP_KEY": "k"})


def _text(body: bytes) -> str:
    """The text of an SSE answer in any of the three APIs."""
    out = []
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        delta = ev.get("delta")
        if isinstance(delta, dict) and delta.get("type") == "text_delta":
            out.append(delta["text"])
        elif ev.get("type") == "response.output_text.delta":
            out.append(ev["delta"])
        elif ev.get("choices"):
            out.append(ev["choices"][0]["delta"].get("content") or "")
    return "".join(out)


@pytest.mark.parametrize("route", ["chat", "plain", "claude", "resp"])
async def test_claude_codes_first_request_is_served_on_every_route(route: str) -> None:
    """Its mid-conversation system message stays in place on a Chat or Responses route and is
    gathered into ``system`` on an Anthropic one; its effort becomes a reasoning model's
    ``reasoning_effort`` (left out, and said, for one that does not reason); context
    management, metadata and Anthropic's own web search are left out of another API's
    request, and the log says so."""
    async with Upstream() as up, running(_config(up), port=0) as run:
        body = {**CLAUDE_CODE, "model": route}
        with capture_logs() as logs:
            async with httpx.AsyncClient(base_url=run.url, timeout=30) as http:
                r = await http.post("/v1/messages?beta=true", json=body)
        assert r.status_code == 200, r.text
        assert _text(r.content)
        sent = up.requests[-1].body
    agent_types = "Available agent types for the Agent tool: claude."
    if route == "claude":  # its own API: everything as given, the system message gathered
        assert agent_types in sent["system"]
        assert [m["role"] for m in sent["messages"]] == ["user"]
        for name in ("thinking", "context_management", "output_config", "metadata"):
            assert sent[name] == CLAUDE_CODE[name]
        assert [t.get("type") for t in sent["tools"]] == [None, "web_search_20250305"]
        return
    turns = sent["input"] if route == "resp" else sent["messages"]
    assert [m["role"] for m in turns] == ["system", "user", "system"]
    assert agent_types in json.dumps(turns[2])
    for name in ("thinking", "context_management", "output_config", "metadata", "system"):
        assert name not in sent
    names = [t.get("name") or t["function"]["name"] for t in sent["tools"]]
    assert names == ["Bash"]
    if route == "chat":
        assert sent["reasoning_effort"] == "high"
    elif route == "resp":
        assert "reasoning" not in sent  # its name says it does not reason: left out
    else:
        assert "reasoning_effort" not in sent
    said = [e for e in logs if e["event"] == "streamres.proxy_left_out"]
    assert len(said) == 1
    left = said[0]["left"]
    assert f"{route}: context_management" in left and f"{route}: metadata" in left
    assert f"{route}: tools: web_search_20250305 web_search" in left


async def test_a_role_the_api_does_not_take_is_refused_in_anthropics_words() -> None:
    """A role neither user, assistant nor system: a 400 in Anthropic's shape whose message
    says "Unexpected role", as Anthropic's does (Claude Code's fallback reads those words)."""
    async with Upstream() as up, running(_config(up), port=0) as run:
        body = {**CLAUDE_CODE, "messages": [{"role": "tool", "content": "x"}]}
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as http:
            r = await http.post("/v1/messages", json=body)
        assert up.requests == []
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert 'Unexpected role "tool"' in error["error"]["message"]


@pytest.mark.parametrize("route", ["chat", "claude", "resp"])
async def test_codexs_default_tools_are_served_and_its_namespace_calls_come_back_in_it(
    route: str,
) -> None:
    """Codex's namespace tool reaches every route as functions named ``<namespace>__<name>``;
    the model's call of one comes back as a ``function_call`` in its namespace, and is sent on
    flattened again when the conversation continues. Web search goes only to a Responses
    route; ``include`` and ``client_metadata`` only to one too."""
    async with (
        Upstream() as up,
        running(_config(up), port=0) as run,
        httpx.AsyncClient(base_url=run.url, timeout=30) as http,
    ):
        r = await http.post("/v1/responses", json={**CODEX, "model": route, "stream": False})
        assert r.status_code == 200, r.text
        sent = up.requests[-1].body
        calls = [i for i in r.json()["output"] if i["type"] == "function_call"]
        assert calls and calls[0]["namespace"] == "multi_agent_v1"
        assert calls[0]["name"] == "spawn_agent"
        # the agent runs it and sends the conversation back whole (store: false)
        more = [*CODEX["input"], calls[0]]
        more.append(
            {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "ok"}
        )
        r = await http.post("/v1/responses", json={**CODEX, "model": route, "input": more})
        assert r.status_code == 200, r.text
        again = up.requests[-1].body
    tools = sent["tools"]
    flat = [t.get("name") or t.get("function", {}).get("name") for t in tools]
    assert "multi_agent_v1__spawn_agent" in flat and "exec_command" in flat
    assert all(t.get("type") != "namespace" for t in tools)
    assert any(t.get("type") == "web_search" for t in tools) == (route == "resp")
    for name in ("include", "client_metadata"):
        assert (name in sent) == (route == "resp")
    assert json.dumps(again).count("multi_agent_v1__spawn_agent") >= 2  # offered and called


async def test_hosted_tools_refused_when_the_operator_says_so() -> None:
    """``[tools] hosted = "refuse"``: a hosted tool a route of the chain cannot run is a 400
    naming the tool and the route, before any request."""
    async with Upstream() as up:
        config = _config(up, tools={"hosted": "refuse"})
        async with running(config, port=0) as run, httpx.AsyncClient(base_url=run.url) as http:
            r = await http.post("/v1/responses", json={**CODEX, "model": "chat"})
        assert up.requests == []
    assert r.status_code == 400
    assert "web_search" in r.json()["error"]["message"]
    assert "'chat'" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "route", "how"),
    [
        ("/v1/messages/count_tokens", CLAUDE_CODE, "claude", "upstream"),
        ("/v1/messages/count_tokens", CLAUDE_CODE, "chat", "estimate"),
        ("/v1/responses/input_tokens", CODEX, "resp", "upstream"),
        ("/v1/responses/input_tokens", CODEX, "chat", "estimate"),
    ],
)
async def test_token_counts_by_the_routes_api_or_estimated(
    path: str, body: dict[str, Any], route: str, how: str
) -> None:
    """The count is the route's own where its API has one (the request goes there, with the
    route's model), else counted here and marked an estimate; either way in the client's
    API's shape, and no answer is asked for."""
    async with Upstream() as up, running(_config(up), port=0) as run:
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as http:
            r = await http.post(path, json={**body, "model": route})
        asked = [q.path for q in up.requests]
    assert r.status_code == 200, r.text
    assert r.headers["x-streamres-count"] == how
    count = r.json()
    assert count["input_tokens"] > 20
    if path.endswith("input_tokens"):
        assert count["object"] == "response.input_tokens"
    assert asked == ([path] if how == "upstream" else [])


async def test_head_of_the_board_is_answered() -> None:
    """``HEAD /`` (Claude Code sends one as it starts) is a 200 with no body."""
    async with (
        Upstream() as up,
        running(_config(up), port=0) as run,
        httpx.AsyncClient(base_url=run.url) as http,
    ):
        r = await http.head("/")
    assert r.status_code == 200 and r.content == b""


async def test_a_whole_answer_says_what_the_proxy_added() -> None:
    """``x-streamres-overhead-ms`` on an answer that is not streamed: the proxy's own time,
    without the upstream's — here at least 0.4 s of 20 tokens paced 20 ms apart."""
    async with (
        Upstream(token_delay=0.02, words=20) as up,
        running(_config(up), port=0) as run,
        httpx.AsyncClient(base_url=run.url, timeout=30) as http,
    ):
        body = {"model": "plain", "messages": [{"role": "user", "content": "Hi."}]}
        began = anyio.current_time()
        r = await http.post("/v1/chat/completions", json=body)
        wall_ms = (anyio.current_time() - began) * 1000
    assert r.status_code == 200
    added = float(r.headers["x-streamres-overhead-ms"])
    assert wall_ms >= 400 and 0 <= added < wall_ms - 300


async def test_message_start_carries_the_input_tokens() -> None:
    """Anthropic's ``message_start`` names the input tokens from the start (an estimate, a
    token to four bytes of the request), and the end's ``message_delta`` the server's count."""
    async with (
        Upstream() as up,
        running(_config(up), port=0) as run,
        httpx.AsyncClient(base_url=run.url, timeout=30) as http,
    ):
        body = json.dumps({**CLAUDE_CODE, "model": "chat"}).encode()
        headers = {"content-type": "application/json"}
        r = await http.post("/v1/messages?beta=true", content=body, headers=headers)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    start = next(e for e in events if e["type"] == "message_start")
    end = next(e for e in events if e["type"] == "message_delta")
    assert start["message"]["usage"]["input_tokens"] == (len(body) + 3) // 4
    assert end["usage"]["input_tokens"] > 0


async def test_every_answer_says_what_the_proxy_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed answer and a whole one, each 20 tokens paced 20 ms apart: each says what
    the proxy added (its own time, not the upstream's) in its log line, on its span and in
    ``/metrics``, beside the answers held and what they weigh."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    body = {"model": "plain", "messages": [{"role": "user", "content": "Hi."}]}
    with capture_logs() as logs:
        async with (
            Upstream(token_delay=0.02, words=20) as up,
            running(_config(up), port=0) as run,
            httpx.AsyncClient(base_url=run.url, timeout=30) as http,
        ):
            for stream in (True, False):
                r = await http.post("/v1/chat/completions", json={**body, "stream": stream})
                assert r.status_code == 200
            await run.proxy.answers.settled()
            metrics = (await http.get("/metrics")).text
    provider.shutdown()
    said = [e for e in logs if e["event"] == "streamres.proxy_answered"]
    assert [e["model"] for e in said] == ["plain", "plain"]
    assert all(0 <= e["added_ms"] < 300 for e in said)  # the answers took 400 ms upstream
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    added = sorted(round((s.attributes or {})["streamres.proxy.added_ms"], 3) for s in spans)
    assert added == sorted(e["added_ms"] for e in said)
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("streamres_proxy_")
    }
    assert values["streamres_proxy_added_seconds_count"] == 2
    assert values["streamres_proxy_added_seconds_sum"] == pytest.approx(
        sum(e["added_ms"] for e in said) / 1000, rel=0.01, abs=1e-5
    )
    assert values["streamres_proxy_answers_held"] == 1  # the streamed one, kept for readers
    assert values["streamres_proxy_answers_held_bytes"] == run.proxy.answers.held_bytes > 6_000
