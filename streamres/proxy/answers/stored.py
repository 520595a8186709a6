"""Stored Responses API responses: what ``previous_response_id``, ``GET``, ``DELETE`` and
``input_items`` find.

Theory of operation. A Responses API answer made with ``store`` (the default, as OpenAI's) is
kept when it ends, as one record (:class:`Stored`): its response object as served, its input
items as the request gave them, and its whole conversation as OpenAI-shaped messages — the
conversation before it, its input, its output (text and tool calls): all a model needs to go
on from it, without the instructions, which a request that continues it gives anew (as the
API specifies). A request that names it as ``previous_response_id`` is sent that conversation
and then its own input, to whatever model its route chain picks, whichever provider serves it:
the proxy keeps the state, so no upstream has to.

A record is its client key's (any other key is told it does not exist) and is kept ``keep``
seconds: in this process's memory within ``max_bytes`` (past it, the oldest go from memory),
and with shared state in Redis too — one key per response, expiring with it — where every
replica finds it. While Redis is away, a response not in memory may exist all the same: the
caller is told to try again (:class:`Away`), never that it does not exist. When Redis comes
back, or turns out to have lost its data, each process writes the records it has in memory
again (:meth:`ResponseStore.rewrite`), and meanwhile (while answers settle) a response not
found is a "try again" too. An answer that
ended a moment ago is still held (:mod:`.held`), and is found there before it is stored.
``store: false`` keeps nothing here: the answer is held for its readers, then forgotten.

With shared state, Redis is the truth: every lookup asks it (one round trip), memory only
spares the decoding. A delete leaves a tombstone in the response's key for ``keep`` seconds,
so a replica that still holds the response (stored, or its answer held) learns on its next
lookup that it is gone (:data:`DELETED`), and forgets it. A record read from Redis is kept in
memory only for its owner. With Redis away, a replica serves only what it stored itself.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from streamres.proxy.config import StoreLimits
from streamres.proxy.faces.inbound import Call, responses_messages

__all__ = ["DELETED", "Away", "Deleted", "ResponseStore", "Stored", "page", "stored_of"]

#: What a deleted response's key holds until its time would have run out.
_TOMBSTONE = "deleted"


class Deleted:
    """A response its owner deleted (on any replica)."""


DELETED = Deleted()


class Away(Exception):
    """Shared state is away: a response not in this process's memory may exist."""


@dataclass(frozen=True)
class Stored:
    """One stored response."""

    id: str
    owner: str | None
    #: The response object as it was last served.
    response: dict[str, Any]
    #: Its input items, as ``input_items`` lists them (each with an id).
    input: list[dict[str, Any]]
    #: The whole conversation up to and including this response's output (OpenAI-shaped
    #: messages, without the instructions): what a response that continues it is sent first.
    conversation: list[dict[str, Any]]
    #: When it was stored (seconds since the epoch).
    at: float

    def dumps(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def loads(cls, data: str) -> Stored:
        return cls(**json.loads(data))


def stored_of(call: Call, response: dict[str, Any], owner: str | None) -> Stored:
    """The record of an answer to ``call`` that ended as ``response``."""
    conversation = call.messages[call.head :] + responses_messages(response.get("output") or [])
    return Stored(str(response["id"]), owner, response, call.items, conversation, time.time())


def page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """A list of items as the API pages them (``limit`` 1–100, default 20; ``order``
    ``desc`` — the default — or ``asc``; ``after``: the id of the last item seen);
    ``ValueError`` for a bad parameter."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order[:20]!r}")
    given = query.get("limit", "20")
    if not given.isascii() or not given.isdigit() or not 1 <= int(given) <= 100:
        raise ValueError(f"limit must be an integer from 1 to 100, not {given[:20]!r}")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after:
        ids = [str(item.get("id")) for item in ordered]
        if after not in ids:
            raise ValueError(f"after must be the id of one of the items, not {after[:60]!r}")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[: int(given)]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > len(data),
    }


class ResponseStore:
    """Stored responses, by id: in memory, and in Redis when the client shares state."""

    def __init__(
        self,
        limits: StoreLimits,
        shared: Callable[[], Any],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        #: The client's shared state (``None``: none), looked up when used.
        self._shared = shared
        self.clock = clock
        self._memory: collections.OrderedDict[str, tuple[Stored, int]] = collections.OrderedDict()
        #: Bytes of the records in memory (their JSON).
        self.bytes = 0
        #: The records this process stored itself (served from memory while Redis is away).
        self._mine: set[str] = set()

    def __len__(self) -> int:
        return len(self._memory)

    def _key(self, shared: Any, response_id: str) -> str:
        return f"{shared.name}:response:{{{response_id}}}"  # its own tag: spread over a cluster

    async def _redis(self, command: Callable[[Any, str], Any], response_id: str) -> Any:
        """``command(redis, key)`` on the response's key: its result in a 1-tuple; ``None``
        when there is no shared state; :class:`Away` when Redis does not answer."""
        shared = self._shared()
        if shared is None:
            return None
        key = self._key(shared, response_id)

        async def run() -> tuple[Any]:
            return (await command(shared._redis, key),)

        got = await shared._bounded(run)
        if got is None:
            raise Away
        return got

    def _remember(self, stored: Stored, size: int) -> None:
        self._forget(stored.id)
        self._memory[stored.id] = (stored, size)
        self.bytes += size
        while self.bytes > self.limits.max_bytes and len(self._memory) > 1:
            self._forget(next(iter(self._memory)))

    def _forget(self, response_id: str) -> None:
        found = self._memory.pop(response_id, None)
        self._mine.discard(response_id)
        if found is not None:
            self.bytes -= found[1]

    async def put(self, stored: Stored) -> None:
        """Keep ``stored`` (in Redis too when shared: if Redis is away, in memory only)."""
        data = stored.dumps()
        self._remember(stored, len(data.encode()))
        self._mine.add(stored.id)
        await self._write(stored.id, data, max(1, int(self.limits.keep)))

    async def _write(self, response_id: str, data: str, seconds: int) -> None:
        """The record in Redis, for ``seconds`` (Redis away: here only; other replicas find
        its answer while that is held, and it is written once Redis is back)."""
        with contextlib.suppress(Away):
            await self._redis(lambda redis, key: redis.set(key, data, ex=seconds), response_id)

    async def rewrite(self) -> None:
        """Redis came back, or lost its data: every record in memory written again (with the
        time it has left), those stored while it was away included."""
        now = self.clock()
        for stored, _ in list(self._memory.values()):
            left = int(self.limits.keep - (now - stored.at))
            if left >= 1:
                await self._write(stored.id, stored.dumps(), left)

    async def get(self, response_id: str, owner: str | None) -> Stored | Deleted | None:
        """The stored response of that id, if ``owner``'s and kept; :data:`DELETED` when its
        owner deleted it; :class:`Away` when it may exist but Redis does not answer."""
        found = self._memory.get(response_id)
        stored = found[0] if found is not None else None
        try:
            got = await self._redis(lambda redis, key: redis.get(key), response_id)
        except Away:
            if stored is None or response_id not in self._mine:
                raise  # not this process's to vouch for
            got = None
        if got is not None:
            raw = got[0]
            if raw == _TOMBSTONE:
                self._forget(response_id)
                return DELETED if stored is None or stored.owner == owner else None
            if raw is not None and stored is None:
                stored = Stored.loads(raw)
                if stored.owner == owner:  # read into memory only for its owner
                    self._remember(stored, len(raw.encode()))
        if stored is None or stored.owner != owner:
            return None
        if self.clock() - stored.at > self.limits.keep:
            self._forget(response_id)
            return None
        return stored

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Delete the stored response (``False``: ``owner`` has no such response): gone from
        memory, and its key in Redis a tombstone every replica reads."""
        if not isinstance(await self.get(response_id, owner), Stored):
            return False
        self._forget(response_id)
        seconds = max(1, int(self.limits.keep))
        await self._redis(lambda redis, key: redis.set(key, _TOMBSTONE, ex=seconds), response_id)
        return True
