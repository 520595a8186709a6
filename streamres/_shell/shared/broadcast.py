"""Breaker openings, Retry-After cool-downs and one half-open probe, told to every process
through Redis pub/sub and kept in a hash for the processes that start later. I/O shell."""

from __future__ import annotations

import json
import time

import anyio

from streamres._fleet.routes import Route
from streamres._shell.shared.connection import Connection
from streamres._shell.shared.scripts import script

__all__ = ["PROBE_CLAIM", "SCRIPTS", "Broadcast"]

#: How long a probe's claim lasts if its outcome never comes (a crashed process).
PROBE_CLAIM = 60.0

#: The scripts (``scripts/<name>.lua``, each with what its KEYS and ARGV are).
SCRIPTS = {"share": script("share"), "claim": script("claim"), "unclaim": script("unclaim")}


class Broadcast(Connection):
    """What one process finds about a model, applied by every other."""

    async def claim_probe(self, route: Route) -> float | None:
        """Claim a half-open model's one probe for every process: ``None`` when this process
        may send it (claimed, or Redis is away), else seconds until the other claim lapses."""
        got = await self._call(
            "claim",
            [f"{self.prefix}:probe:{route.key}", f"{self.prefix}:state"],
            [self.id, int(PROBE_CLAIM * 1000), f"open:{route.key}"],
        )
        if got is None or int(got) < 0:
            return None
        return max(0.05, int(got) / 1000)

    def _share(self, i: int, kind: str, until: float) -> None:
        """Fleet hook: this process found model ``i`` refusing until ``until`` (its clock), or
        recovered (``closed``): tell the others, and free its probe claim."""
        wall = time.time() + (until - anyio.current_time())
        route = self.fleet.routes[i].key
        message = json.dumps({"kind": kind, "route": route, "until": wall, "from": self.id})
        field = f"{'open' if kind == 'closed' else kind}:{route}"
        mode = "clear" if kind == "closed" else "max"
        self._post("share", [f"{self.prefix}:state"], [field, wall, self._channel, message, mode])
        if kind in ("open", "closed"):
            self._post("unclaim", [f"{self.prefix}:probe:{route}"], [self.id])

    def _apply(self, kind: str, route: str, wall: float) -> None:
        i = self.fleet.by_key.get(route)
        if i is None or (kind != "closed" and wall <= time.time()):
            return
        self.fleet.apply(i, kind, anyio.current_time() + (wall - time.time()))
        self.notify()  # streams waiting on a model's state look again

    async def _load_state(self) -> None:
        """What other processes found before this one (or while it was cut off)."""
        if not self.connected:
            return
        try:
            with anyio.fail_after(self.timeout * 2):
                state = await self._redis.hgetall(f"{self.prefix}:state")
        except Exception as exc:
            self._lost(exc)
            return
        for field, value in state.items():
            kind, _, route = field.partition(":")
            self._apply(kind, route, float(value))
        weights = await self.hgetall(f"{self.prefix}:weights")
        for route, value in (weights or {}).items():
            if route in self.fleet.by_key:
                self.fleet.set_weight(self.fleet.by_key[route], float(value))

    async def _listen(self) -> None:
        """Apply what other processes publish; wake slot waiters on a release. Reconnects
        when Redis comes back."""
        while True:
            try:
                async with self._subscriber.pubsub(channels=[self._channel]) as pubsub:
                    async for message in pubsub:
                        if message.get("type") == "subscribe":  # the server confirmed it
                            self._subscribed.set()
                        data = message.get("data")
                        if message.get("type") != "message" or not isinstance(data, str):
                            continue
                        try:
                            event = json.loads(data or "{}")
                        except ValueError:
                            continue  # not ours (another version's, or damaged): not news
                        if not isinstance(event, dict):
                            continue
                        handler = self.handlers.get(event.get("kind", ""))
                        if handler is not None:
                            handler(event)
                        elif event.get("kind") == "slot":
                            self._released.set()
                            self._released = anyio.Event()
                        elif event.get("from") != self.id and "route" in event:
                            self._apply(event["kind"], event["route"], float(event["until"]))
            except Exception as exc:
                self._lost(exc)
            await anyio.sleep(1.0)
