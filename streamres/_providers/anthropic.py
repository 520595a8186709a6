"""Anthropic Messages streaming.

Requests are shaped as the official SDK shapes them: ``x-api-key`` and ``anthropic-version``
headers, ``system`` messages moved to the top-level ``system`` field, and ``max_tokens``
(required by the API) defaulting to :data:`DEFAULT_MAX_TOKENS`. Streams end with
``message_stop``; ``event: error`` (``overloaded_error``…) can arrive after the 200.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from streamres._core.classify import classify_error_object
from streamres._providers.params import for_provider
from streamres._providers.tools import anthropic_messages, anthropic_tools
from streamres._providers.wire import (
    HttpRequest,
    PartialCall,
    StreamDecoder,
    count,
    normalise_finish,
    text_or_none,
)

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicDecoder", "build_request"]

ANTHROPIC_VERSION = "2023-06-01"
#: Used when the caller gives no ``max_tokens``: the API requires one.
DEFAULT_MAX_TOKENS = 4096


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def build_request(
    *,
    base_url: str,
    api_key: str | None,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int | None,
    extra_body: dict[str, Any],
    extra_headers: dict[str, str],
) -> HttpRequest:
    """The POST the official SDK would send for ``messages.stream(...)``."""
    headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "anthropic-version": ANTHROPIC_VERSION,
    }
    if api_key:
        headers["x-api-key"] = api_key
    headers.update(extra_headers)
    system = [_text_of(m["content"]) for m in messages if m["role"] in ("system", "developer")]
    turns = anthropic_messages([m for m in messages if m["role"] not in ("system", "developer")])
    body: dict[str, Any] = {
        "model": model,
        "messages": turns,
        "max_tokens": max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    if system:
        body["system"] = "\n\n".join(system)
    extra_body = for_provider("anthropic", extra_body)
    body.update(extra_body)
    body.update(anthropic_tools(extra_body))  # tools written once, in OpenAI's shape
    if body.pop("parallel_tool_calls", None) is False:  # OpenAI's way of saying one call
        choice = body.get("tool_choice")
        body["tool_choice"] = {
            **(choice if isinstance(choice, dict) else {"type": "auto"}),
            "disable_parallel_tool_use": True,
        }
    base = base_url.rstrip("/")
    url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")
    return HttpRequest(url=url, headers=headers, body=body)


# The text delta exactly as the API writes it. Matching it and reading the one string with
# json's own scanner is ~2.5x cheaper than json.loads on the hot path; anything else (other
# spacing, other fields) falls through to json.loads.
_TEXT_DELTA = re.compile(
    r'\{"type":"content_block_delta","index":\d+,"delta":\{"type":"text_delta","text":"'
)


class AnthropicDecoder(StreamDecoder):
    """Messages stream events -> text; see :class:`~streamres._providers.wire.StreamDecoder`."""

    __slots__ = ("_thinking",)

    def __init__(self) -> None:
        super().__init__()
        #: Thinking blocks still streaming, by index (complete ones go to signed_thinking).
        self._thinking: dict[int, dict[str, Any]] = {}

    def feed(self, name: str, data: bytes) -> str:
        if name == "ping":
            return ""
        try:
            text = data.decode()
            fast = _TEXT_DELTA.match(text)
            if fast is not None:
                value, end = scanstring(text, fast.end())
                if text[end:] == "}}":
                    return str(value)
            event = json.loads(text)
        except (ValueError, RecursionError):  # UnicodeDecodeError, scanner errors, deep nesting
            return self._malformed(data)
        if type(event) is not dict:
            return self._malformed(data)
        kind = name or text_or_none(event.get("type")) or ""
        index = event.get("index", 0)
        if type(index) is not int:
            raise TypeError("a content block's index must be an integer")
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                return text_or_none(delta.get("text")) or ""
            self.generating = True
            if dtype == "input_json_delta" and index in self.calls:
                self.calls[index].add(text_or_none(delta.get("partial_json")) or "")
            elif dtype == "thinking_delta" and index in self._thinking:
                text = text_or_none(delta.get("thinking")) or ""
                self._thinking[index]["thinking"] += text
                self.side.append(("thinking", text))
            elif dtype == "signature_delta" and index in self._thinking:
                self._thinking[index]["signature"] += text_or_none(delta.get("signature")) or ""
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            btype = block.get("type")
            if btype == "tool_use":
                call = PartialCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    requires_close=True,
                )
                if block.get("input"):
                    call.add(json.dumps(block["input"]))
                self.calls[index] = call
            elif btype == "thinking":
                self._thinking[index] = {
                    "type": "thinking",
                    "thinking": str(block.get("thinking", "")),
                    "signature": str(block.get("signature", "")),
                }
            elif btype == "redacted_thinking":
                self.signed_thinking.append(dict(block))
        elif kind == "content_block_stop":
            if index in self.calls:
                call = self.calls[index]
                call.closed = True
                if not call.arguments:
                    call.add("{}")  # a tool without parameters, closed whole
            block = self._thinking.pop(index, None)
            if block is not None and block["signature"]:
                self.signed_thinking.append(block)
        elif kind == "message_start":
            message = event.get("message") or {}
            self.response_id = text_or_none(message.get("id")) or self.response_id
            usage = message.get("usage") or {}
            if message.get("stop_reason"):
                self.finish_reason = normalise_finish(message["stop_reason"])
            text = self._prepopulated(message.get("content") or [])
            if self.finish_reason is not None:
                self._finish_calls()
            self.input_tokens = count(usage.get("input_tokens"), self.input_tokens)
            self.output_tokens = count(usage.get("output_tokens"), self.output_tokens)
            return text
        elif kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish_reason = normalise_finish(reason)
                self._finish_calls()
            usage = event.get("usage") or {}
            # Server tools report the cumulative input count here; the official SDK takes it.
            self.input_tokens = count(usage.get("input_tokens"), self.input_tokens)
            self.output_tokens = count(usage.get("output_tokens"), self.output_tokens)
        elif kind == "message_stop":
            self.terminal = True
        elif kind == "error":
            self.error = classify_error_object(event.get("error") or {})
        return ""

    def _prepopulated(self, content: list[Any]) -> str:
        """Blocks a ``message_start`` already carries whole (programmatic tool calling resumes
        a turn this way): text is answer text, ``tool_use`` blocks are whole calls."""
        text = []
        for i, block in enumerate(content):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text.append(text_or_none(block.get("text")) or "")
            elif block.get("type") == "tool_use":
                self.calls[i] = PartialCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=[json.dumps(block.get("input") or {})],
                    requires_close=True,
                    closed=True,
                )
        return "".join(text)
