"""Held answers read as a client reads them: SSE events, their text, resumes — against one proxy
or several sharing Redis."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import Upstream
from tests.helpers.redis import free_port

Q = [{"role": "user", "content": "Explain TCP slow start in a few sentences."}]

#: A Responses API function tool (the embedded upstream calls it when a question asks to).
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


def sse_block(block: str) -> dict[str, Any] | None:
    """One SSE event as ``{"id", "event", "data"}`` (``None``: a comment, or no id)."""
    ev: dict[str, Any] = {"id": None, "event": None, "data": ""}
    for line in block.split("\n"):
        name, _, value = line.partition(": ")
        if name in ("id", "event", "data"):
            ev[name] = value
    return ev if ev["id"] is not None else None


async def sse_events(r: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The SSE events of a response, as ``{"id", "event", "data"}`` (comments dropped)."""
    buf = ""
    async for chunk in r.aiter_text():
        buf += chunk
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            if (ev := sse_block(block)) is not None:
                yield ev


async def proxy_process(config: Path, redis: str) -> tuple[Any, str]:
    """``streamres proxy`` in a child process with ``config`` and shared state on ``redis``,
    once it serves: the process and its URL."""
    port = free_port()
    command = [sys.executable, "-m", "streamres", "proxy", "--port", str(port)]
    command += ["--config", str(config), "--redis", redis]
    process = await anyio.open_process(command)
    assert process.stdout is not None
    with anyio.fail_after(60):
        seen = b""
        async for data in process.stdout:
            seen += data
            if b"streamres proxy on" in seen:
                break
    return process, f"http://127.0.0.1:{port}"


def text_of(ev: dict[str, Any]) -> str:
    """The answer's text an event carries, in any of the three APIs."""
    if ev["data"] == "[DONE]":
        return ""
    data = json.loads(ev["data"])
    if "choices" in data:
        return "".join(c["delta"].get("content") or "" for c in data["choices"])
    if data.get("type") == "content_block_delta":
        return str(data["delta"].get("text", ""))
    if data.get("type") == "response.output_text.delta":
        return str(data["delta"])
    return ""


BODIES = {
    "openai": ("/v1/chat/completions", {"model": "demo", "messages": Q, "stream": True}),
    "anthropic": (
        "/v1/messages",
        {"model": "demo", "messages": Q, "stream": True, "max_tokens": 1024},
    ),
    "responses": ("/v1/responses", {"model": "demo", "input": Q[0]["content"], "stream": True}),
}


async def start_answer(
    http: httpx.AsyncClient,
    url: str,
    api: str,
    upto: int,
    body: dict[str, Any] | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Start an answer (``body``: instead of the API's usual one) and read its first ``upto``
    events, then go (the connection closed)."""
    path, usual = BODIES[api]
    got: list[dict[str, Any]] = []
    async with http.stream("POST", url + path, json=body or usual) as r:
        assert r.status_code == 200, await r.aread()
        answer = r.headers["x-streamres-answer"]
        async for ev in sse_events(r):
            got.append(ev)
            if len(got) == upto:
                break
    return answer, got


def assert_exact(every: list[dict[str, Any]], expected: str) -> None:
    """The events read, across reconnects, are numbered on (none twice, none missing) and
    their text is ``expected``."""
    assert [int(e["id"]) for e in every] == list(range(len(every)))
    assert "".join(text_of(e) for e in every) == expected


async def read_on(
    http: httpx.AsyncClient, url: str, answer: str, last: str | None, **headers: str
) -> list[dict[str, Any]]:
    h = dict(headers)
    if last is not None:
        h["last-event-id"] = last
    async with http.stream("GET", f"{url}/v1/answers/{answer}/events", headers=h) as r:
        assert r.status_code == 200, await r.aread()
        return [ev async for ev in sse_events(r)]


@contextlib.asynccontextmanager
async def two_proxies(
    up: Upstream, redis: str
) -> AsyncIterator[tuple[Any, Any, httpx.AsyncClient]]:
    """Two proxies in front of ``up`` sharing ``redis`` (as two processes would), and a
    client."""
    config = shared_config(up)
    async with (
        running(config, port=0, redis=redis) as a,
        running(config, port=0, redis=redis) as b,
        httpx.AsyncClient(timeout=30) as http,
    ):
        yield a, b, http


def shared_config(up: Upstream, hold: float = 30.0) -> Any:
    raw = {
        "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
        "answers": {"hold": hold},
    }
    return parse(raw, {})


def asked(up: Upstream, question: str) -> int:
    """Requests the upstream received for ``question``."""
    return sum(question in json.dumps(r.body, ensure_ascii=False) for r in up.requests)


async def begin(
    http: httpx.AsyncClient, url: str, question: str, upto: int
) -> tuple[str, list[dict[str, Any]]]:
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "stream": True}
    return await start_answer(http, url, "openai", upto, body)
