"""OpenAI Chat Completions streaming, as every compatible server speaks it.

Covers OpenAI, vLLM, SGLang, llama.cpp, Ollama, OpenRouter, DeepSeek, Mistral… Quirks handled:
an error object inside a 200 stream (``data: {"error": …}``), OpenRouter's error chunk with
``finish_reason: "error"``, usage in a final chunk with empty ``choices``, and a ``[DONE]``
that follows no finish reason (llama-cpp-python cutting a stream: a truncation, not success).
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from streamres._core.classify import Failure, classify_error_object
from streamres._providers.params import for_provider
from streamres._providers.parts import content_for
from streamres._providers.tools import openai_tools
from streamres._providers.wire import (
    HttpRequest,
    PartialCall,
    StreamDecoder,
    count,
    normalise_finish,
    text_or_none,
)

__all__ = ["OpenAIDecoder", "build_request", "headers"]


def headers(api_key: str | None, extra: dict[str, str]) -> dict[str, str]:
    """OpenAI's headers (``Authorization: Bearer``), for Chat Completions and Responses."""
    out = {"content-type": "application/json", "accept": "text/event-stream"}
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    out.update(extra)
    return out


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
    """The POST the official SDK would send for ``stream=True``."""
    if any(isinstance(m.get("content"), list) for m in messages):
        messages = [
            {**m, "content": content_for("openai", m["content"])}
            if isinstance(m.get("content"), list)
            else m
            for m in messages
        ]
    extra_body = for_provider("openai", extra_body)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if max_tokens is not None:
        # OpenAI's own API deprecated max_tokens (reasoning models reject it); compatible
        # servers mostly know only max_tokens.
        field = "max_completion_tokens" if "api.openai.com" in base_url else "max_tokens"
        body[field] = max_tokens
    body.update(extra_body)
    body.update(openai_tools(extra_body))  # tools written in any provider's shape
    return HttpRequest(
        url=base_url.rstrip("/") + "/chat/completions",
        headers=headers(api_key, extra_headers),
        body=body,
    )


# A plain content chunk as OpenAI (and servers copying it) write it. Recognising it and reading
# the one string with json's own scanner is ~2x cheaper than json.loads; the checks make sure
# nothing else in the chunk could mean something (an error, usage, a finish reason), and any
# other shape falls through to json.loads.
_CONTENT = '"choices":[{"index":0,"delta":{"content":"'
_AFTER = '},"logprobs":null,"finish_reason":null}]'
_TAIL = re.compile(r'(?:,"usage":null)?(?:,"obfuscation":"[^"\\]*")?\}\Z')


class OpenAIDecoder(StreamDecoder):
    """Chat Completions chunks -> text; see :class:`~streamres._providers.wire.StreamDecoder`."""

    __slots__ = ()

    def feed(self, name: str, data: bytes) -> str:
        if data == b"[DONE]":
            self.terminal = True
            return ""
        try:
            # str, not bytes: json.loads(bytes) first guesses the encoding in Python (~1.5 µs).
            text = data.decode()
            at = text.find(_CONTENT)
            head = text[:at] if at > 0 else ""
            if head.startswith('{"id":"') and '"error"' not in head and '"usage":{' not in head:
                value, end = scanstring(text, at + len(_CONTENT))
                if text.startswith(_AFTER, end) and _TAIL.match(text, end + len(_AFTER)):
                    if self.response_id is None:  # once per response
                        self.response_id = str(scanstring(text, 7)[0]) or None
                    return str(value)
            chunk = json.loads(text)
        except (ValueError, RecursionError):  # UnicodeDecodeError, scanner errors, deep nesting
            return self._malformed(data)
        if type(chunk) is not dict:
            return self._malformed(data)
        if self.response_id is None:
            self.response_id = text_or_none(chunk.get("id"))
        usage = chunk.get("usage")
        if usage:
            # Before the error: OpenRouter sends usage with its final error chunk.
            self.input_tokens = count(usage.get("prompt_tokens"), self.input_tokens)
            self.output_tokens = count(usage.get("completion_tokens"), self.output_tokens)
        error = chunk.get("error")
        if error is not None:
            self.error = classify_error_object(error)
            return ""
        choices = chunk.get("choices")
        if not choices:
            if usage:
                self.final_usage = True
            return ""
        choice = choices[0]
        if choice.get("index", 0) != 0:
            # Only the first choice is the answer (streamres asks for one; n > 1 is refused at
            # the call): a server's other choices are not mixed into it.
            choice = next((c for c in choices if c.get("index", 0) == 0), None)
            if choice is None:
                return ""
        delta = choice.get("delta") or {}
        refusal = text_or_none(delta.get("refusal"))
        if refusal:
            self.refusal.append(refusal)
            self.generating = True
        reasoning = text_or_none(delta.get("reasoning_content") or delta.get("reasoning"))
        if reasoning:
            self.side.append(("thinking", reasoning))
        for call in delta.get("tool_calls") or ():
            self.generating = True
            index = call.get("index")
            if index is None:
                # Mistral sends parallel calls without an index, each whole with its own id.
                ident = call.get("id")
                last = max(self.calls, default=-1)
                new = last < 0 or (ident and self.calls[last].id and self.calls[last].id != ident)
                index = last + 1 if new else last
            if type(index) is not int:
                raise TypeError("a tool call's index must be an integer")
            partial = self.calls.setdefault(index, PartialCall())
            partial.id = text_or_none(call.get("id")) or partial.id
            function = call.get("function") or {}
            partial.name = text_or_none(function.get("name")) or partial.name
            arguments = text_or_none(function.get("arguments"))
            if arguments:
                partial.add(arguments)
        reason = choice.get("finish_reason")
        if reason:
            if reason == "error":
                self.error = classify_error_object({"message": "the provider ended the stream"})
                return ""
            # The turn's tool calls are handed over at its end (end_failure), all at once: some
            # servers repeat the finish reason, with more calls between.
            self.finish_reason = normalise_finish(reason)
        content = delta.get("content")
        if type(content) is list:
            return self._parts(content)
        return text_or_none(content) or ""

    def end_failure(self) -> Failure | None:
        """As the base's, once the turn's tool calls are handed over (every one, or none)."""
        if self.finish_reason is not None and self.calls:
            self._finish_calls()
            if self.finish_reason is None:  # a call did not arrive whole
                return self.error
        return super().end_failure()

    def _parts(self, parts: list[Any]) -> str:
        """``content`` as a list of typed parts (Mistral's reasoning models): text parts are
        the answer, thinking parts go to ``side``; other part types carry no text."""
        text: list[str] = []
        for part in parts:
            kind = part.get("type")
            if kind == "text":
                text.append(text_or_none(part.get("text")) or "")
            elif kind == "thinking":
                inner = part.get("thinking")
                pieces = inner if type(inner) is list else [{"text": inner}]
                thought = "".join(text_or_none(p.get("text")) or "" for p in pieces)
                if thought:
                    self.side.append(("thinking", thought))
        return "".join(text)
