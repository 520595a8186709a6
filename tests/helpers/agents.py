"""The real clients against the proxy: every answer they were sent, recorded as it went over the
wire, read back (text and tool calls, in any of the three APIs, streamed or not) and replayed to
a fault-free proxy to be compared.

The recording wraps the proxy's ASGI app of one ``running`` proxy (``record``); the clients
(Claude Code's and Codex's native binaries, the AI SDK on Node) are the npm packages
``tests/node`` pins."""

from __future__ import annotations

import contextlib
import json
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamres.proxy.server.app import Proxy
from tests.helpers.node import NODE_MODULES, node_env

__all__ = ["Exchange", "answer_of", "claude_binary", "codex_binary", "record", "replayed"]


@dataclass
class Exchange:
    """One request to the proxy and the response it sent, as bytes."""

    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes
    status: int = 0
    response: bytes = b""


@contextlib.contextmanager
def record(proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Exchange]]:
    """Every request ``proxy`` serves while the block runs, and its response."""
    seen: list[Exchange] = []
    served = Proxy.__call__

    async def recording(self: Proxy, scope: Any, receive: Any, send: Any) -> None:
        if self is not proxy or scope["type"] != "http":
            await served(self, scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        ex = Exchange(scope["method"], scope["path"], scope.get("query_string", b""), headers, b"")
        seen.append(ex)

        async def heard() -> Any:
            message = await receive()
            ex.body += message.get("body", b"")
            return message

        async def said(message: Any) -> None:
            if message["type"] == "http.response.start":
                ex.status = message["status"]
            elif message["type"] == "http.response.body":
                ex.response += message.get("body", b"")
            await send(message)

        await served(self, scope, heard, said)

    monkeypatch.setattr(Proxy, "__call__", recording)
    yield seen


def answer_of(response: bytes) -> tuple[str, list[tuple[str, str]]]:
    """An answer's text and tool calls ``(name, arguments)`` — a namespace's function named
    ``namespace.name`` — from a response body in any of the three APIs, streamed or not."""
    text: list[str] = []
    calls: dict[Any, list[str]] = {}
    body = response.decode()
    if not body.lstrip().startswith("{"):
        for line in body.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                _event(json.loads(line[6:]), text, calls)
    else:
        whole = json.loads(body)
        for choice in whole.get("choices") or ():
            message = choice.get("message") or {}
            text.append(message.get("content") or "")
            for c in message.get("tool_calls") or ():
                calls[c["id"]] = [c["function"]["name"], c["function"]["arguments"]]
        for block in whole.get("content") or () if whole.get("type") == "message" else ():
            if block["type"] == "text":
                text.append(block["text"])
            elif block["type"] == "tool_use":
                calls[block["id"]] = [block["name"], json.dumps(block["input"])]
        for item in whole.get("output") or ():
            _item(item, text, calls)
    found = [(c[0], _canonical(c[1])) for c in calls.values()]
    return "".join(text), found


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except ValueError:
        return arguments


def _item(item: dict[str, Any], text: list[str], calls: dict[Any, list[str]]) -> None:
    if item.get("type") == "message":
        text += [p.get("text", "") for p in item.get("content") or ()]
    elif item.get("type") == "function_call":
        name = item["name"] if "namespace" not in item else f"{item['namespace']}.{item['name']}"
        calls[item["call_id"]] = [name, item.get("arguments", "")]


def _event(ev: dict[str, Any], text: list[str], calls: dict[Any, list[str]]) -> None:
    kind = ev.get("type")
    if "choices" in ev:
        for choice in ev["choices"]:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for c in delta.get("tool_calls") or ():
                entry = calls.setdefault(c.get("index"), ["", ""])
                fn = c.get("function") or {}
                entry[0] += fn.get("name") or ""
                entry[1] += fn.get("arguments") or ""
    elif kind == "content_block_start" and ev["content_block"]["type"] == "tool_use":
        calls[ev["index"]] = [ev["content_block"]["name"], ""]
    elif kind == "content_block_delta":
        delta = ev["delta"]
        if delta["type"] == "text_delta":
            text.append(delta["text"])
        elif delta["type"] == "input_json_delta":
            calls[ev["index"]][1] += delta["partial_json"]
    elif kind == "response.output_text.delta":
        text.append(ev["delta"])
    elif kind == "response.output_item.done" and ev["item"].get("type") == "function_call":
        _item(ev["item"], [], calls)


async def replayed(exchanges: list[Exchange], clean_url: str) -> list[tuple[Exchange, bytes]]:
    """Each answer request of ``exchanges`` (a 200), sent again to the fault-free proxy at
    ``clean_url``: the pairs of what the client got and what the clean proxy answers."""
    pairs = []
    keep = ("content-type", "anthropic-version", "anthropic-beta", "x-streamres-status")
    async with httpx.AsyncClient(base_url=clean_url, timeout=120) as http:
        for ex in exchanges:
            if ex.method != "POST" or ex.status != 200 or "count" in ex.path:
                continue
            if ex.path.endswith("input_tokens"):
                continue
            headers = {k: v for k, v in ex.headers.items() if k in keep}
            url = ex.path + (f"?{ex.query.decode()}" if ex.query else "")
            again = await http.post(url, content=ex.body, headers=headers)
            assert again.status_code == 200, again.text
            pairs.append((ex, again.content))
    return pairs


def _binary(*parts: str) -> Path:
    node_env()  # skips, saying why, without Node
    path = NODE_MODULES.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"{path.name} is not installed: npm ci --prefix tests/node (.ci/run does it)")
    return path


def claude_binary() -> Path:
    """Claude Code's native binary for this machine (``@anthropic-ai/claude-code``'s platform
    package)."""
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return _binary("@anthropic-ai", f"claude-code-linux-{arch}", "claude")


def codex_binary() -> Path:
    """Codex's native binary for this machine (``@openai/codex``'s platform package)."""
    arch = {"x86_64": ("x64", "x86_64"), "aarch64": ("arm64", "aarch64")}.get(
        platform.machine(), ("x64", "x86_64")
    )
    triple = f"{arch[1]}-unknown-linux-musl"
    return _binary("@openai", f"codex-linux-{arch[0]}", "vendor", triple, "bin", "codex")
