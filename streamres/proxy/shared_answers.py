"""Held answers kept in Redis too (``--redis``): any proxy process reads any answer, and adopts
one whose process died.

Theory of operation. The process producing an answer keeps three keys for it, all in one hash
slot (``{id}``, so a Redis Cluster keeps them together):

- ``…:meta``, a hash: what the answer is — its request, chain, lane, client key, the id and
  clock its writer numbers events with, its deadline on the wall clock — and its status;
- ``…:log``, a stream: the answer's events in batches, each entry the library's events (JSON)
  and the SSE events they were encoded to; an answer's last entry says how it ended;
- ``…:lease``, a string: the producing process, expiring ``LEASE_MS`` after its last renewal.

Writes go through before reads: a reader is sent an event once Redis has it, so whatever a
client holds another process can give again. They are coalesced: the answer's first event is
written at once, later ones at most every ``FLUSH`` seconds, all that came in one ``XADD``
with the lease's renewal.

A reader that comes to a process that does not hold the answer gets a *shadow* of it: the log
read from the start and followed (``XREAD``), each event encoded again by a writer of the same
id and clock — which gives the same bytes and, above all, the same numbering and open blocks.
While the lease is alive the shadow only follows. When it has lapsed and the answer has not
ended, its producer is gone (killed, out of memory, a deploy): the shadow's process takes the
lease (``SET NX``) and *adopts* the answer — it continues it upstream from its text
(``continue_from``) under the original deadline, writing on to the same log. When an answer
ends its keys expire after ``keep`` seconds; while it runs, after its deadline and ``keep``.
Redis away: answers are held in this process only, as without ``--redis``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import streamres
from streamres.proxy.inbound import Call
from streamres.proxy.outbound import Writer

__all__ = ["FLUSH", "LEASE_MS", "SharedAnswers", "event_from", "event_json"]

#: Seconds an answer's events after its first wait to be written together (the first goes at
#: once: the time to a first event is what a person notices).
FLUSH = 0.02
#: A producing process's lease on an answer; renewed every third of it.
LEASE_MS = 3000
#: Entries read at once from an answer's log.
_BATCH = 500


def event_json(ev: streamres.Event) -> dict[str, Any]:
    """A library event as JSON (what an adopting process needs of it)."""
    if isinstance(ev, streamres.DoneEvent):
        u = ev.usage
        return {
            "type": "done",
            "text": ev.text,
            "finish_reason": ev.finish_reason,
            "model": ev.model,
            "attempts": ev.attempts,
            "resumes": ev.resumes,
            "usage": [u.input_tokens, u.output_tokens, u.delivered_tokens, u.estimated],
            "tool_calls": [[c.id, c.name, c.arguments] for c in ev.tool_calls],
            "thinking": ev.thinking,
            "refusal": ev.refusal,
            "join": ev.join,
            "deduplicated_chars": ev.deduplicated_chars,
            "response_id": ev.response_id,
        }
    return {"type": ev.type, **{k: v for k, v in dataclasses.asdict(ev).items() if k != "type"}}


_KINDS: dict[str, Any] = {
    "text": streamres.TextEvent,
    "thinking": streamres.ThinkingEvent,
    "tool_call": streamres.ToolCallEvent,
    "retry": streamres.RetryEvent,
    "resume": streamres.ResumeEvent,
    "fallback": streamres.FallbackEvent,
}


def event_from(obj: dict[str, Any]) -> streamres.Event:
    """The event :func:`event_json` wrote."""
    fields = {k: v for k, v in obj.items() if k != "type"}
    if obj["type"] != "done":
        return _KINDS[obj["type"]](**fields)  # type: ignore[no-any-return]
    inp, out, delivered, estimated = fields.pop("usage")
    calls = tuple(streamres.ToolCall(*c) for c in fields.pop("tool_calls"))
    usage = streamres.Usage(inp, out, delivered, estimated=estimated)
    return streamres.DoneEvent(usage=usage, tool_calls=calls, **fields)


class SharedAnswers:
    """An answer's keys in Redis, through the client's shared state (``Client(shared=…)``)."""

    def __init__(self, shared: Any, keep: float) -> None:
        self.shared = shared
        self.keep = keep
        self.prefix = f"{shared.name}:answer:"  # each answer its own tag: spread over a cluster
        #: Writes and reads made, by kind (what an answer costs in Redis).
        self.calls: dict[str, int] = {}

    def _keys(self, answer_id: str) -> tuple[str, str, str]:
        base = f"{self.prefix}{{{answer_id}}}"
        return f"{base}:meta", f"{base}:log", f"{base}:lease"

    async def _do(self, kind: str, command: Any) -> Any:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        shared = self.shared
        if not shared.connected:
            return None
        return await shared._bounded(lambda: command(shared._redis))

    # -- the producing process ------------------------------------------------------------

    async def begin(self, held: Any, deadline_wall: float) -> bool:
        """Write what the answer is, and take its lease; False when Redis does not answer."""
        meta, _, lease = self._keys(held.id)
        w: Writer = held.writer
        fields = {
            "call": json.dumps(dataclasses.asdict(held.call)),
            "chain": json.dumps(held.chain),
            "kwargs": json.dumps(held.kwargs),
            "tenant": held.tenant or "",
            "owner": held.owner or "",
            "answer": w.answer,
            "created": str(w.created),
            "model": w.model,
            "status_events": "1" if w.status_events else "",
            "deadline": repr(deadline_wall),
            "status": "in_progress",
        }
        expire = int(max(1.0, deadline_wall - time.time()) + self.keep) + 1

        async def write(redis: Any) -> Any:
            async with redis.pipeline(transaction=False) as pipe:
                done = [
                    pipe.hset(meta, fields),
                    pipe.expire(meta, expire),
                    pipe.set(lease, self.shared.id, px=LEASE_MS),
                ]
            return [await d for d in done]

        return await self._do("begin", write) is not None

    async def write(
        self, held: Any, entries: list[tuple[dict[str, Any] | None, bytes]], end: str | None
    ) -> bool | None:
        """Append ``entries`` (events and their encoded bytes) in one log entry, renew the
        lease; ``end``: the answer ended so (its keys then expire after ``keep``). True when
        another process asked for the answer to be stopped; ``None``: Redis did not answer
        (the same write may be sent again: readers skip an entry they have)."""
        meta, logkey, lease = self._keys(held.id)
        events = [e for e, _ in entries if e is not None]
        data = b"".join(b for _, b in entries).decode("utf-8")
        # ``at``: the events logged before these, so that a write sent again (Redis answered
        # the first too late to tell) is read once.
        entry: dict[str, str] = {
            "e": json.dumps(events, ensure_ascii=False),
            "b": data,
            "at": str(held.logged),
        }
        if end is not None:
            entry["end"] = end
            if held.log.error is not None:
                entry["error"] = json.dumps(_error_json(held.log.error))
        keep = int(self.keep) + 1

        async def send(redis: Any) -> Any:
            async with redis.pipeline(transaction=False) as pipe:
                done = []
                if end is None:
                    done.append(pipe.hget(meta, "stop"))
                if events or data or end is not None:
                    done.append(pipe.xadd(logkey, entry))
                if end is None:
                    done.append(pipe.set(lease, self.shared.id, px=LEASE_MS))
                    done.append(pipe.expire(logkey, keep + max(1, int(held.deadline_left()))))
                else:
                    done.append(pipe.hset(meta, {"status": end}))
                    done.append(pipe.expire(meta, keep))
                    done.append(pipe.expire(logkey, keep))
                    done.append(pipe.delete([lease]))
            return [await d for d in done]

        got = await self._do("write", send)
        if got is None:
            return None
        held.logged += len(events)
        return bool(end is None and got[0])

    async def release(self, answer_id: str) -> None:
        """Give the answer's lease up (it is parked: any process may take it on)."""
        _, _, lease = self._keys(answer_id)
        await self._do("release", lambda redis: redis.delete([lease]))

    async def ask_stop(self, answer_id: str) -> None:
        """Ask the process producing the answer to stop it (it reads this as it writes)."""
        meta, _, _ = self._keys(answer_id)
        await self._do("stop", lambda redis: redis.hset(meta, {"stop": "1"}))

    # -- another process ------------------------------------------------------------------

    async def meta(self, answer_id: str) -> dict[str, str] | None:
        """The answer's meta hash (``None``: unknown here, or Redis away)."""
        meta, _, _ = self._keys(answer_id)
        got = await self._do("meta", lambda redis: redis.hgetall(meta))
        return dict(got) if got else None

    async def entries(
        self, answer_id: str, after: str, block_ms: int
    ) -> list[tuple[str, dict[str, str]]] | None:
        """Log entries after entry id ``after`` (waiting up to ``block_ms`` for one), as
        (entry id, fields); ``None``: Redis away."""
        _, logkey, _ = self._keys(answer_id)
        if block_ms <= 0:
            start = "-" if after == "0" else f"({after}"
            got: Any = await self._do(
                "read", lambda redis: redis.xrange(logkey, start, "+", count=_BATCH)
            )
        else:

            async def follow(redis: Any) -> Any:
                read = await redis.xread({logkey: after}, count=_BATCH, block=block_ms)
                return next(iter(read.values())) if read else ()  # nothing came meanwhile

            got = await self._do("follow", follow)
        if got is None:
            return None
        return [(e.identifier, dict(e.field_values)) for e in got]

    async def take(self, answer_id: str) -> bool:
        """Take the answer's lease if it lapsed (its producer is gone)."""
        _, _, lease = self._keys(answer_id)
        from coredis import PureToken

        got = await self._do(
            "take",
            lambda redis: redis.set(lease, self.shared.id, px=LEASE_MS, condition=PureToken.NX),
        )
        return bool(got)

    async def alive(self, answer_id: str) -> bool | None:
        """Does a process hold the answer's lease? (``None``: Redis away.)"""
        _, _, lease = self._keys(answer_id)
        got = await self._do("lease", lambda redis: redis.exists([lease]))
        return None if got is None else bool(got)


def _error_json(exc: streamres.StreamError) -> dict[str, Any]:
    return {
        "class": type(exc).__name__,
        "message": exc.message,
        "reason": exc.reason,
        "status_code": exc.status_code,
    }


def error_from(obj: dict[str, Any], partial: str) -> streamres.StreamError:
    """The error :func:`_error_json` wrote, as the same class of ``StreamError``."""
    found = getattr(streamres, str(obj.get("class")), None)
    cls: type[streamres.StreamError] = streamres.StreamError
    if (
        isinstance(found, type)
        and issubclass(found, streamres.StreamError)
        and found is not streamres.MissingExtra  # its constructor is another's
    ):
        cls = found
    return cls(
        str(obj.get("message", "")),
        reason=obj.get("reason"),
        status_code=obj.get("status_code"),
        partial_text=partial,
    )


def call_from(meta: dict[str, str]) -> Call:
    return Call(**json.loads(meta["call"]))
