"""Held answers kept in Redis too (``--redis``): any proxy process reads any answer, and adopts
one whose process died.

Theory of operation. The process producing an answer keeps three keys for it, all in one hash
slot (``{id}``, so a Redis Cluster keeps them together):

- ``…:meta``, a hash: what the answer is — its request, chain, lane, client key, the id and
  clock its writer numbers events with, its deadline on the wall clock — its status, the
  events its log holds (``n``), the process that wrote it last (``by``), and a stop asked for;
- ``…:log``, a stream: the answer's events in batches, each entry the library's events (JSON),
  the SSE events they were encoded to, where it starts (``at``) and who wrote it (``w``); an
  answer's last entry says how it ended;
- ``…:lease``, a string: the producing process, expiring ``LEASE_MS`` after its last renewal.

Writes go through before reads: a reader is sent an event once Redis has it, so whatever a
client holds another process can give again. They are coalesced: the answer's first event is
written at once, later ones at most every ``FLUSH`` seconds, all that came in one ``XADD``
with the lease's renewal — one script (``_WRITE``), fenced: it lands only while this process
owns the answer (holds the lease, or wrote last and nobody took the lease since) and only at
the log's end. A write refused says why; its process stands down (a stall past the lease woke
it to find the answer adopted). A write sent again after Redis answered too late lands once;
a first write, or one that finds Redis has lost the answer, carries the whole answer and its
meta (over a log that has its start: the rest).

A reader that comes to a process that does not hold the answer gets a *shadow* of it: the log
read from the start and followed (``XREAD``), each event encoded again by a writer of the same
id and clock — which gives the same bytes and, above all, the same numbering and open blocks.
While the lease is alive the shadow only follows. When it has lapsed and the answer runs, its
producer is gone (killed, out of memory, a deploy) or parked it: the shadow's process takes
the lease (``_TAKE``) and *adopts* the answer — it continues it upstream from its text
(``continue_from``) under the original deadline, writing on to the same log; a stop asked
for ends it instead. A take Redis runs later than its caller waited takes nothing. When an
answer ends its keys expire after ``keep`` seconds; while it runs, after its deadline and
``keep``. Redis away: a process that held the lease serves its readers alone, and writes on
once Redis is back; for ``SETTLE`` seconds after Redis returns or turns out to have lost its
data (``answers:since`` gone), nobody adopts, and an answer not found may exist (a 503).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Literal

import anyio

import streamres
from streamres.proxy.faces.inbound import Call
from streamres.proxy.faces.outbound import Writer

__all__ = ["FLUSH", "LEASE_MS", "SETTLE", "SharedAnswers", "Taken", "event_from", "event_json"]

#: Seconds an answer's events after its first wait to be written together (the first goes at
#: once: the time to a first event is what a person notices).
FLUSH = 0.02
#: A producing process's lease on an answer; renewed every third of it.
LEASE_MS = 3000
#: Entries read at once from an answer's log.
_BATCH = 500
#: Seconds after Redis comes back (or turns out to have lost its data) in which the processes
#: holding answers write them again: nobody adopts an answer then, and an answer not found may
#: be one not yet written again (a 503, not a 404).
SETTLE = 2 * LEASE_MS / 1000


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


_WRITE = """
-- KEYS: the answer's meta, log and lease
-- ARGV: 1 this process, 2 lease ms, 3 the log's ttl while it runs (s), 4 keep (s), 5 at (the
--   events logged before these), 6 their count, 7 how it ended ('' running), 8 events (JSON),
--   9 their bytes, 10 its error (JSON, or ''), 11 the meta's fields (JSON, or ''), 12 the
--   meta's ttl (s)
-- -> {0, stop}: written, or a resend Redis had (stop: another process asked for a stop);
--    {-1, why}: another process owns the answer now (1: it holds the lease; 2: it wrote
--    last; 3: the log is past these events); {-2, 0}: Redis has no such answer (lost with its
--    data): write it again whole, with its meta; {-3, n}: a whole answer, of which the log
--    has the first n events (written before Redis went away): write the rest
local meta, log, lease = KEYS[1], KEYS[2], KEYS[3]
local me, at, count = ARGV[1], tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('EXISTS', meta) == 0 then
  if ARGV[11] == '' or at ~= 0 then return {-2, 0} end
  for k, v in pairs(cjson.decode(ARGV[11])) do redis.call('HSET', meta, k, v) end
  redis.call('HSET', meta, 'n', 0, 'by', me)
  redis.call('EXPIRE', meta, ARGV[12])
  redis.call('SET', lease, me, 'PX', ARGV[2])
end
local holder = redis.call('GET', lease)
if holder and holder ~= me then return {-1, 1} end
if (not holder) and redis.call('HGET', meta, 'by') ~= me then return {-1, 2} end
local n = tonumber(redis.call('HGET', meta, 'n') or '0')
if at > n then return {-1, 3} end
if ARGV[11] ~= '' and n > 0 and n < count then return {-3, n} end
if at == n and (count > 0 or ARGV[9] ~= '' or ARGV[7] ~= '') then
  local entry = {'e', ARGV[8], 'b', ARGV[9], 'at', ARGV[5], 'w', me}
  if ARGV[7] ~= '' then
    table.insert(entry, 'end'); table.insert(entry, ARGV[7])
    if ARGV[10] ~= '' then table.insert(entry, 'error'); table.insert(entry, ARGV[10]) end
  end
  redis.call('XADD', log, '*', unpack(entry))
  redis.call('HSET', meta, 'n', n + count)
end
if ARGV[7] == '' then
  redis.call('SET', lease, me, 'PX', ARGV[2])
  redis.call('EXPIRE', log, ARGV[3])
else
  redis.call('HSET', meta, 'status', ARGV[7])
  redis.call('EXPIRE', meta, ARGV[4])
  redis.call('EXPIRE', log, ARGV[4])
  redis.call('DEL', lease)
end
return {0, redis.call('HGET', meta, 'stop') and 1 or 0}
"""

_TAKE = """
-- KEYS: the answer's meta and lease; ARGV: this process, lease ms, when it was sent (ms on
--   the caller's clock), how late it may run (ms)
-- -> {taken (1 or 0), events logged (-1: no such answer), stop asked (1 or 0)}: taken when
--    the answer runs and no other process holds it (this one writes it from here on). A take
--    that runs later than its caller waited (Redis paused, then running what it held back)
--    takes nothing: its caller took it for failed, and the answer's writer may be back.
local meta, lease, me = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - tonumber(ARGV[3]) > tonumber(ARGV[4]) then return {0, -2, 0} end
if redis.call('EXISTS', meta) == 0 then return {0, -1, 0} end
local n = tonumber(redis.call('HGET', meta, 'n') or '0')
local stop = redis.call('HGET', meta, 'stop') and 1 or 0
if redis.call('HGET', meta, 'status') ~= 'in_progress' then return {0, n, stop} end
local holder = redis.call('GET', lease)
if holder and holder ~= me then return {0, n, stop} end
redis.call('SET', lease, me, 'PX', ARGV[2])
redis.call('HSET', meta, 'by', me)
return {1, n, stop}
"""

_SINCE = """
-- KEYS: when the answers in Redis began to be kept (ms on Redis's clock; '0': since the
--   fleet started); ARGV: settle ms
-- -> {lately, since}: lately 1 when Redis lost its data under settle ms ago (the key was
--    missing: written now), else 0; since: the key's value (it changes when data is lost)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = redis.call('GET', KEYS[1])
if not since then
  redis.call('SET', KEYS[1], now)
  since = tostring(now)
end
return {(now - tonumber(since) < tonumber(ARGV[1])) and 1 or 0, since}
"""

_RELEASE = """
-- KEYS: the answer's lease; ARGV: this process -> 1 given up, 0 not this process's
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_STOP = """
-- KEYS: the answer's meta -> 1 asked, 0 no such answer
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'stop', '1')
return 1
"""


@dataclasses.dataclass(frozen=True)
class Taken:
    """What taking an answer's lease found."""

    taken: bool
    #: Events in the answer's log (-1: Redis has no such answer).
    logged: int
    #: A stop was asked for: the answer ends there, it is never continued.
    stop: bool


class SharedAnswers:
    """An answer's keys in Redis, through the client's shared state (``Client(shared=…)``).

    Every write is fenced: it lands only while this process owns the answer (holds its lease,
    or was the last to write it and nobody took the lease since) and only at the log's end —
    so a process that stalled past its lease and wakes finds it lost and stands down."""

    def __init__(self, shared: Any, keep: float) -> None:
        self.shared = shared
        self.keep = keep
        self.prefix = f"{shared.name}:answer:"  # each answer its own tag: spread over a cluster
        self._since = f"{shared.prefix}:answers:since"
        #: Writes and reads made, by kind (what an answer costs in Redis).
        self.calls: dict[str, int] = {}
        #: Why the last write found the answer another's: its "lease", its last "writer",
        #: or its "log" past this copy.
        self.lost_why = ""
        for name, source in (
            ("answer_write", _WRITE),
            ("answer_take", _TAKE),
            ("answer_release", _RELEASE),
            ("answer_stop", _STOP),
            ("answer_since", _SINCE),
        ):
            shared.register(name, source)

    def _keys(self, answer_id: str) -> tuple[str, str, str]:
        base = f"{self.prefix}{{{answer_id}}}"
        return f"{base}:meta", f"{base}:log", f"{base}:lease"

    async def _do(self, kind: str, command: Any) -> Any:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        shared = self.shared
        if not shared.connected:
            return None
        return await shared._bounded(lambda: command(shared._redis))

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        self.calls[name] = self.calls.get(name, 0) + 1
        return await self.shared.run(name, keys, args)

    async def started(self) -> None:
        """The fleet's answers are kept from now (unless a process said so before)."""
        await self._do("since", lambda redis: redis.set(self._since, "0", condition=_nx()))

    async def unsure(self) -> bool:
        """May an answer Redis does not have exist all the same? True while shared state is
        away or settling, or when Redis lost its data lately (restarted without persistence,
        flushed) — the processes holding answers write them again within ``SETTLE``."""
        if self.settling():
            return True
        got = await self.since()
        return got is None or got[0]

    async def since(self) -> tuple[bool, str] | None:
        """Did Redis lose its data lately, and the mark that changes each time it does
        (``None``: Redis away)."""
        got = await self._script("answer_since", [self._since], [int(SETTLE * 1000)])
        return None if got is None else (bool(int(got[0])), str(got[1]))

    def settling(self) -> bool:
        """Redis is away, or came back (or lost its data) so lately that the processes
        holding answers may not have written them again yet: an answer not found may exist."""
        shared = self.shared
        return not shared.connected or (anyio.current_time() - shared.rejoined_at < SETTLE)

    # -- the producing process ------------------------------------------------------------

    def _meta_fields(self, held: Any, deadline_wall: float) -> dict[str, str]:
        w: Writer = held.writer
        return {
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

    async def write(
        self,
        held: Any,
        entries: list[tuple[dict[str, Any] | None, bytes]],
        end: str | None,
        *,
        whole: bool = False,
    ) -> Literal["written", "stop", "lost", "gone"] | None:
        """Append ``entries`` (events and their encoded bytes) in one log entry, renew the
        lease; ``end``: the answer ended so (its keys then expire after ``keep``);
        ``whole``: the entries are the whole answer, written with its meta when Redis has
        none (the first write, or Redis lost it).

        ``"stop"``: written, and another process asked for a stop; ``"lost"``: another
        process owns the answer now (nothing written); ``"gone"``: Redis has no such answer
        (write it whole); ``None``: Redis did not answer (the same write may be sent again:
        it lands once)."""
        meta, logkey, lease = self._keys(held.id)
        events = [e for e, _ in entries if e is not None]
        data = b"".join(b for _, b in entries).decode("utf-8")
        at = 0 if whole else held.logged
        left = max(1.0, held.deadline_left())
        fields = ""
        if whole:
            fields = json.dumps(self._meta_fields(held, time.time() + left))
        error = ""
        if end is not None and held.log.error is not None:
            error = json.dumps(_error_json(held.log.error))
        keep = int(self.keep) + 1
        args: list[Any] = [
            self.shared.id,
            LEASE_MS,
            keep + int(left) + 1,
            keep,
            at,
            len(events),
            end or "",
            json.dumps(events, ensure_ascii=False),
            data,
            error,
            fields,
            int(left + self.keep) + 1,
        ]
        got = await self._script("answer_write", [meta, logkey, lease], args)
        if got is None:
            return None
        verdict, stop = int(got[0]), int(got[1])
        if verdict == -1:
            self.lost_why = ("", "lease", "writer", "log")[stop]
            return "lost"
        if verdict == -2:
            return "gone"
        if verdict == -3:  # Redis has its start: the rest, after it (their bytes unchecked)
            held.logged = stop
            rest: list[tuple[dict[str, Any] | None, bytes]] = [
                (event_json(ev), b"") for ev in held.log.events[stop:]
            ]
            return await self.write(held, rest, end)
        held.logged = at + len(events)
        return "stop" if stop and end is None else "written"

    async def release(self, answer_id: str) -> None:
        """Give the answer's lease up, if still this process's (it is parked: any process
        may take it on)."""
        _, _, lease = self._keys(answer_id)
        await self._script("answer_release", [lease], [self.shared.id])

    async def ask_stop(self, answer_id: str) -> bool | None:
        """Mark the answer stopped where every process reads it: whoever produces it (or would
        take it on) ends it instead. False: no such answer; ``None``: Redis away."""
        meta, _, _ = self._keys(answer_id)
        got = await self._script("answer_stop", [meta], [])
        return None if got is None else bool(got)

    async def forget(self, answer_id: str) -> None:
        """Delete an answer's keys (a deleted response: no process finds it again)."""
        keys = list(self._keys(answer_id))
        await self._do("forget", lambda redis: redis.delete(keys))

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

    async def take(self, answer_id: str) -> Taken | None:
        """Take the answer's lease when it runs and no other process holds it (its producer
        is gone, or parked it); ``None``: Redis away."""
        meta, _, lease = self._keys(answer_id)
        # Void if it runs later than this process waits for it (plus clocks a second apart).
        late = int(self.shared.timeout * 2000) + 1000
        args = [self.shared.id, LEASE_MS, int(time.time() * 1000), late]
        got = await self._script("answer_take", [meta, lease], args)
        if got is None or int(got[1]) == -2:
            return None
        return Taken(bool(int(got[0])), int(got[1]), bool(int(got[2])))


def _nx() -> Any:
    from coredis import PureToken

    return PureToken.NX


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
