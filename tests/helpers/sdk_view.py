"""What the official SDKs accumulate from a recorded stream's bytes: the reference that the
replay test holds streamres to. Each SDK parses the bytes with its own SSE decoder and builds
its own snapshot (``ChatCompletionStreamState``, ``accumulate_event``, the Responses API's
final response), exactly as ``client.chat.completions.stream`` / ``messages.stream`` /
``responses.stream`` do."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from anthropic._models import construct_type as anthropic_construct
from anthropic._streaming import SSEDecoder as AnthropicSSE
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai._models import construct_type as openai_construct
from openai._streaming import SSEDecoder as OpenAISSE
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from streamres._providers.wire import normalise_finish


@dataclass
class View:
    text: str = ""
    refusal: str = ""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, parsed arguments)
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: The stream carried an error (the SDK raises): the answer did not complete.
    error: bool = False
    #: The response's id, as the SDK's snapshot holds it.
    id: str | None = None


def _events(decoder: Any, body: bytes) -> list[Any]:
    return list(decoder.iter_bytes(iter([body])))


def chat(body: bytes) -> View:
    state = ChatCompletionStreamState()
    view = View()
    for sse in _events(OpenAISSE(), body):
        if sse.data.startswith("[DONE]"):
            break
        data = json.loads(sse.data)
        if isinstance(data, dict) and data.get("error"):
            view.error = True  # the SDK raises APIError here
            break
        state.handle_chunk(openai_construct(type_=ChatCompletionChunk, value=data))
    snap = state.current_completion_snapshot
    view.id = snap.id or None
    if snap.usage is not None:
        view.input_tokens = snap.usage.prompt_tokens
        view.output_tokens = snap.usage.completion_tokens
    if snap.choices:
        choice = next((c for c in snap.choices if c.index == 0), snap.choices[0])
        message = choice.message
        view.text = message.content or ""
        view.refusal = message.refusal or ""
        view.finish_reason = choice.finish_reason
        for call in message.tool_calls or ():
            fn = getattr(call, "function", None)
            if fn is not None:
                view.tool_calls.append((fn.name, arguments(fn.arguments or "")))
    return view


def anthropic(body: bytes) -> View:
    snapshot = None
    bufs: dict[int, bytes] = {}
    view = View()
    for sse in _events(AnthropicSSE(), body):
        if sse.event == "ping":
            continue
        if sse.event == "error":
            view.error = True
            break
        data = json.loads(sse.data)
        event = anthropic_construct(type_=RawMessageStreamEvent, value=data)  # type: ignore[arg-type]
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    if snapshot is None:
        return view
    view.id = snapshot.id or None
    view.text = "".join(b.text for b in snapshot.content if b.type == "text")
    view.tool_calls = [(b.name, b.input) for b in snapshot.content if b.type == "tool_use"]
    # Anthropic's stop reasons in OpenAI's words, as streamres documents them.
    reason = snapshot.stop_reason
    view.finish_reason = normalise_finish(reason) if reason is not None else None
    view.input_tokens = snapshot.usage.input_tokens
    view.output_tokens = snapshot.usage.output_tokens
    return view


def responses(body: bytes) -> View:
    """The SDK's final response is the one the terminal event carries."""
    view = View()
    final: dict[str, Any] | None = None
    for sse in _events(OpenAISSE(), body):
        if not sse.data or sse.data.startswith("[DONE]"):
            continue
        data = json.loads(sse.data)
        kind = data.get("type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = data.get("response") or {}
            view.error = kind == "response.failed"
        elif kind == "error":
            view.error = True
    if final is None:
        return view
    view.id = final.get("id") or None
    for item in final.get("output") or ():
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    view.text += part.get("text", "")
                elif part.get("type") == "refusal":
                    view.refusal += part.get("refusal", "")
        elif item.get("type") == "function_call":
            view.tool_calls.append((item.get("name"), arguments(item.get("arguments") or "")))
    usage = final.get("usage") or {}
    view.input_tokens = usage.get("input_tokens")
    view.output_tokens = usage.get("output_tokens")
    status = final.get("status")
    view.finish_reason = {"completed": "stop", "incomplete": "length"}.get(status, status)
    if view.tool_calls and status == "completed":
        view.finish_reason = "tool_calls"
    return view


def arguments(text: str) -> Any:
    """A tool call's arguments as compared: parsed, or the text itself when it does not parse
    (a model's bad JSON, handed over as written)."""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return text  # the recording's own arguments do not parse


def view(api: str, body: bytes) -> View | None:
    """The SDK's view, or ``None`` when the SDK itself cannot read the stream (it raises)."""
    try:
        return VIEWS[api](body)
    except Exception:
        return None


VIEWS = {"chat": chat, "anthropic": anthropic, "responses": responses}
