"""A client key's limits across every proxy process sharing one Redis (``--redis``).

Without Redis each process counts a key's answers in flight and its requests a minute on its
own, so N workers would let a key have N times its limits. With Redis, one script decides for
the fleet, on Redis's clock:

- **in flight**: a sorted set of the key's answers, each scored with the end of its lease. A
  lease lasts as long as an answer can (the deadline, a slow reader's write timeout and a
  margin), so an answer whose process died stops counting by itself; an answer that ends gives
  its lease back at once.
- **requests a minute**: a sorted set of the key's requests in the last 60 s (a sliding log,
  exact, at most the limit's worth of entries).

While Redis does not answer, each process falls back to its own counts (``_ClientState``), as
the rest of the shared state does.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio

from streamres._shell.apps import SharedState

__all__ = ["FleetQuota"]

_ADMIT = """
-- KEYS[1]: the key's answers in flight (member: request id, score: lease end in ms)
-- KEYS[2]: the key's requests in the last minute (member: request id, score: ms)
-- ARGV: request id, max in flight (0: none), requests a minute (0: none), lease ms
-- -> {0, 0} admitted; {1, wait ms} over the in-flight limit; {2, wait ms} over the rate
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local flight, rpm, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if flight > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= flight then return {1, 1000} end
end
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 60000)
  if redis.call('ZCARD', KEYS[2]) >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {2, math.max(1, tonumber(oldest[2]) + 60000 - now)}
  end
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], 61000)
end
if flight > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {0, 0}
"""

_LEAVE = """
-- KEYS[1]: the key's answers in flight; ARGV[1]: the request id whose answer ended
redis.call('ZREM', KEYS[1], ARGV[1])
return 0
"""


class FleetQuota:
    """Client keys' limits in Redis, through a running :class:`SharedState`."""

    def __init__(self, state: SharedState, lease: float) -> None:
        self.state = state
        self.lease_ms = max(1000, round(lease * 1000))
        state.register("client_admit", _ADMIT)
        state.register("client_leave", _LEAVE)

    def _keys(self, name: str) -> list[str]:
        base = f"{self.state.prefix}:client:{name}"
        return [f"{base}:flight", f"{base}:minute"]

    async def admit(
        self, name: str, max_in_flight: int | None, per_minute: int | None
    ) -> tuple[str, float] | str | None:
        """A lease id when admitted; ``("flight" | "rate", wait seconds)`` when refused;
        ``None`` when Redis does not answer (the caller counts on its own)."""
        lease = uuid.uuid4().hex
        args: list[Any] = [lease, max_in_flight or 0, per_minute or 0, self.lease_ms]
        got = await self.state.run("client_admit", self._keys(name), args)
        if got is None:
            return None
        verdict, wait = int(got[0]), float(got[1]) / 1000
        if verdict == 0:
            return lease
        return ("flight" if verdict == 1 else "rate", wait)

    async def leave(self, name: str, lease: str) -> None:
        """The answer ended: its lease goes back (bounded; an unanswered call lets it lapse)."""
        with anyio.CancelScope(shield=True):
            await self.state.run("client_leave", self._keys(name)[:1], [lease])
