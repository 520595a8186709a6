"""Many processes, one view of the models: shared state on Redis. I/O shell.

With ``Client(..., shared="redis://host:6379/0")``, every process that uses the same Redis and
key prefix (``shared_prefix``, default ``"streamres"``: one prefix per fleet) shares:

- **concurrency slots** — ``Route.max_in_flight`` and ``account_limits`` become totals across
  the processes. A slot is a lease in a Redis sorted set (member: a lease id, score: when it
  expires, by Redis's own clock), taken by one Lua script that drops expired leases and checks
  every limit the request is under at once — never a read-modify-write race. Leases held by a
  long answer are extended while it runs; a crashed process's leases expire (10 s), freeing its
  slots. A release is published, so waiting processes try again at once. Waiters stand in a
  line per set, ranked by priority lane and then arrival (``_core/lanes``): a free slot goes
  to the first of them, whichever process it is in;
- **breaker openings and Retry-After cool-downs** — when a model's breaker opens (or a server
  says when to come back), the process publishes until when the model is refused; every other
  process applies it as it arrives (one Redis round trip later), and a process that starts
  later reads the current state;
- **one half-open probe across the processes** — the process about to send a half-open model's
  probe claims it first (``SET NX`` with a 60 s expiry); the others wait for its outcome, which
  it publishes (the model recovered, or is refused again) and which frees the claim.

- **the retry budget** — one token bucket for every process (a Lua script per deposit, refund
  and reservation), so retries across the fleet stay within it rather than within it per
  process.

- **weights** — a failure or a success on a degraded model moves the fleet's weight (one
  script, published; every process applies the result), so load moves away from a failing
  model in every process at once. A success on a healthy model costs nothing;
- **metrics** — every second each process sends its counters and recent samples and takes
  back everyone's (one script): ``Client.fleet_metrics()`` sums them; a process silent for
  three seconds drops out.

The answer cache, when the client has one, is shared too (``shared.cache``).

A stream never waits on Redis longer than ``timeout`` (0.25 s). When Redis is slow or down,
streams go on with this process's own limits and view — which count every lease it holds, so
it keeps to the limit with what it already has: a warning is logged once, every model's health
says so, and ``Client.shared_status()`` counts the slots taken locally; a background check
rejoins when Redis takes writes again (a Redis out of memory still answers pings), after
putting back every slot this process holds (leases lost by a Redis that restarted empty, slots
taken while it was away) and taking back the leases Redis may hold that no answer uses
(releases it missed, calls it ran after their replies were given up: a paused Redis). While
Redis is away each process keeps its share of each limit (the limit over the processes it last
saw). A Redis that loses its data without going away (FLUSHALL, an eviction) is found by the
fleet's *epoch* — a key each process checks every second and every slot request carries: gone
or new, the process puts its leases back, and for 1.5 s no new slot is taken, so every process
has put its own back first. The first calls at start (connecting, loading the scripts) have
their own patience (``STARTUP``, 5 s): a machine busy starting many processes does not start
them on local limits. Works with Redis and Valkey through coredis (by the author of the
``limits`` library), built on anyio: asyncio and trio alike.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from streamres._core.lanes import NORMAL
from streamres._core.redact import redact_url
from streamres._fleet.balance import RetryBudget
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route
from streamres._shell.limits import Limits, Slots, account_of
from streamres._shell.log import log
from streamres._shell.shared.scripts import script

__all__ = ["SharedState", "SharedStatus"]

#: Seconds a slot's lease lasts unless extended (a crashed process frees its slots after this);
#: running answers' leases are extended every third of it, all of a process's in one call per
#: set of keys (``EXTEND_BATCH`` at a time).
LEASE = 10.0
EXTEND_BATCH = 500

#: Seconds the first calls to Redis (connecting, loading the scripts) may take at start.
STARTUP = 5.0

#: ms after a lost-data epoch during which no slot is taken (every process checks each second).
EPOCH_GRACE = 1500

#: A slot on every key, or a place in their waiting lines. KEYS[1]: the epoch (below), then
#: the slot sets; ARGV[1] the lease id, [2] its ms, [3] the priority, [4] ms a waiter's place
#: lasts unless renewed, [5] the epoch this process knows ('' if none yet), [6...] the limits.
#: Each set ``K`` has a line ``K:line`` (score: minus the priority times 1e13, plus the ms of
#: arrival: higher lanes first, then first come) and ``K:alive`` (score: when the waiter's
#: place lapses: a crashed process's waiters drop out). A slot is taken only when there are
#: more free slots than waiters ahead; else the waiter keeps (or takes) its place.
#:
#: The epoch is a key written once for a fleet's Redis: ``f<ms>`` when the first process
#: found none, ``r<ms>`` when a process found it gone (FLUSHALL, a restart without data, an
#: eviction) and put its leases back. Returns ``{1|0|-1, epoch}``: taken, wait, or *Redis
#: lost its data* — this process's leases are not in it: put them back first. For
#: ``EPOCH_GRACE`` ms after an ``r`` epoch nothing is taken, so that every process (each
#: checks the epoch every second) has put its leases back before new ones are counted.
_ACQUIRE = script("acquire", EPOCH_GRACE=EPOCH_GRACE)

#: The epoch after this process put its leases back into a Redis that lost them: the one
#: another process already wrote, or a new ``r<ms>`` (KEYS[1] the epoch).
_REEPOCH = script("reepoch")

#: A waiter that gave up (its deadline, or cancelled) leaves the lines; the next one may be
#: able to go now, so it is told.
_LEAVE = script("leave")

#: ms a waiter's place in a shared line lasts unless renewed (waiters renew it every half
#: second, and at every release).
WAITER = 3000

#: Leases extended — re-added whatever the count if Redis lost them (FLUSHALL, a pause past
#: their expiry, a restart without data), so they are back at the next extension or at the
#: rejoin: ARGV[1] their ms, [2...] the ids.
_EXTEND = script("extend")

_RELEASE = script("release")

#: Keep the later "refused until" of a model (or, ARGV[5] = "clear", forget it: the model
#: recovered), and tell everyone.
_SHARE = script("share")

#: One half-open probe across the processes: -1 if this one claimed it, else the ms left on
#: the other's claim — or on the model's reopened circuit (KEYS[2] field ARGV[3], a wall-clock
#: time): the probe that reopened it frees its claim just after, and another process must not
#: take the claim before that news reaches it.
_CLAIM = script("claim")

_UNCLAIM = script("unclaim")

#: How long a probe's claim lasts if its outcome never comes (a crashed process).
PROBE_CLAIM = 60.0

#: The retry budget as one token bucket for every process (``_balance.RetryBudget``'s rules,
#: the cap growing with the fleet's recent first attempts, Redis's clock): ARGV[1] "deposit"
#: (ARGV[7] first attempts), "refund", or "reserve" (returns the seconds until the reserved
#: token is there; -1: never); ARGV[2..6]: ratio, floor, cap, initial balance, window.
_BUDGET = script("budget")


#: A model's weight for the fleet: ARGV[2] "failure" (x penalty) or "success" (a quarter of the
#: way back), from ARGV[3] base, [4] penalty, [5] restore, [6] floor; published on ARGV[7].
_WEIGHT = script("weight")

#: This process's metrics for the fleet's view, and everyone's back: KEYS[1] the set of
#: processes (score: when their figures expire); ARGV: id, figures (JSON), ms they last, key
#: prefix of the figures.
_METRICS = script("metrics")

#: Seconds between two metrics syncs; a process silent for three is no longer counted.
METRICS_EVERY = 1.0


class SharedBudget(RetryBudget):
    """The client's retry budget, with deposits and refunds also sent to the shared one (the
    local balance is what this process falls back on when Redis is away)."""

    def __init__(self, local: RetryBudget, post: Callable[[str], None]) -> None:
        super().__init__(
            local.ratio,
            local.floor,
            local.cap,
            local.balance,
            local.updated,
            local.window,
            local.recent,
        )
        self._post = post
        #: The balance a fleet's shared bucket starts with (the first process creates it).
        self.initial = local.balance

    def deposit(self, now: float, attempts: int = 1) -> None:
        super().deposit(now, attempts)
        for _ in range(attempts):
            self._post("deposit")

    def refund(self) -> None:
        super().refund()
        self._post("refund")


@dataclass(frozen=True)
class SharedStatus:
    """Where shared state lives, and whether this process can reach it."""

    url: str
    connected: bool
    #: Slots this process took on its own while Redis was unreachable.
    local_fallbacks: int


class SharedState(Limits):
    """Concurrency slots, breaker openings and cool-downs shared through Redis (see module)."""

    def __init__(
        self,
        url: str,
        routes: Sequence[Route],
        account_limits: Mapping[str, int],
        fleet: Fleet,
        *,
        prefix: str = "streamres",
        timeout: float = 0.25,
    ) -> None:
        super().__init__(routes, account_limits)
        self.url = url
        self.fleet = fleet
        self.prefix = prefix
        self.timeout = timeout
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.connected = True
        self.local_fallbacks = 0
        self._limits_of = {r.key: r.max_in_flight for r in routes}
        self._account_limits = dict(account_limits)
        self._held: dict[str, list[str | None]] = {}  # route -> lease ids (None: local)
        self._leases: dict[str, list[str]] = {}  # lease id -> its keys
        self._released = anyio.Event()
        #: The fleet's epoch as this process last saw it ('' before the first slot), and the
        #: one recovery at a time when Redis turns out to have lost the leases.
        self._epoch = ""
        self._epoch_key = f"{prefix}:epoch"
        self._recovering = anyio.Lock()
        #: Leases Redis may hold that no answer here uses — asked for by calls that got no
        #: answer, released while Redis was away — taken back at the rejoin.
        self._doubtful: collections.deque[tuple[str, list[str]]] = collections.deque(
            maxlen=65_536  # older ones have expired in Redis by the rejoin anyway
        )
        self._subscribed = anyio.Event()
        self._deposits = 0
        self._outbox_send, self._outbox = anyio.create_memory_object_stream[
            tuple[str, list[str], list[Any]]
        ](10_000)
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        #: Round trips made, by script (or command) name.
        self.calls: collections.Counter[str] = collections.Counter()
        #: The other processes' figures at the last sync (``Client.fleet_metrics``).
        self.others: list[dict[str, dict[str, object]]] = []
        #: The local limits cut to this process's share while Redis is away, and by how much.
        self._shrunk: list[tuple[Slots, int]] = []
        self._channel = f"{prefix}:events"
        #: What to do with other kinds of news (by its ``kind``), for state kept elsewhere
        #: (the shared answer cache).
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}

    # -- lifecycle -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SharedState]:
        import coredis
        from coredis.retry import NoRetryPolicy

        # No retries inside the client: a call that fails is this module's to handle (local
        # mode), within its own bound.
        self._redis = coredis.Redis.from_url(
            self.url,
            stream_timeout=self.timeout,
            # A connection's handshake may take the start's patience; a stream's call is
            # bounded all the same (``_bounded``).
            connect_timeout=STARTUP,
            retry_policy=NoRetryPolicy(),
            decode_responses=True,
        )
        # Pub/sub waits for messages indefinitely: its own connection, without a read timeout.
        self._subscriber = coredis.Redis.from_url(
            self.url,
            connect_timeout=STARTUP,
            retry_policy=NoRetryPolicy(),
            decode_responses=True,
        )
        sources = dict(
            (
                ("acquire", _ACQUIRE),
                ("extend", _EXTEND),
                ("reepoch", _REEPOCH),
                ("release", _RELEASE),
                ("leave", _LEAVE),
                ("share", _SHARE),
                ("claim", _CLAIM),
                ("unclaim", _UNCLAIM),
                ("budget", _BUDGET),
                ("weight", _WEIGHT),
                ("metrics", _METRICS),
            )
        )
        self._scripts.update(
            (name, self._redis.register_script(src)) for name, src in sources.items()
        )
        self.fleet.on_change = self._share
        self.fleet.on_weight = self._weigh
        self.handlers.setdefault("weight", self._weighed)
        local_budget = self.fleet.budget
        self.fleet.budget = SharedBudget(local_budget, self._budget_post)
        try:
            async with self._redis, self._subscriber, anyio.create_task_group() as tg:
                await self._warm_up(sources)
                tg.start_soon(self._listen)
                tg.start_soon(self._send_outbox)
                tg.start_soon(self._keep_leases)
                tg.start_soon(self._send_deposits)
                tg.start_soon(self._sync_metrics_often)
                # Subscribed first, then the state read: no news can fall in between.
                with anyio.move_on_after(self.timeout * 4):
                    await self._subscribed.wait()
                await self._load_state()
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        await self._drain()  # before the connections close
                        await self._release_all()
        finally:
            self.fleet.on_change = None
            self.fleet.on_weight = None
            self.fleet.budget = local_budget
            self._outbox_send.close()
            self._outbox.close()

    async def _warm_up(self, sources: Mapping[str, str]) -> None:
        """The first calls — the connection, loading the scripts — with their own patience
        (``STARTUP``): a machine busy starting many processes at once would otherwise see
        them pass the 0.25 s bound of a stream's call and start on local limits."""
        import coredis
        from coredis.retry import NoRetryPolicy

        patient = coredis.Redis.from_url(
            self.url,
            stream_timeout=STARTUP,
            connect_timeout=STARTUP,
            retry_policy=NoRetryPolicy(),
            decode_responses=True,
        )
        try:
            with anyio.fail_after(STARTUP):
                async with patient:  # the scripts are the server's: loaded once for all
                    for source in sources.values():
                        await patient.script_load(source)
                await self._redis.ping()  # the streams' own connection, made now
        except Exception as exc:  # down or far too slow: local limits until it answers
            self._lost(exc)

    def status(self) -> SharedStatus:
        return SharedStatus(redact_url(self.url), self.connected, self.local_fallbacks)

    # -- Redis being there or not --------------------------------------------------------

    def _lost(self, exc: BaseException) -> None:
        if self.connected:
            self.connected = False
            where = redact_url(self.url)
            peers = len(self.others) + 1
            self._keep_share(peers)
            log.warning(
                "streamres.shared_unavailable",
                url=where,
                error=type(exc).__name__,
                processes=peers,
            )
            self.fleet.notes = [
                f"shared state unavailable ({where}): this process's own view, and its share "
                f"of each limit (one of {peers} processes)"
            ]

    def _keep_share(self, peers: int) -> None:
        """Redis is away: this process keeps its share of each limit — the limit divided by the
        processes it last saw (itself included), at least 1 — so the fleet stays near the
        limit instead of at N times it."""
        for slots in (*self._routes.values(), *self._accounts.values()):
            cut = slots.size - max(1, slots.size // peers)
            if cut > 0:
                slots.shrink(cut)
                self._shrunk.append((slots, cut))

    def _back(self) -> None:
        if not self.connected:
            self.connected = True
            for slots, cut in self._shrunk:  # the fleet's limits are Redis's again
                slots.grow(cut)
            self._shrunk = []
            self.fleet.notes = []
            log.info("streamres.shared_rejoined", url=redact_url(self.url))

    async def _call(
        self, name: str, keys: list[str], args: list[Any], *, rejoining: bool = False
    ) -> Any:
        """One script, bounded in time; ``None`` (and local mode) when Redis does not answer.
        ``rejoining``: sent before this process counts as connected again."""
        self.calls[name] += 1
        return await self._bounded(
            lambda: self._scripts[name](keys=keys, args=args), rejoining=rejoining
        )

    async def _bounded(self, command: Callable[[], Any], *, rejoining: bool = False) -> Any:
        """One command, bounded in time; ``None`` (and local mode) when Redis does not answer."""
        if not self.connected and not rejoining:
            return None
        try:
            with anyio.fail_after(self.timeout * 2):
                got = await command()
        except Exception as exc:  # redis errors, timeouts, a refused connection
            self._lost(exc)
            return None
        return got

    # -- for state kept elsewhere (the shared answer cache) --------------------------------

    def register(self, name: str, source: str) -> None:
        """A Lua script for :meth:`run` (once running)."""
        self._scripts[name] = self._redis.register_script(source)

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._call(name, keys, args)

    async def get(self, key: str) -> Any:
        self.calls["get"] += 1
        return await self._bounded(lambda: self._redis.get(key))

    async def hgetall(self, key: str) -> Any:
        self.calls["hgetall"] += 1
        return await self._bounded(lambda: self._redis.hgetall(key))

    async def publish(self, event: dict[str, Any]) -> None:
        self.calls["publish"] += 1
        await self._bounded(lambda: self._redis.publish(self._channel, json.dumps(event)))

    # -- slots ---------------------------------------------------------------------------

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

    def _post(self, name: str, keys: list[str], args: list[Any]) -> None:
        with contextlib.suppress(anyio.WouldBlock):
            self._outbox_send.send_nowait((name, keys, args))

    async def _send_outbox(self) -> None:
        async for name, keys, args in self._outbox:
            if await self._call(name, keys, args) is None and name == "release":
                # Redis away or not answering: its lease may still be there (a pause keeps
                # its data), holding a slot no answer uses — taken back at the rejoin.
                self._doubtful.append((str(args[0]), keys))

    async def _drain(self) -> None:
        """What was posted and not yet sent (releases of answers that just ended)."""
        while True:
            try:
                name, keys, args = self._outbox.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            await self._call(name, keys, args)

    async def _release_all(self) -> None:
        for lease, keys in list(self._leases.items()):
            await self._call("release", keys, [lease, self._channel, "{}"])
        self._leases.clear()

    async def _keep_leases(self) -> None:
        """Extend the leases of answers still running; while Redis is away, check for it."""
        extended = anyio.current_time()
        while True:
            await anyio.sleep(1.0)
            if not self.connected:
                try:  # a write, not a ping: a Redis out of memory answers pings
                    with anyio.fail_after(self.timeout * 2):
                        await self._redis.set(f"{self.prefix}:alive:{self.id}", "1", px=3000)
                except Exception:
                    continue
                # The slots this process holds go back first: until they are counted, new
                # requests here keep to the local limits, and elsewhere wait for them.
                if not await self._put_back():
                    continue
                while self._doubtful:
                    lease, keys = self._doubtful.popleft()
                    self._post("release", keys, [lease, self._channel, "{}"])
                self._back()
                await self._load_state()
                self.notify()
                continue
            await self._check_epoch()
            if anyio.current_time() - extended >= LEASE / 3:
                extended = anyio.current_time()
                await self._extend()

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

    # -- weights and metrics -------------------------------------------------------------

    def _weigh(self, i: int, op: str) -> None:
        """Fleet hook: a model's weight moved here; move the fleet's (the script publishes
        the result, which every process — this one too — applies)."""
        w = self.fleet.states[i].weight
        self._post(
            "weight",
            [f"{self.prefix}:weights"],
            [self.fleet.routes[i].key, op, w.base, w.penalty, w.restore, w.floor, self._channel],
        )

    def _weighed(self, event: dict[str, Any]) -> None:
        i = self.fleet.by_key.get(str(event.get("route")))
        weight = event.get("weight")
        if i is not None and isinstance(weight, (int, float)):
            self.fleet.set_weight(i, float(weight))
            self.notify()

    async def sync_metrics(self) -> None:
        """Send this process's figures; take back every live process's (one round trip)."""
        routes = self.fleet.exported(anyio.current_time())
        figures = json.dumps({"id": self.id, "routes": routes})
        got = await self._call(
            "metrics",
            [f"{self.prefix}:metrics:procs"],
            [self.id, figures, int(METRICS_EVERY * 3000), f"{self.prefix}:metrics:of:"],
        )
        if got is not None:
            others = []
            for blob in got:
                with contextlib.suppress(ValueError, TypeError):
                    data = json.loads(blob)
                    if data["id"] != self.id and isinstance(data["routes"], dict):
                        others.append(data["routes"])
            self.others = others

    async def _sync_metrics_often(self) -> None:
        while True:
            await self.sync_metrics()
            await anyio.sleep(METRICS_EVERY)

    # -- the retry budget ----------------------------------------------------------------

    def _budget_args(self, op: str) -> list[Any]:
        b = self.fleet.budget
        initial = b.initial if isinstance(b, SharedBudget) else b.balance
        return [op, b.ratio, b.floor, b.cap, initial, b.window]

    def _budget_post(self, op: str) -> None:
        if op == "deposit":
            self._deposits += 1  # sent together, twice a second: not a round trip per answer
        elif self.connected:
            self._post("budget", [f"{self.prefix}:budget"], self._budget_args(op))

    async def _send_deposits(self) -> None:
        while True:
            await anyio.sleep(0.5)
            if self._deposits and self.connected:
                n, self._deposits = self._deposits, 0
                await self._call(
                    "budget", [f"{self.prefix}:budget"], [*self._budget_args("deposit"), n]
                )

    async def reserve_retry(self) -> float:
        """Reserve the next retry token of the budget every process shares: seconds until it
        is there (this process's own budget decides while Redis is away)."""
        got = await self._call("budget", [f"{self.prefix}:budget"], self._budget_args("reserve"))
        if got is None:
            return self.fleet.budget.reserve(anyio.current_time())
        wait = float(got)
        return float("inf") if wait < 0 else wait

    # -- breaker openings and cool-downs -------------------------------------------------

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
