"""Token counts of a request before it is sent: Anthropic's ``POST /v1/messages/count_tokens``
and the Responses API's ``POST /v1/responses/input_tokens``. Pure.

A count is asked of the route's own API where it has one — a Messages request on an
Anthropic route, a Responses request on a Responses route (:func:`upstream_request`) — and
otherwise, or when that fails, made here with the route's token encoding and marked as an
estimate (:func:`prompt_pieces`: every text of the request, and the per-message overhead
OpenAI's counting guide gives).
"""

from __future__ import annotations

import json
from typing import Any

import streamres
from streamres.proxy.faces.inbound import Call

__all__ = ["MESSAGE_OVERHEAD", "count_body", "prompt_pieces", "upstream_request"]

#: Tokens each message costs beyond its text, and the reply's priming (OpenAI's guide).
MESSAGE_OVERHEAD = 3


def prompt_pieces(call: Call) -> list[str]:
    """Every text of the request as a model reads it: the messages' text, tool calls and
    results, and the tools' definitions."""
    pieces: list[str] = []
    for m in call.messages:
        content = m.get("content")
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    pieces.append(part["text"])
        for c in m.get("tool_calls") or ():
            fn = c.get("function") or {} if isinstance(c, dict) else {}
            pieces.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    tools = call.params.get("tools")
    if tools:
        pieces.append(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    return pieces


def count_body(call: Call, tokens: int) -> dict[str, Any]:
    """The count's response body in the request's own API."""
    if call.api == "responses":
        return {"object": "response.input_tokens", "input_tokens": tokens}
    return {"input_tokens": tokens}


def upstream_request(
    call: Call, raw: dict[str, Any], route: streamres.Route
) -> tuple[str, dict[str, str], dict[str, Any]] | None:
    """``(url, headers, body)`` of the count asked of ``route``'s own API, when it has one
    for this request's API; ``None`` otherwise (counted here)."""
    base = (route.base_url or "").rstrip("/")
    if call.previous is not None:  # the conversation is the proxy's: counted here
        return None
    body = {**raw, "model": route.model}
    if call.api == "anthropic" and route.provider == "anthropic" and base:
        url = base + (
            "/messages/count_tokens" if base.endswith("/v1") else "/v1/messages/count_tokens"
        )
        headers = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
        if route.api_key:
            headers["x-api-key"] = route.api_key
        return url, headers, body
    if call.api == "responses" and route.provider == "openai-responses" and base:
        headers = {"content-type": "application/json"}
        if route.api_key:
            headers["authorization"] = f"Bearer {route.api_key}"
        for name in ("stream", "background", "store", "previous_response_id"):
            body.pop(name, None)
        return base + "/responses/input_tokens", headers, body
    return None
