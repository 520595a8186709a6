"""SSE bytes exactly as the real APIs write them (see the field guide in the README)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

__all__ = ["AnthropicRender", "OpenAIRender", "Render", "ResponsesRender"]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _status_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        422: "invalid_request_error",
        429: "rate_limit_error",
        529: "overloaded_error",
        503: "overloaded_error",
    }.get(status, "api_error")


_STATUS_MESSAGES = {
    400: "Invalid request",
    401: "Incorrect API key provided",
    403: "Permission denied",
    404: "The model does not exist or you do not have access to it",
    429: "Rate limit reached for requests",
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway",
    503: "The engine is currently overloaded, please try again later",
    504: "Gateway timeout",
    529: "Overloaded",
}


class Render:
    """Common interface; one instance per response."""

    include_usage = False

    def __init__(self, model: str) -> None:
        self.model = model

    def error_body(self, status: int, error_type: str | None, message: str | None) -> bytes:
        raise NotImplementedError

    def start(self, input_tokens: int) -> bytes:
        raise NotImplementedError

    def text_start(self, index: int) -> bytes:
        return b""

    def delta(self, text: str, index: int = 0) -> bytes:
        raise NotImplementedError

    def thinking_start(self, index: int) -> bytes:
        return b""

    def reasoning(self, text: str, index: int) -> bytes:
        raise NotImplementedError

    def signature(self, index: int, signature: str) -> bytes:
        return b""

    def tool_start(self, index: int, call: int, call_id: str, name: str) -> bytes:
        raise NotImplementedError

    def tool_args(self, index: int, call: int, piece: str) -> bytes:
        raise NotImplementedError

    def block_stop(self, index: int) -> bytes:
        return b""

    def finish(self, reason: str, input_tokens: int, output_tokens: int) -> bytes:
        raise NotImplementedError

    def in_band_error(self, kind: str, error_type: str | None, message: str | None) -> bytes:
        raise NotImplementedError

    def terminator_without_finish(self) -> bytes:
        raise NotImplementedError

    def ping(self) -> bytes:
        raise NotImplementedError

    def malformed(self) -> bytes:
        return b'data: {"choices":[{"delta":{"content":"broken\n\n'


class OpenAIRender(Render):
    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        super().__init__(model)
        self.include_usage = include_usage
        self.head = (
            '{"id":"chatcmpl-' + uuid.uuid4().hex[:24] + '","object":"chat.completion.chunk",'
            f'"created":{int(time.time())},"model":{_dumps(model)},"system_fingerprint":null,'
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        usage = ',"usage":null' if self.include_usage else ""
        return f'data: {self.head}"choices":[{_dumps(choice)}]{usage}}}\n\n'.encode()

    def error_body(self, status: int, error_type: str | None, message: str | None) -> bytes:
        etype = error_type or _status_type(status)
        if status >= 500 and etype == "api_error":
            etype = "server_error"
        err = {
            "message": message or _STATUS_MESSAGES.get(status, "Error"),
            "type": etype,
            "param": None,
            "code": None,
        }
        return _dumps({"error": err}).encode()

    def start(self, input_tokens: int) -> bytes:
        return self._chunk({"role": "assistant", "content": "", "refusal": None}, None)

    def delta(self, text: str, index: int = 0) -> bytes:
        return self._chunk({"content": text}, None)

    def reasoning(self, text: str, index: int) -> bytes:
        return self._chunk({"reasoning_content": text}, None)

    def tool_start(self, index: int, call: int, call_id: str, name: str) -> bytes:
        fn = {"name": name, "arguments": ""}
        return self._chunk(
            {"tool_calls": [{"index": call, "id": call_id, "type": "function", "function": fn}]},
            None,
        )

    def tool_args(self, index: int, call: int, piece: str) -> bytes:
        return self._chunk(
            {"tool_calls": [{"index": call, "function": {"arguments": piece}}]}, None
        )

    def finish(self, reason: str, input_tokens: int, output_tokens: int) -> bytes:
        out = self._chunk({}, reason)
        if self.include_usage:
            usage = {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            }
            out += f'data: {self.head}"choices":[],"usage":{_dumps(usage)}}}\n\n'.encode()
        return out + b"data: [DONE]\n\n"

    def in_band_error(self, kind: str, error_type: str | None, message: str | None) -> bytes:
        if kind == "error-openrouter":
            err = {"code": "server_error", "message": "Provider disconnected unexpectedly"}
            choice = {"index": 0, "delta": {"content": ""}, "finish_reason": "error"}
            body = f'{self.head}"error":{_dumps(err)},"choices":[{_dumps(choice)}]}}'
            return f"data: {body}\n\n".encode()
        err = {
            "message": message
            or "The server had an error while processing your request. Sorry about that!",
            "type": error_type or "server_error",
        }
        return f"data: {_dumps({'error': err})}\n\n".encode()

    def terminator_without_finish(self) -> bytes:
        return b"data: [DONE]\n\n"

    def ping(self) -> bytes:
        return b": ping - " + time.strftime("%Y-%m-%d %H:%M:%S").encode() + b"\n\n"


class AnthropicRender(Render):
    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.id = "msg_" + uuid.uuid4().hex[:24]

    @staticmethod
    def _event(name: str, payload: str) -> bytes:
        return f"event: {name}\ndata: {payload}\n\n".encode()

    def error_body(self, status: int, error_type: str | None, message: str | None) -> bytes:
        err = {
            "type": error_type or _status_type(status),
            "message": message or _STATUS_MESSAGES.get(status, "Error"),
        }
        return _dumps({"type": "error", "error": err}).encode()

    def start(self, input_tokens: int) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }
        return (
            self._event("message_start", _dumps({"type": "message_start", "message": message}))
            + self.ping()
        )

    def _start(self, index: int, block: dict[str, Any]) -> bytes:
        payload = {"type": "content_block_start", "index": index, "content_block": block}
        return self._event("content_block_start", _dumps(payload))

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        payload = {"type": "content_block_delta", "index": index, "delta": delta}
        return self._event("content_block_delta", _dumps(payload))

    def text_start(self, index: int) -> bytes:
        return self._start(index, {"type": "text", "text": ""})

    def delta(self, text: str, index: int = 0) -> bytes:
        return self._event(
            "content_block_delta",
            f'{{"type":"content_block_delta","index":{index},'
            '"delta":{"type":"text_delta","text":' + _dumps(text) + "}}",
        )

    def thinking_start(self, index: int) -> bytes:
        return self._start(index, {"type": "thinking", "thinking": "", "signature": ""})

    def reasoning(self, text: str, index: int) -> bytes:
        return self._delta(index, {"type": "thinking_delta", "thinking": text})

    def signature(self, index: int, signature: str) -> bytes:
        return self._delta(index, {"type": "signature_delta", "signature": signature})

    def tool_start(self, index: int, call: int, call_id: str, name: str) -> bytes:
        return self._start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}})

    def tool_args(self, index: int, call: int, piece: str) -> bytes:
        return self._delta(index, {"type": "input_json_delta", "partial_json": piece})

    def block_stop(self, index: int) -> bytes:
        return self._event("content_block_stop", f'{{"type":"content_block_stop","index":{index}}}')

    def finish(self, reason: str, input_tokens: int, output_tokens: int) -> bytes:
        stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}.get(
            reason, reason
        )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
        return self._event("message_delta", _dumps(delta)) + self._event(
            "message_stop", '{"type":"message_stop"}'
        )

    def in_band_error(self, kind: str, error_type: str | None, message: str | None) -> bytes:
        err = {"type": error_type or "overloaded_error", "message": message or "Overloaded"}
        return self._event("error", _dumps({"type": "error", "error": err}))

    def terminator_without_finish(self) -> bytes:
        return self._event("message_stop", '{"type":"message_stop"}')

    def ping(self) -> bytes:
        return self._event("ping", '{"type": "ping"}')


class ResponsesRender(Render):
    """OpenAI Responses API events. Every event is numbered (``sequence_number``) and kept in
    ``log`` so that a background response can be replayed from any point."""

    def __init__(self, model: str, *, background: bool = False) -> None:
        super().__init__(model)
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.item = "msg_" + uuid.uuid4().hex[:24]
        self.background = background
        self.seq = 0
        self.text: list[str] = []
        #: Function-call items being streamed, and their argument pieces, by output index.
        self.calls: dict[int, dict[str, Any]] = {}
        self.args: dict[int, list[str]] = {}
        #: (sequence_number, bytes, is a text delta) of every event rendered.
        self.log: list[tuple[int, bytes, bool]] = []

    def _event(self, payload: dict[str, Any], *, delta: bool = False) -> bytes:
        payload["sequence_number"] = self.seq
        data = f"event: {payload['type']}\ndata: {_dumps(payload)}\n\n".encode()
        self.log.append((self.seq, data, delta))
        self.seq += 1
        return data

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "background": self.background,
            "model": self.model,
            "output": [],
            **extra,
        }

    def error_body(self, status: int, error_type: str | None, message: str | None) -> bytes:
        return OpenAIRender(self.model).error_body(status, error_type, message)

    def start(self, input_tokens: int) -> bytes:
        return self._event(
            {"type": "response.created", "response": self._response("in_progress")}
        ) + self._event({"type": "response.in_progress", "response": self._response("in_progress")})

    def text_start(self, index: int) -> bytes:
        item = {"id": self.item, "type": "message", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return self._event(
            {"type": "response.output_item.added", "output_index": 0, "item": item}
        ) + self._event(
            {
                "type": "response.content_part.added",
                "item_id": self.item,
                "output_index": 0,
                "content_index": 0,
                "part": part,
            }
        )

    def delta(self, text: str, index: int = 0) -> bytes:
        self.text.append(text)
        return self._event(
            {
                "type": "response.output_text.delta",
                "item_id": self.item,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
            delta=True,
        )

    def block_stop(self, index: int) -> bytes:
        call = self.calls.pop(index, None)
        if call is not None:
            item = {**call, "arguments": "".join(self.args.pop(index, [])), "status": "completed"}
            return self._event(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": call["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                }
            ) + self._event(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
        text = "".join(self.text)
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": self.item, "type": "message", "role": "assistant", "content": [part]}
        return (
            self._event({"type": "response.output_text.done", **where, "text": text})
            + self._event({"type": "response.content_part.done", **where, "part": part})
            + self._event({"type": "response.output_item.done", "output_index": 0, "item": item})
        )

    def tool_start(self, index: int, call: int, call_id: str, name: str) -> bytes:
        item = {
            "id": "fc_" + uuid.uuid4().hex[:24],
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        self.calls[index] = item
        return self._event(
            {"type": "response.output_item.added", "output_index": index, "item": item}
        )

    def tool_args(self, index: int, call: int, piece: str) -> bytes:
        self.args.setdefault(index, []).append(piece)
        return self._event(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": self.calls[index]["id"],
                "output_index": index,
                "delta": piece,
            },
            delta=True,
        )

    def finish(self, reason: str, input_tokens: int, output_tokens: int) -> bytes:
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        if reason == "length":
            details = {"reason": "max_output_tokens"}
            response = self._response("incomplete", usage=usage, incomplete_details=details)
            return self._event({"type": "response.incomplete", "response": response})
        response = self._response("completed", usage=usage)
        return self._event({"type": "response.completed", "response": response})

    def in_band_error(self, kind: str, error_type: str | None, message: str | None) -> bytes:
        error = {
            "code": error_type or "server_is_overloaded",
            "message": message or "The server is overloaded. Please try again later.",
        }
        return self._event(
            {"type": "response.failed", "response": self._response("failed", error=error)}
        )

    def terminator_without_finish(self) -> bytes:
        return b""  # the Responses API has no terminator of its own: this is a truncation

    def ping(self) -> bytes:
        return b": keep-alive\n\n"

    def reasoning(self, text: str, index: int) -> bytes:
        raise NotImplementedError("the embedded upstream streams no reasoning on /v1/responses")
