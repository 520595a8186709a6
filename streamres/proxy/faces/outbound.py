"""streamres events, written back in the API the client spoke. Pure: events in, bytes out.

One :class:`Writer` per response. The client sees one uninterrupted stream in its own format
— OpenAI chat completion chunks, Anthropic message events, or Responses API events — whatever
provider served it and however many attempts it took. Recovery status goes out as SSE
comments (``: streamres …``, in the block of the event after it), which every SSE client
ignores; a client that asks for them
(``x-streamres-status: events``) gets them as ``event: streamres.status`` events instead.

Every event carries an ``id:``, numbered from 0 in the order written (in the Responses API the
same number is its ``sequence_number``): a reader that reconnects with ``Last-Event-ID`` gets
exactly the events after it (``held``).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from streamres import DoneEvent, Route, StreamError, ToolCallEvent
from streamres._shell.apps import flat_name
from streamres.proxy.faces.inbound import API, Call

__all__ = ["PREFIXES", "Frame", "Writer", "answer_usage", "error_body", "responses_usage"]

#: The id of an answer in each API starts so; the rest is the answer's own (``Writer.answer``).
PREFIXES = {"openai": "chatcmpl-", "anthropic": "msg_", "responses": "resp_"}

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "invalid_api_key"),
    404: ("not_found_error", "model_not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("overloaded_error", "server_is_overloaded"),
    504: ("api_error", "timeout"),
}


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def escaped(text: str) -> bytes:
    """``text`` as the inside of a JSON string, as :func:`_dump` writes it."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


@dataclass(frozen=True, slots=True)
class Frame:
    """A text delta's SSE block but for its number and its text, which is all a held answer
    keeps of it (the block is made again when read): ``id: <n>`` + ``head`` (+ ``<n>`` +
    ``again``, where the event repeats its number: a Responses event's ``sequence_number``)
    + the text (:func:`escaped`) + ``tail``."""

    head: bytes
    again: bytes | None
    tail: bytes

    def block(self, number: int, text: bytes) -> bytes:
        n = b"%d" % number
        if self.again is None:
            return b"".join((b"id: ", n, self.head, text, self.tail))
        return b"".join((b"id: ", n, self.head, n, self.again, text, self.tail))


def _framed(event: str | None, obj: dict[str, Any], numbered: bool = False) -> Frame:
    """The frame of an event whose data is ``obj`` with the text ``\x00`` in its place
    (``numbered``: its ``sequence_number``, the first field, is the event's number)."""
    head = b"\n" + (f"event: {event}\n".encode() if event else b"") + b"data: "
    data = _dump(obj)
    at = data.rindex(b"\\u0000")  # the text comes after every other string
    before, tail = data[:at], data[at + 6 :] + b"\n\n"
    if not numbered:
        return Frame(head + before, None, tail)
    start = b'{"type":' + _dump(obj["type"]) + b',"sequence_number":'
    seq = before.index(b",", len(start))
    return Frame(head + start, before[seq:], tail)


def error_body(api: API, status: int, message: str, code: str | None = None) -> bytes:
    """An error response body in the client's own API's shape (``code``: OpenAI's, when not
    the status's usual one)."""
    kind, usual = _ERROR_TYPES.get(status, ("api_error", "api_error"))
    code = code or usual
    if api == "anthropic":
        return _dump({"type": "error", "error": {"type": kind, "message": message}})
    kind = "invalid_request_error" if status in (400, 404) else kind
    return _dump({"error": {"message": message, "type": kind, "param": None, "code": code}})


def answer_usage(done: DoneEvent) -> tuple[int, int]:
    """The usage a client is told: its prompt and the answer it got, once. For an answer of
    one attempt, the server's own counts; for one that took more, the answer's tokens (the
    ledger's count of what was delivered) and the smallest prompt a server reported (the
    first request's; later ones carried the partial answer too): attempts that failed, and
    text generated again and dropped, are the proxy's cost, not the client's bill (the
    library's ``DoneEvent.usage`` keeps the whole cost)."""
    u = done.usage
    if done.attempts <= 1:
        out = u.output_tokens if u.output_tokens is not None else u.delivered_tokens
        return (u.input_tokens or 0), out
    prompts = [a.input_tokens for a in done.history if a.input_tokens is not None]
    return (min(prompts) if prompts else (u.input_tokens or 0)), u.delivered_tokens


class Writer:
    """Encodes one answer's events for the client."""

    def __init__(
        self,
        call: Call,
        *,
        model: str | None = None,
        status_events: bool = False,
        answer: str | None = None,
        created: int | None = None,
    ) -> None:
        self.call = call
        self.api = call.api
        self.status_events = status_events
        #: The answer's id in its API's shape; ``answer``: its unguessable part (by default,
        #: 128 random bits), by which a reader finds the answer again.
        self.answer = answer or secrets.token_hex(16)
        self.id = PREFIXES[call.api] + self.answer
        self.created = int(time.time()) if created is None else created
        #: When it was completed (the Responses API's ``completed_at``), once it was.
        self.completed: int | None = None
        #: The model answering, as every chunk names it: the first of the chain, then the
        #: one each retry, resume or fallback goes to, and at the end the done event's.
        self.model = model or call.model
        self._seq = 0
        self._block = -1  # Anthropic: index of the open content block
        self._block_kind = ""
        self._text = bytearray()  # Responses: the open text item's text, UTF-8
        #: The frames of plain deltas (:meth:`delta`), by what they depend on.
        self._frames: dict[tuple[Any, ...], Frame] = {}
        self._items: list[dict[str, Any]] = []  # Responses: output items done so far
        self._calls = 0
        #: Responses: the functions of the request's ``namespace`` tools by the name routes
        #: call them (``<namespace>__<name>``): handed back as the namespace's own.
        self._spaces = _namespaced(call.params.get("tools")) if call.api == "responses" else {}
        #: Comments wait for the next event, in whose block they go: an SDK's SSE decoder
        #: (the official openai and anthropic ones) takes a comment-only block after an
        #: ``id:`` for an event with no data, and fails on it.
        self._comments: list[str] = []

    @property
    def open_text(self) -> int:
        """Bytes of the text item a Responses answer has open (the writer keeps its text)."""
        return len(self._text)

    # -- SSE framing ---------------------------------------------------------------------

    def _sse(self, event: str | None, obj: Any) -> bytes:
        head = (
            "".join(self._comments) + f"id: {self._seq}\n" + (f"event: {event}\n" if event else "")
        )
        self._comments.clear()
        self._seq += 1
        return head.encode() + b"data: " + (obj if isinstance(obj, bytes) else _dump(obj)) + b"\n\n"

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return self._sse(
            None,
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            },
        )

    def _resp(self, kind: str, **fields: Any) -> bytes:
        return self._sse(kind, {"type": kind, "sequence_number": self._seq, **fields})

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        """The Responses API's response object, every field the specification requires
        (each its type or null), the request's own settings as it asked for them."""
        call, asked = self.call, self.call.params
        finished = status in ("completed", "incomplete")
        if finished and self.completed is None:
            self.completed = int(time.time())
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": self.completed if finished else None,
            "status": status,
            "incomplete_details": None,
            "model": self.model,
            "previous_response_id": call.previous,
            "instructions": call.instructions,
            "output": list(self._items),
            "error": None,
            "tools": [_echoed(t) for t in asked.get("tools") or ()],
            "tool_choice": asked.get("tool_choice", "auto"),
            "truncation": asked.get("truncation", "disabled"),
            "parallel_tool_calls": asked.get("parallel_tool_calls", True),
            "text": asked.get("text") or {"format": {"type": "text"}},
            "top_p": _number(asked.get("top_p"), 1.0),
            "presence_penalty": _number(asked.get("presence_penalty"), 0.0),
            "frequency_penalty": _number(asked.get("frequency_penalty"), 0.0),
            "top_logprobs": asked.get("top_logprobs", 0),
            "temperature": _number(asked.get("temperature"), 1.0),
            "reasoning": asked.get("reasoning"),
            "user": asked.get("user"),
            "usage": None,
            "max_output_tokens": call.max_tokens,
            "max_tool_calls": asked.get("max_tool_calls"),
            "store": call.store,
            "background": call.background,
            "service_tier": asked.get("service_tier") or "default",
            "metadata": asked.get("metadata") or {},
            "safety_identifier": asked.get("safety_identifier"),
            "prompt_cache_key": asked.get("prompt_cache_key"),
            **extra,
        }

    # -- the stream ----------------------------------------------------------------------

    def start(self) -> bytes:
        if self.api == "openai":
            return self._chunk({"role": "assistant", "content": ""})
        if self.api == "anthropic":
            message: dict[str, Any] = {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                # An estimate (a token is about four bytes of the request) until the end's
                # message_delta carries the server's count: a client's context meter starts
                # from it, as from the API's own message_start.
                "usage": {"input_tokens": (self.call.size + 3) // 4, "output_tokens": 0},
            }
            return self._sse("message_start", {"type": "message_start", "message": message})
        response = self._response("in_progress", usage=None)
        return self._resp("response.created", response=response) + self._resp(
            "response.in_progress", response=response
        )

    def _anthropic_block(self, kind: str, start: dict[str, Any]) -> bytes:
        out = self._anthropic_close()
        self._block += 1
        self._block_kind = kind
        return out + self._sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": start},
        )

    def _anthropic_close(self) -> bytes:
        if not self._block_kind:
            return b""
        self._block_kind = ""
        return self._sse("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _message_id(self) -> str:
        return "msg_" + self.id.removeprefix("resp_")

    def _responses_open_text(self) -> bytes:
        if self._block_kind == "text":
            return b""
        self._block_kind = "text"
        item = {
            "id": self._message_id(),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        idx = len(self._items)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return self._resp("response.output_item.added", output_index=idx, item=item) + self._resp(
            "response.content_part.added",
            item_id=item["id"],
            output_index=idx,
            content_index=0,
            part=part,
        )

    def _responses_close_text(self) -> bytes:
        if self._block_kind != "text":
            return b""
        self._block_kind = ""
        text = self._text.decode()
        self._text.clear()
        idx = len(self._items)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = {
            "id": self._message_id(),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }
        self._items.append(item)
        ids = {"item_id": item["id"], "output_index": idx, "content_index": 0}
        return (
            self._resp("response.output_text.done", **ids, text=text, logprobs=[])
            + self._resp("response.content_part.done", **ids, part=part)
            + self._resp("response.output_item.done", output_index=idx, item=item)
        )

    def delta(
        self, kind: Literal["text", "thinking"], text: str
    ) -> tuple[Frame, int, bytes] | None:
        """A text (or thinking) event that continues the open block with nothing before it:
        its frame, its number and its text escaped — the writer moves on as :meth:`text`
        would. ``None``: it opens a block or carries comments (:meth:`text` encodes it)."""
        api = self.api
        if self._comments or (api != "openai" and self._block_kind != kind):
            return None
        if api == "responses" and kind != "text":
            return None
        key = (kind, self.model) if api == "openai" else (kind, self._block, len(self._items))
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = self._frame(kind)
        n = self._seq
        self._seq += 1
        if api == "responses":  # its text item is written whole when it closes
            self._text += text.encode()
        return frame, n, escaped(text)

    def _frame(self, kind: Literal["text", "thinking"]) -> Frame:
        if self.api == "openai":
            field = "content" if kind == "text" else "reasoning_content"
            return _framed(
                None,
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": {field: "\x00"}, "finish_reason": None}],
                },
            )
        if self.api == "anthropic":
            delta = {"type": "text_delta", "text": "\x00"}
            if kind == "thinking":
                delta = {"type": "thinking_delta", "thinking": "\x00"}
            obj = {"type": "content_block_delta", "index": self._block, "delta": delta}
            return _framed("content_block_delta", obj)
        kind_ = "response.output_text.delta"
        obj = {
            "type": kind_,
            "sequence_number": 0,
            "item_id": self._message_id(),
            "output_index": len(self._items),
            "content_index": 0,
            "delta": "\x00",
            "logprobs": [],
        }
        return _framed(kind_, obj, numbered=True)

    def text(self, text: str) -> bytes:
        plain = self.delta("text", text)
        if plain is not None:
            frame, n, inside = plain
            return frame.block(n, inside)
        if self.api == "responses":  # its text item is written whole when it closes
            self._text += text.encode()
        if self.api == "openai":
            return self._chunk({"content": text})
        if self.api == "anthropic":
            out = b""
            if self._block_kind != "text":
                out = self._anthropic_block("text", {"type": "text", "text": ""})
            return out + self._sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._block,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
        out = self._responses_open_text()
        return out + self._resp(
            "response.output_text.delta",
            item_id=self._message_id(),
            output_index=len(self._items),
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def thinking(self, text: str) -> bytes:
        plain = self.delta("thinking", text)
        if plain is not None:
            frame, n, inside = plain
            return frame.block(n, inside)
        if self.api == "openai":
            return self._chunk({"reasoning_content": text})
        if self.api == "anthropic":
            out = b""
            if self._block_kind != "thinking":
                out = self._anthropic_block("thinking", {"type": "thinking", "thinking": ""})
            return out + self._sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._block,
                    "delta": {"type": "thinking_delta", "thinking": text},
                },
            )
        return b""  # the Responses API's reasoning summaries are not synthesised

    def tool_call(self, ev: ToolCallEvent) -> bytes:
        index = self._calls
        self._calls += 1
        if self.api == "openai":
            call = {
                "index": index,
                "id": ev.id,
                "type": "function",
                "function": {"name": ev.name, "arguments": ev.arguments},
            }
            return self._chunk({"tool_calls": [call]})
        if self.api == "anthropic":
            out = self._anthropic_block(
                "tool_use", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}
            )
            return out + self._sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._block,
                    "delta": {"type": "input_json_delta", "partial_json": ev.arguments},
                },
            )
        out = self._responses_close_text()
        idx = len(self._items)
        item = {
            "id": f"fc_{self.answer}_{index}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": ev.id,
            **self._named(ev.name),
            "arguments": "",
        }
        done = {**item, "status": "completed", "arguments": ev.arguments}
        self._items.append(done)
        return (
            out
            + self._resp("response.output_item.added", output_index=idx, item=item)
            + self._resp(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=idx,
                delta=ev.arguments,
            )
            + self._resp(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=idx,
                arguments=ev.arguments,
            )
            + self._resp("response.output_item.done", output_index=idx, item=done)
        )

    def _named(self, name: str) -> dict[str, str]:
        """A Responses ``function_call``'s name, and its namespace when it has one."""
        spaced = self._spaces.get(name)
        return {"name": name} if spaced is None else {"namespace": spaced[0], "name": spaced[1]}

    def moved(self, ev: Any) -> None:
        """A retry, resume or fallback names the model the answer goes to: chunks name it."""
        self.model = ev.to_model if ev.type == "fallback" else ev.model

    def status(self, ev: Any) -> bytes:
        """A retry, resume or fallback: an SSE comment every client ignores, or an event."""
        fields = {"type": ev.type, "reason": ev.reason, "attempt": ev.attempt}
        if ev.type == "fallback":
            fields.update(from_model=ev.from_model, to_model=ev.to_model)
        else:
            fields.update(delay=round(ev.delay, 3), model=ev.model)
        self.moved(ev)
        if self.status_events:
            return self._sse("streamres.status", {**fields, "message": ev.message})
        words = " ".join(f"{k}={v}" for k, v in fields.items())
        self._comments.append(f": streamres {words}\n")
        return b""

    def done(self, done: DoneEvent) -> bytes:
        return self._joined(done) + self._done(done)

    def _joined(self, done: DoneEvent) -> bytes:
        """How a resumed answer was joined, before its end: a comment every client ignores
        (or a ``streamres.done`` event when asked), so a log or a UI can count doubtful joins
        and tell an answer that stopped at a resume's seam (``complete=false``)."""
        if done.join == "none":
            return b""
        fields = {"join": done.join, "complete": str(done.complete).lower()}
        if self.status_events:
            return self._sse("streamres.done", {**fields, "complete": done.complete})
        words = " ".join(f"{k}={v}" for k, v in fields.items())
        self._comments.append(f": streamres {words}\n")
        return b""

    def _done(self, done: DoneEvent) -> bytes:
        self.model = done.model
        inp, out = answer_usage(done)
        finish = done.finish_reason
        if self.api == "openai":
            reason = "stop" if finish == "refusal" else finish
            tail = self._chunk({}, reason)
            if self.call.include_usage:
                tail += self._sse(
                    None,
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": inp,
                            "completion_tokens": out,
                            "total_tokens": inp + out,
                        },
                    },
                )
            return tail + self._sse(None, b"[DONE]")
        if self.api == "anthropic":
            stop = _ANTHROPIC_STOP.get(finish, finish)
            return (
                self._anthropic_close()
                + self._sse(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"input_tokens": inp, "output_tokens": out},
                    },
                )
                + self._sse("message_stop", {"type": "message_stop"})
            )
        out_bytes = self._responses_close_text()
        usage = responses_usage(inp, out)
        if finish == "length":
            response = self._response(
                "incomplete", usage=usage, incomplete_details={"reason": "max_output_tokens"}
            )
            return out_bytes + self._resp("response.incomplete", response=response)
        return out_bytes + self._resp(
            "response.completed", response=self._response("completed", usage=usage)
        )

    def failed(self, exc: StreamError) -> bytes:
        """The answer gave up after text was sent: an in-band error in the client's format."""
        message = str(exc)
        if self.api == "openai":
            return self._sse(
                None, {"error": {"message": message, "type": "api_error", "code": exc.reason}}
            )
        if self.api == "anthropic":
            return self._anthropic_close() + self._sse(
                "error", {"type": "error", "error": {"type": "api_error", "message": message}}
            )
        response = self._response(
            "failed", usage=None, error={"code": "server_error", "message": message}
        )
        return self._responses_close_text() + self._resp("response.failed", response=response)

    def stopped(self) -> bytes:
        """The answer was stopped on purpose (a person pressed Stop; ``POST …/stop`` or the
        Responses API's ``cancel``): the partial answer ends as a finished one, after a
        ``streamres stopped`` comment (an event when asked). The Responses API has no such
        event: its stream ends, and the response's status is ``cancelled``."""
        mark = b""
        if self.status_events:
            mark = self._sse("streamres.stopped", {"type": "stopped"})
        else:
            self._comments.append(": streamres stopped\n")
        if self.api == "openai":
            return mark + self._chunk({}, "stop") + self._sse(None, b"[DONE]")
        if self.api == "anthropic":
            return (
                mark
                + self._anthropic_close()
                + self._sse(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": 0},
                    },
                )
                + self._sse("message_stop", {"type": "message_stop"})
            )
        return mark

    def snapshot(self, status: str, error: StreamError | None = None) -> dict[str, Any]:
        """The Responses API's response object as it stands (``GET /v1/responses/{id}``):
        the output so far, the text in progress as its own message item."""
        items = list(self._items)
        if self._block_kind == "text":
            text = self._text.decode()
            items.append(
                {
                    "id": self._message_id(),
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                    ],
                }
            )
        extra: dict[str, Any] = {"usage": None, "background": self.call.background}
        if error is not None:
            extra["error"] = {"code": "server_error", "message": str(error)}
        return {**self._response(status, **extra), "output": items}

    # -- not streamed --------------------------------------------------------------------

    def body(self, done: DoneEvent) -> bytes:
        """The whole answer as one JSON response in the client's API."""
        self.model = done.model
        inp, out = answer_usage(done)
        calls = done.tool_calls
        if self.api == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": done.text or None}
            if done.refusal:
                message["refusal"] = done.refusal
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ]
            reason = "stop" if done.finish_reason == "refusal" else done.finish_reason
            return _dump(
                {
                    "id": self.id,
                    "object": "chat.completion",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                    "usage": {
                        "prompt_tokens": inp,
                        "completion_tokens": out,
                        "total_tokens": inp + out,
                    },
                }
            )
        if self.api == "anthropic":
            content: list[dict[str, Any]] = []
            if done.thinking:
                content.append({"type": "thinking", "thinking": done.thinking, "signature": ""})
            if done.text:
                content.append({"type": "text", "text": done.text})
            for c in calls:
                content.append(
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": _args(c.arguments)}
                )
            return _dump(
                {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": content,
                    "stop_reason": _ANTHROPIC_STOP.get(done.finish_reason, done.finish_reason),
                    "stop_sequence": None,
                    "usage": {"input_tokens": inp, "output_tokens": out},
                }
            )
        self._text = bytearray(done.text.encode())
        if done.text:
            self._block_kind = "text"
            self._responses_close_text()
        for i, c in enumerate(calls):
            self._items.append(
                {
                    "id": f"fc_{self.answer}_{i}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": c.id,
                    **self._named(c.name),
                    "arguments": c.arguments,
                }
            )
        status = "incomplete" if done.finish_reason == "length" else "completed"
        extra: dict[str, Any] = {"usage": responses_usage(inp, out)}
        if status == "incomplete":
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        return _dump(self._response(status, **extra))


def _echoed(tool: Any) -> Any:
    """A tool as a response echoes it: a function tool always with ``strict`` (the
    specification requires the key; ``null`` when the request did not say)."""
    if isinstance(tool, dict) and tool.get("type") == "function" and "strict" not in tool:
        return {**tool, "strict": None}
    return tool


def _namespaced(tools: Any) -> dict[str, tuple[str, str]]:
    """The functions of ``namespace`` tools: ``{flat name: (namespace, name)}``."""
    found: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            group = str(tool.get("name", ""))
            for member in tool.get("tools") or ():
                if not isinstance(member, dict):
                    continue
                name = member.get("name") or (member.get("function") or {}).get("name")
                if isinstance(name, str):
                    found[flat_name(group, name)] = (group, name)
    return found


def responses_usage(inp: int, out: int) -> dict[str, Any]:
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def _args(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def without_urls(exc: StreamError, routes: Sequence[Route]) -> StreamError:
    """``exc`` as a client of the proxy may read it: each route's server named by the route,
    never by its URL (an operator's address is the operator's; the log keeps it)."""
    message = exc.message
    for route in routes:
        parts = urlsplit(str(route.base_url))
        origin = f"{parts.scheme!s}://{parts.netloc!s}"
        if parts.netloc and origin in message:
            message = re.sub(re.escape(origin) + r"[^\s'\"),;]*", f"route {route.key!r}", message)
    if message == exc.message:
        return exc
    public = copy.copy(exc)
    public.message, public.args = message, (message,)
    return public


def _number(value: Any, default: float) -> float:
    """A sampling setting as the response object gives it: the number asked for, else the
    API's default."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default
