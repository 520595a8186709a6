"""Concurrency slots shared by every process: leases in Redis sorted sets, waiting lines by
priority, and the fleet's epoch that finds a Redis that lost them. I/O shell."""

from __future__ import annotations

import json
import uuid

import anyio

from streamres._core.lanes import BACKGROUND, NORMAL
from streamres._core.redact import redact_url
from streamres._fleet.routes import Route
from streamres._shell.limits import account_of
from streamres._shell.log import log
from streamres._shell.shared.connection import Connection
from streamres._shell.shared.scripts import script

__all__ = ["EPOCH_GRACE", "EXTEND_BATCH", "LEASE", "SCRIPTS", "WAITER", "Leases"]

#: Seconds a slot's lease lasts unless extended (a crashed process frees its slots after this);
#: running answers' leases are extended every third of it, all of a process's in one call per
#: set of keys (``EXTEND_BATCH`` at a time).
LEASE = 10.0
EXTEND_BATCH = 500

#: ms after a lost-data epoch during which no slot is taken (every process checks each second).
EPOCH_GRACE = 1500

#: ms a waiter's place in a shared line lasts unless renewed (waiters renew it every half
#: second, and at every release).
WAITER = 3000

#: The scripts (``scripts/<name>.lua``, each with what its KEYS and ARGV are).
SCRIPTS = {
    "acquire": script("acquire", EPOCH_GRACE=EPOCH_GRACE, BACKGROUND=BACKGROUND),
    "extend": script("extend"),
    "reepoch": script("reepoch"),
    "release": script("release"),
    "leave": script("leave"),
}


class Leases(Connection):
    """Slots under the routes' and accounts' limits, counted across the processes."""

    def _keys(self, route: Route) -> tuple[list[str], list[int]]:
        keys, limits = [], []
        if self._limits_of.get(route.key):
            keys.append(f"{self.prefix}:slots:route:{route.key}")
            limits.append(int(self._limits_of[route.key] or 0))
        account = account_of(route)
        if account in self._account_limits:
            keys.append(f"{self.prefix}:slots:account:{account}")
            limits.append(self._account_limits[account])
        return keys, limits

    async def acquire(self, route: Route, seconds: float, priority: int = NORMAL) -> bool:
        """The fleet's lease in Redis — counted in this process's own limits too, so that
        when Redis goes away this process goes on with what it already holds counted (it never
        holds more than the limit on its own)."""
        keys, limits = self._keys(route)
        held = self._held.setdefault(route.key, [])
        if not keys:
            held.append(None)
            return True
        lease = uuid.uuid4().hex
        queued = False
        try:
            with anyio.move_on_after(seconds):
                while True:
                    if not self.connected:  # this process's own limits, until Redis is back
                        ok = await super().acquire(route, seconds, priority)
                        if ok and self.connected:
                            # Redis came back while this waited: a slot only this process
                            # knows of would pass the fleet's limit; wait in its line instead.
                            super().release(route)
                            continue
                        if ok:
                            self.local_fallbacks += 1
                            held.append(None)
                        return ok
                    waiter, sent = self._released, self._epoch
                    reply = await self._call(
                        "acquire",
                        [self._epoch_key, *keys],
                        [lease, int(LEASE * 1000), priority, WAITER, sent, *limits],
                    )
                    if reply is None:  # Redis just went away: the local limits take over
                        # The call may still run when Redis answers again (a pause): a lease
                        # this process never knew of, to take back at the rejoin.
                        self._doubtful.append((lease, keys))
                        lease = uuid.uuid4().hex
                        continue
                    got, epoch = int(reply[0]), str(reply[1])
                    if got < 0:  # Redis lost the leases: this process's go back first
                        await self._recover(sent)
                        continue
                    self._epoch = epoch
                    if got == 1:
                        self._leases[lease] = keys
                        held.append(lease)
                        self.take(route)
                        queued = False
                        return True
                    queued = True
                    with anyio.move_on_after(0.5):  # a release elsewhere wakes this at once
                        await waiter.wait()
            return False
        finally:
            if queued:  # gave up waiting: out of the line, and the next waiter told
                self._post("leave", keys, [lease, self._channel, json.dumps({"kind": "slot"})])

    def release(self, route: Route) -> None:
        held = self._held.get(route.key)
        if not self._keys(route)[0]:  # no limit on it: nothing was taken
            if held:
                held.pop()
            return
        # The slots of one route are alike: any one of them goes back (a lease, or a slot
        # taken while Redis was away).
        lease = held.pop() if held else None
        super().release(route)
        if lease is None:
            return
        keys = self._leases.pop(lease, [])
        self._post("release", keys, [lease, self._channel, json.dumps({"kind": "slot"})])

    async def _reassert(self) -> bool:
        """Redis is back (perhaps empty): every slot this process holds is put back in it —
        the leases it may have lost and the slots taken while it was away — so the fleet's
        count is true again and new requests wait until it is under the limit."""
        by_key = {r.key: r for r in self.fleet.routes}
        for route_key, held in self._held.items():  # no await here: nothing moves meanwhile
            route = by_key.get(route_key)
            keys = self._keys(route)[0] if route is not None else []
            for i, lease in enumerate(held):
                if lease is None and keys:
                    held[i] = fresh = uuid.uuid4().hex
                    self._leases[fresh] = keys
        return await self._extend(rejoining=True)

    async def _put_back(self) -> bool:
        """Every slot held back in Redis (:meth:`_reassert`), then the fleet's epoch taken
        (the one another process wrote, or a new one that holds new slots back for
        ``EPOCH_GRACE``). False if Redis went away meanwhile."""
        if not await self._reassert():
            return False
        epoch = await self._call("reepoch", [self._epoch_key], [], rejoining=True)
        if epoch is None:
            return False
        self._epoch = str(epoch)
        return True

    async def _recover(self, seen: str) -> None:
        """Redis is there but lost its data (FLUSHALL, a restart without persistence, an
        eviction): put this process's leases back, then take the fleet's new epoch — written
        by whichever process came first, which holds new slots back for ``EPOCH_GRACE``
        while the others put theirs back (each checks the epoch every second)."""
        async with self._recovering:
            if self._epoch != seen:
                return  # another of this process's tasks recovered meanwhile
            self.rejoined_at = anyio.current_time()
            if await self._put_back():  # else Redis went away: the rejoin puts them back
                log.warning(
                    "streamres.shared_data_lost",
                    url=redact_url(self.url),
                    leases=len(self._leases),
                    action="put back this process's leases",
                )

    async def _check_epoch(self) -> None:
        """The once-a-second look at the fleet's epoch: gone or new means lost leases."""
        if not self._epoch:
            return
        got = await self.get(self._epoch_key)
        if self.connected and got != self._epoch:
            await self._recover(self._epoch)

    async def _release_all(self) -> None:
        for lease, keys in list(self._leases.items()):
            await self._call("release", keys, [lease, self._channel, "{}"])
        self._leases.clear()

    async def _extend(self, *, rejoining: bool = False) -> bool:
        """Every held lease extended (or put back), a round trip per set of keys and batch;
        False if Redis did not answer one."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for lease, its_keys in self._leases.items():
            groups.setdefault(tuple(its_keys), []).append(lease)
        for keys, leases in groups.items():
            for at in range(0, len(leases), EXTEND_BATCH):
                # Only those still held (not released while the others were sent).
                batch = [x for x in leases[at : at + EXTEND_BATCH] if x in self._leases]
                if batch:
                    args = [int(LEASE * 1000), *batch]
                    if await self._call("extend", list(keys), args, rejoining=rejoining) is None:
                        return False  # gone again: the next check tries once more
        return True
