"""A client's request, in any of the three APIs, as one call to a ``streamres.Client``. Pure.

The proxy speaks each API's own wire format to its clients; inside, every request becomes the
same :class:`Call`: OpenAI-shaped messages (tool calls and results the OpenAI way, which the
library converts for each provider it falls back to), the model alias, the token budget, and
the parameters passed through to the upstream.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamres._shell.apps import flat_name

__all__ = ["API", "BadRequest", "Call", "input_items", "parse", "responses_messages"]

API = Literal["openai", "anthropic", "responses"]

#: The fields of each API's request the proxy reads itself; every other field passes on to the
#: upstream (the library converts it for each route's provider, or refuses it there by name).
_READ: dict[str, frozenset[str]] = {
    "openai": frozenset(
        {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}
    ),
    "anthropic": frozenset({"model", "messages", "system", "stream", "max_tokens"}),
    "responses": frozenset(
        {
            "model",
            "input",
            "instructions",
            "stream",
            "max_output_tokens",
            "background",
            "store",
            "previous_response_id",
        }
    ),
}

#: Fields that name state kept on one server: an answer that falls back or resumes elsewhere
#: could not honour them, so they are refused (the Responses API's ``previous_response_id``
#: is the proxy's own: it keeps the responses, :mod:`streamres.proxy.answers.stored`).
_STATEFUL = {
    "previous_response_id": "send the whole conversation instead",
    "conversation": "send the whole conversation as input instead",
    "prompt": "send the prompt's text as input instead",
}


#: Content parts that are not text: images and documents, in the Anthropic and Responses shapes
#: (OpenAI messages pass as they are).
_MEDIA = ("image", "document", "input_image", "input_file")


class BadRequest(ValueError):
    """The client's request cannot be served as written (answered with HTTP 400)."""


@dataclass
class Call:
    api: API
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    max_tokens: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: OpenAI ``stream_options.include_usage``: a final usage chunk for the client.
    include_usage: bool = False
    #: The Responses API's ``background``: the answer runs whether or not anyone reads it.
    background: bool = False
    #: The Responses API's ``instructions``, as given (its response object echoes them); when
    #: given, ``messages`` starts with them as a system message.
    instructions: Any = None
    #: The Responses API's ``previous_response_id``: ``messages`` holds that response's whole
    #: conversation (after the instructions) once the proxy has looked it up.
    previous: str | None = None
    #: The Responses API's ``store``: the response is kept to be read and continued.
    store: bool = True
    #: The Responses API's input as its items, each with an id (``input_items`` lists them).
    items: list[dict[str, Any]] = field(default_factory=list)
    #: Bytes of the request body (a first estimate of its tokens, before a server counts).
    size: int = 0

    @property
    def head(self) -> int:
        """How many of ``messages`` are the instructions (0 or 1): they are not carried to a
        response that continues this one."""
        return 1 if self.api == "responses" and self.instructions else 0


def parse(api: API, raw: bytes) -> Call:
    """The client's request body -> a :class:`Call` (:class:`BadRequest` with why)."""
    try:
        return _parse(api, raw)
    except RecursionError:
        # json.loads (and the conversions after it) recurse per level: a body of a few KB of
        # "[[[[…" must be a 400 like any other bad body, not a 500.
        raise BadRequest("the request body is nested too deeply to be a request") from None


#: An escaped surrogate in a body (a pair's half; alone it is no text).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(api: API, raw: bytes) -> Call:
    try:
        body = json.loads(raw, parse_constant=_not_a_number)
    except ValueError as exc:
        raise BadRequest(f"the request body is not JSON ({exc})") from exc
    try:  # a lone surrogate (an escaped half of a pair) is no text: no upstream takes it
        if _SURROGATE.search(raw):
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "the request body holds a lone surrogate (\\ud800–\\udfff without its pair): "
            "text must be valid Unicode"
        ) from None
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required: a model name (GET /v1/models lists them)")
    if api == "openai":
        messages = _openai_messages(body.get("messages"))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    elif api == "anthropic":
        messages = _anthropic_messages(body.get("messages"), body.get("system"))
        max_tokens = body.get("max_tokens")
    else:
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise BadRequest("previous_response_id must be a response's id (a string)")
        messages = _responses_messages(
            body.get("input"), body.get("instructions"), continued=previous is not None
        )
        max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise BadRequest("the token limit must be a positive integer")
    for name, instead in _STATEFUL.items():
        if body.get(name) is not None and (api, name) != ("responses", "previous_response_id"):
            raise BadRequest(
                f"{name} refers to state kept by one server, which an answer that falls back "
                f"cannot use: {instead}"
            )
    read = _READ[api]
    params = {k: v for k, v in body.items() if k not in read and v is not None}
    options = body.get("stream_options")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        # "false" is truthy: taking it as true would stream to a client that asked not to.
        raise BadRequest(f"stream must be true or false (a JSON boolean), not {stream!r:.40}")
    if options is not None:
        # Managed here (the upstream request is the proxy's own): checked as the API checks it,
        # never passed on unread.
        if not isinstance(options, Mapping):
            raise BadRequest(f"stream_options must be an object, not {options!r:.40}")
        if not stream:
            raise BadRequest("stream_options is only allowed when stream is true")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise BadRequest(
                f"stream_options.include_usage must be true or false, not {usage!r:.40}"
            )
    background = body.get("background", False) if api == "responses" else False
    if not isinstance(background, bool):
        raise BadRequest(f"background must be true or false, not {background!r:.40}")
    store = body.get("store", True) if api == "responses" else True
    if not isinstance(store, bool):
        raise BadRequest(f"store must be true or false, not {store!r:.40}")
    if background and not store:
        raise BadRequest("background responses are kept to be read later: store must be true")
    return Call(
        api=api,
        model=model,
        messages=messages,
        stream=bool(stream),
        background=background,
        max_tokens=max_tokens,
        params=params,
        include_usage=isinstance(options, Mapping) and bool(options.get("include_usage")),
        instructions=body.get("instructions") if api == "responses" else None,
        previous=body.get("previous_response_id") if api == "responses" else None,
        store=store,
        items=input_items(body.get("input")) if api == "responses" else [],
        size=len(raw),
    )


def input_items(given: Any) -> list[dict[str, Any]]:
    """A Responses request's input as the API lists it (``input_items``): items, each with an
    id and a status, a string as one user message."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, Mapping):
            continue
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        if "id" not in item:
            tag = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
            item["id"] = f"{tag.get(str(kind), 'item')}_{secrets.token_hex(16)}"
        item.setdefault("status", "completed")
        out.append(item)
    return out


def responses_messages(items: Any) -> list[dict[str, Any]]:
    """Responses API items (input or output) as OpenAI-shaped messages."""
    return _responses_messages(items, None, continued=True) if items else []


def _text(content: Any) -> str:
    """Text of a content value: a string, or a list of text parts (others are dropped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") in ("text", "input_text", "output_text")
        )
    return ""


def _openai_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise BadRequest("each message needs a 'role'")
    return [dict(m) for m in messages]


def _anthropic_messages(messages: Any, system: Any) -> list[dict[str, Any]]:
    """Messages API turns as OpenAI-shaped messages. A ``system`` message among them (the
    mid-conversation system messages Claude Code sends) stays in its place: a Chat or
    Responses route takes it there; an Anthropic route's request gathers it into ``system``,
    as a server without the beta would need. Refusals are worded as Anthropic's API words
    them, so a client's own fallbacks (which read the words) recognise them."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: Field required (a non-empty list of messages)")
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text(system)})
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role == "system" and isinstance(m, Mapping):
            if not isinstance(m.get("content"), (str, list)):
                raise BadRequest(f"messages.{i}.content: a string or a list of text blocks")
            out.append({"role": "system", "content": _text(m["content"])})
            continue
        if role not in ("user", "assistant") or not isinstance(m, Mapping):
            raise BadRequest(
                f'messages.{i}: Unexpected role "{str(role)[:40]}". Allowed roles are "user" '
                'and "assistant" (and "system" within the conversation)'
            )
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest("a message's content must be a string or a list of blocks")
        text: Any = _text(content)
        media = [b for b in content if isinstance(b, Mapping) and b.get("type") in _MEDIA]
        if media:  # images and documents go on as blocks (converted for each provider)
            text = [
                dict(b)
                for b in content
                if isinstance(b, Mapping) and b.get("type") in ("text", *_MEDIA)
            ]
        calls = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_use"]
        results = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        for r in results:
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": r.get("tool_use_id"),
                    "content": _text(r.get("content")) if r.get("content") is not None else "",
                }
            )
        if calls:
            out.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [
                        {
                            "id": c.get("id"),
                            "type": "function",
                            "function": {
                                "name": c.get("name"),
                                "arguments": json.dumps(c.get("input") or {}),
                            },
                        }
                        for c in calls
                    ],
                }
            )
        elif text or not results:
            out.append({"role": m["role"], "content": text})
    return out


def _responses_messages(items: Any, instructions: Any, *, continued: bool) -> list[dict[str, Any]]:
    """``continued``: the input continues a stored response (it may hold only tool results)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": _text(instructions)})
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a string or a non-empty list of items")
    for item in items:
        if not isinstance(item, Mapping):
            raise BadRequest("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            role = "system" if item["role"] == "developer" else item["role"]
            content = item.get("content")
            media = isinstance(content, list) and any(
                isinstance(p, Mapping) and p.get("type") in _MEDIA for p in content
            )
            # Images and files go on as parts (converted for each provider); text as text.
            parts = list(content) if media and isinstance(content, list) else None
            out.append({"role": role, "content": parts or _text(content)})
        elif kind == "function_call":
            name, group = item.get("name"), item.get("namespace")
            if isinstance(group, str) and group and isinstance(name, str):
                name = flat_name(group, name)  # a namespace's function, as routes know it
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments") or "{}"},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif (
                last is not None
                and last["role"] == "assistant"
                and isinstance(last["content"], str)
            ):  # the text the model said before its call: one turn
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        # reasoning and other item kinds carry nothing a fallback model can use: dropped
    if not continued and not any(m["role"] == "user" for m in out):
        raise BadRequest("'input' has no user message")
    return out
