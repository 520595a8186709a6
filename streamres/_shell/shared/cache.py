"""The answer cache shared through Redis, so every process (proxy workers) answers a repeat.
I/O shell, over ``SharedState``'s connection.

With ``Client(..., shared="redis://…", cache=Cache(...))`` each process keeps its own cache
as before (the first place it looks), and behind it one cache for the fleet:

- a complete answer is written to ``{prefix}:cache:a:{key}`` as JSON (never pickle: a shared
  store must not run code) with the cache's ``ttl``, by one Lua script that also keeps an index
  by time of writing and drops the oldest beyond ``max_entries`` and ``max_chars`` — for the
  fleet, not per process. Written in the background: no answer waits for it;
- a request this process has not kept looks there (one round trip, bounded like every call);
- a question kept for the semantic cache (its context's hash, its text and its vector) is
  stored with the answer and published: other processes add it to their index as it arrives,
  and a process that starts later reads the kept ones. A near-repeat found in the index is
  fetched like any other answer.

When Redis is away every process uses its own cache only, and shares again when it is back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from streamres._core.cache import Cache, decode_answer, encode_answer
from streamres._core.events import Event
from streamres._shell.log import log
from streamres._shell.shared.scripts import script

__all__ = ["SharedCache"]

#: A kept question: its context's hash, its text and its vector (if it was embedded).
Asked = tuple[str, str, Sequence[float] | None]

#: Write one answer and keep the fleet's cache within its bounds (the oldest written go
#: first). KEYS: index (zset, score = order of writing), sizes (hash), questions (hash), total
#: size, the order's counter, times written (hash, ms). ARGV: key, blob, size, ttl ms, max
#: entries, max size, entry key prefix, question or "".
_PUT = script("cache_put")


class SharedCache:
    """Kept answers (and semantic-cache questions) for every process sharing ``state``."""

    def __init__(self, state: Any, cache: Cache) -> None:
        self.state = state
        self.cache = cache
        base = f"{state.prefix}:cache"
        self._entry = f"{base}:a:"
        self._keys = [
            f"{base}:{name}" for name in ("index", "sizes", "questions", "total", "seq", "written")
        ]
        state.register("cache_put", _PUT)
        #: Given (bucket, key, question, vector) for each question another process kept.
        self.on_question: Callable[[str, str, str, Sequence[float] | None], None] | None = None
        state.handlers["question"] = self._heard
        self._writing = 0
        self._written = anyio.Event()

    async def get(self, key: str) -> tuple[Event, ...] | None:
        """The fleet's kept answer for ``key`` (``None``: not kept, or Redis is away)."""
        blob = await self.state.get(self._entry + key)
        return decode_answer(blob) if isinstance(blob, str) else None

    def put(
        self,
        tg: anyio.abc.TaskGroup,
        key: str,
        kept: Sequence[Event],
        size: int,
        asked: Asked | None,
    ) -> None:
        """Write an answer for the fleet in the background (and tell the others of the
        question it answers, for their semantic cache)."""
        self._writing += 1
        tg.start_soon(self._write, key, kept, size, asked)

    async def flushed(self) -> None:
        """Wait until the answers being written are (a client closing leaves the rest)."""
        if self._writing:
            await self._written.wait()

    async def _write(self, key: str, kept: Sequence[Event], size: int, asked: Asked | None) -> None:
        try:
            blob = await anyio.to_thread.run_sync(encode_answer, kept)  # counts may settle here
            question = ""
            if asked is not None:
                bucket, text, vector = asked
                question = json.dumps(
                    {
                        "bucket": bucket,
                        "key": key,
                        "question": text,
                        "vector": [float(x) for x in vector] if vector is not None else None,
                    },
                    ensure_ascii=False,
                )
            ttl_ms = max(1, int(self.cache.ttl * 1000))
            args = [key, blob, size, ttl_ms, self.cache.max_entries, self.cache.max_chars]
            done = await self.state.run("cache_put", self._keys, [*args, self._entry, question])
            if done is not None and question:
                await self.state.publish({"kind": "question", "from": self.state.id, "q": question})
        except Exception as exc:  # a write in the background must never end the client's tasks
            log.warning("streamres.shared_cache_write_failed", error=type(exc).__name__)
        finally:
            self._writing -= 1
            if not self._writing:
                self._written.set()
                self._written = anyio.Event()

    async def load_questions(self) -> None:
        """The questions the fleet kept before this process started."""
        kept = await self.state.hgetall(self._keys[2])
        for value in (kept or {}).values():
            self._add(value)

    def _heard(self, event: dict[str, Any]) -> None:
        if event.get("from") != self.state.id and isinstance(event.get("q"), str):
            self._add(event["q"])

    def _add(self, value: str) -> None:
        if self.on_question is None:
            return
        try:
            q = json.loads(value)
            vector = q["vector"]
            self.on_question(
                str(q["bucket"]),
                str(q["key"]),
                str(q["question"]),
                [float(x) for x in vector] if vector is not None else None,
            )
        except (ValueError, KeyError, TypeError):
            return  # written by another version, or damaged: not used
