"""OpenAI Responses API streaming (``provider="openai-responses"``, ``POST /v1/responses``).

Events: ``response.created``, ``response.output_text.delta``, ``response.completed`` /
``response.incomplete``, and failures as ``response.failed`` (``server_is_overloaded``,
"Selected model is at capacity…") or an ``error`` event. Every event carries a
``sequence_number``. A response created with ``background: true`` (and ``store: true``) keeps
generating on the server when the connection drops; it is resumed by re-attaching with
``GET /v1/responses/{id}?stream=true&starting_after=<sequence_number>``: the server replays
what was missed, exactly, and nothing is generated twice.
"""

from __future__ import annotations

import json
from typing import Any

from streamres._core.classify import classify_error_object
from streamres._providers.openai import headers
from streamres._providers.params import for_provider
from streamres._providers.tools import responses_input, responses_tools
from streamres._providers.wire import HttpRequest, PartialCall, StreamDecoder, count, text_or_none

__all__ = ["ResponsesDecoder", "build_request", "custom_tool_names", "replay_request"]


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
    """``POST /responses`` with the conversation as input messages."""
    body: dict[str, Any] = {"model": model, "input": responses_input(messages), "stream": True}
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    extra_body = for_provider("openai-responses", extra_body)
    body.update(extra_body)
    body.update(responses_tools(extra_body))  # function tools are flat in this API
    return HttpRequest(
        url=base_url.rstrip("/") + "/responses",
        headers=headers(api_key, extra_headers),
        body=body,
    )


def replay_request(
    *,
    base_url: str,
    api_key: str | None,
    response_id: str,
    after: int,
    extra_headers: dict[str, str],
) -> HttpRequest:
    """Re-attach to a background response, asking for the events after ``after``."""
    url = f"{base_url.rstrip('/')}/responses/{response_id}?stream=true&starting_after={after}"
    return HttpRequest(url=url, headers=headers(api_key, extra_headers), body={}, method="GET")


def custom_tool_names(body: dict[str, Any]) -> frozenset[str]:
    """The custom tools (``{"type": "custom", "name": …}``) a request declares."""
    given = body.get("tools")
    tools: list[Any] = given if isinstance(given, list) else []
    return frozenset(
        str(t["name"])
        for t in tools
        if isinstance(t, dict) and t.get("type") == "custom" and "name" in t
    )


class ResponsesDecoder(StreamDecoder):
    """Responses API events -> text; see :class:`~streamres._providers.wire.StreamDecoder`."""

    __slots__ = ("background", "custom_tools", "response_failed", "sequence")

    def __init__(self) -> None:
        super().__init__()
        self.background = False
        #: ``response.failed`` arrived: the stored response is dead, never re-attached to.
        self.response_failed = False
        #: Names of the custom (free-text input) tools the request declared.
        self.custom_tools: frozenset[str] = frozenset()
        #: The last sequence_number seen: where a replay starts after.
        self.sequence: int | None = None

    def feed(self, name: str, data: bytes) -> str:
        try:
            event = json.loads(data.decode())
        except (ValueError, RecursionError):
            return self._malformed(data)
        if type(event) is not dict:
            return self._malformed(data)
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            self.sequence = seq
        kind = text_or_none(event.get("type")) or name
        if kind == "response.output_text.delta":
            return text_or_none(event.get("delta")) or ""
        if kind == "response.refusal.delta":
            self.refusal.append(text_or_none(event.get("delta")) or "")
            self.generating = True
            return ""
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self.side.append(("thinking", text_or_none(event.get("delta")) or ""))
            return ""
        if kind.startswith(
            (
                "response.output_item.",
                "response.function_call_arguments.",
                "response.custom_tool_call_input.",
            )
        ):
            self._function_call(kind, event)
            return ""
        response = event.get("response") or {}
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self.response_id = text_or_none(response.get("id")) or self.response_id
            self.background = bool(response.get("background")) or self.background
        elif kind in ("response.completed", "response.incomplete"):
            # The final response's id, as the SDK reads it (a server may rotate them).
            self.response_id = text_or_none(response.get("id")) or self.response_id
            usage = response.get("usage") or {}
            self.input_tokens = count(usage.get("input_tokens"), self.input_tokens)
            self.output_tokens = count(usage.get("output_tokens"), self.output_tokens)
            self.finish_reason = "stop" if kind == "response.completed" else "length"
            self.terminal = True
            if self.calls and kind == "response.completed":
                self.finish_reason = "tool_calls"
                self._finish_calls()
        elif kind == "response.failed":
            self.error = classify_error_object(response.get("error") or {})
            # The response itself failed: re-attaching would replay the failure. The answer
            # goes on with a new request.
            self.background = False
            self.response_failed = True
        elif kind == "error":
            self.error = classify_error_object(event.get("error") or event)
        return ""

    def _function_call(self, kind: str, event: dict[str, Any]) -> None:
        """Function calls: an output item each, arguments streamed, whole at ``.done``."""
        index = event.get("output_index", 0)
        item = event.get("item") or {}
        custom = item.get("type") == "custom_tool_call" and item.get("name") in self.custom_tools
        if kind == "response.output_item.added" and (item.get("type") == "function_call" or custom):
            # A custom tool counts only when the request declared it: xAI reports the tools it
            # runs itself (x_keyword_search…) as custom_tool_call items too.
            call = PartialCall(
                id=str(item.get("call_id", "")),
                name=str(item.get("name", "")),
                requires_close=True,
                custom=custom,
            )
            given = item.get("input") if custom else item.get("arguments")
            if given:
                call.add(str(given))
            self.calls[index] = call
        elif index in self.calls:
            call = self.calls[index]
            if kind in (
                "response.function_call_arguments.delta",
                "response.custom_tool_call_input.delta",
            ):
                self.generating = True
                call.add(text_or_none(event.get("delta")) or "")
            elif kind == "response.function_call_arguments.done":
                call.arguments = [text_or_none(event.get("arguments")) or ""]
            elif kind == "response.custom_tool_call_input.done":
                call.arguments = [text_or_none(event.get("input")) or ""]
            elif kind == "response.output_item.done":
                call.closed = True
