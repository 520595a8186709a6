"""Answers kept for repeated requests: an LRU with a time to live and a size bound. Pure.

Seed §4.2: the cheapest cure for "at capacity" is not to ask at all — in one Q&A app about a
third of the requests were repeats, and answering those from a cache cut model calls by about
a third at peak. The shell decides what may be cached (:func:`cache_key`, ``Cache``'s rules)
and streams a kept answer back; this module only keeps them, with the time passed in.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from streamres._core.events import (
    DoneEvent,
    Event,
    TextEvent,
    ThinkingEvent,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from streamres._core.semantic import Semantic

__all__ = ["AnswerStore", "Cache", "CacheStats", "cache_key", "decode_answer", "encode_answer"]

V = TypeVar("V")


@dataclass(frozen=True)
class Cache:
    """What a ``Client`` keeps and shares (``Client(cache=Cache(...))``).

    ``ttl``: seconds an answer is kept; ``max_entries`` and ``max_chars``: bounds (the least
    recently used go first). ``include_sampled``: also keep answers to requests with an explicit
    ``temperature`` above 0 (off: such a request asks for a new sample each time). Requests with
    ``tools`` are kept only with ``include_tools`` (a tool's world may have changed). ``pace``:
    tokens per second to stream a kept answer at (``None``: at once), for UIs that animate.
    ``single_flight``: identical requests in flight at the same time share one upstream stream.
    ``semantic``: also answer a question asked in other words (:class:`Semantic`; off by
    default).
    """

    ttl: float = 3600.0
    max_entries: int = 1000
    max_chars: int = 16_000_000
    include_sampled: bool = False
    include_tools: bool = False
    pace: float | None = None
    single_flight: bool = True
    semantic: Semantic | None = None

    def __post_init__(self) -> None:
        if self.ttl <= 0 or self.max_entries < 1 or self.max_chars < 1:
            raise ValueError("Cache: ttl, max_entries and max_chars must be positive")
        if self.pace is not None and self.pace <= 0:
            raise ValueError("Cache: pace is tokens per second, above 0 (or None)")
        if self.semantic is not None and not isinstance(self.semantic, Semantic):
            raise ValueError("Cache: semantic is a streamres.Semantic(...) (or None)")

    def keeps(self, more: Mapping[str, Any]) -> bool:
        """May an answer to a request with these extra arguments be kept?"""
        temperature = more.get("temperature")
        if isinstance(temperature, (int, float)) and temperature > 0 and not self.include_sampled:
            return False
        return not (more.get("tools") and not self.include_tools)


@dataclass
class CacheStats:
    """How the cache and single-flight saved requests."""

    #: Requests answered from the cache because an identical one was answered before.
    hits: int = 0
    #: Requests answered from the cache because a question with the same meaning was.
    semantic_hits: int = 0
    misses: int = 0
    #: Requests that joined an identical one already in flight.
    joins: int = 0

    @property
    def requests_saved(self) -> int:
        return self.hits + self.semantic_hits + self.joins


def cache_key(
    messages: Sequence[Mapping[str, Any]],
    chain: Sequence[str],
    max_tokens: int | None,
    more: Mapping[str, Any],
) -> str:
    """The identity of a request: the same messages, model chain and parameters."""
    blob = json.dumps(
        {"m": messages, "c": list(chain), "t": max_tokens, "p": more},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class _Entry(Generic[V]):
    value: V
    size: int
    expires: float


@dataclass
class AnswerStore(Generic[V]):
    """Values by key with an expiry and a total size bound (least recently used evicted)."""

    ttl: float
    max_entries: int
    max_size: int
    _items: OrderedDict[str, _Entry[V]] = field(default_factory=OrderedDict)
    _size: int = 0

    def get(self, key: str, now: float) -> V | None:
        entry = self._items.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return entry.value

    def alive(self, key: str, now: float) -> bool:
        """Is a value kept under ``key`` (without counting it as used)?"""
        entry = self._items.get(key)
        return entry is not None and entry.expires > now

    def put(self, key: str, value: V, size: int, now: float) -> None:
        if size > self.max_size:
            return  # larger than the whole cache: not kept
        if key in self._items:
            self._drop(key)
        self._items[key] = _Entry(value, size, now + self.ttl)
        self._size += size
        while len(self._items) > self.max_entries or self._size > self.max_size:
            self._drop(next(iter(self._items)))

    def _drop(self, key: str) -> None:
        entry = self._items.pop(key)
        self._size -= entry.size

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        return self._size


def encode_answer(kept: Sequence[Event]) -> str:
    """A kept answer (text, thinking and tool-call events, then its done event) as JSON, for a
    store other processes read (never pickle: a shared store must not run code)."""
    out: list[dict[str, Any]] = []
    for ev in kept:
        if isinstance(ev, (TextEvent, ThinkingEvent)):
            out.append({"type": ev.type, "text": ev.text})
        elif isinstance(ev, ToolCallEvent):
            out.append({"type": ev.type, "id": ev.id, "name": ev.name, "arguments": ev.arguments})
        elif isinstance(ev, DoneEvent):
            out.append(
                {
                    "type": "done",
                    "text": ev.text,
                    "finish_reason": ev.finish_reason,
                    "model": ev.model,
                    "delivered_tokens": ev.usage.delivered_tokens,
                    "encoding": ev.usage.encoding,
                    "tool_calls": [[c.id, c.name, c.arguments] for c in ev.tool_calls],
                    "thinking": ev.thinking,
                    "refusal": ev.refusal,
                }
            )
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def decode_answer(blob: str) -> tuple[Event, ...] | None:
    """:func:`encode_answer`'s events again, or ``None`` when ``blob`` is not one (a store
    written by another version, or damaged): a miss, never an error."""
    try:
        items = json.loads(blob)
        events: list[Event] = []
        for item in items:
            kind = item["type"]
            if kind == "text":
                events.append(TextEvent(str(item["text"])))
            elif kind == "thinking":
                events.append(ThinkingEvent(str(item["text"])))
            elif kind == "tool_call":
                events.append(
                    ToolCallEvent(str(item["id"]), str(item["name"]), str(item["arguments"]))
                )
            elif kind == "done":
                events.append(
                    DoneEvent(
                        text=str(item["text"]),
                        finish_reason=str(item["finish_reason"]),
                        model=str(item["model"]),
                        attempts=0,
                        resumes=0,
                        usage=Usage(
                            delivered_tokens=int(item["delivered_tokens"]),
                            encoding=str(item["encoding"]),
                        ),
                        tool_calls=tuple(
                            ToolCall(str(i), str(n), str(a)) for i, n, a in item["tool_calls"]
                        ),
                        thinking=str(item["thinking"]),
                        refusal=str(item["refusal"]),
                    )
                )
            else:
                return None
    except (ValueError, KeyError, TypeError):
        return None
    if not events or not isinstance(events[-1], DoneEvent):
        return None
    return tuple(events)
