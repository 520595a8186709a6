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
them on local limits. Works with Redis and Valkey, one server, a Redis Cluster or a primary that
Sentinel watches (the URL says which: ``servers``), through coredis (by the author of the
``limits`` library), built on anyio: asyncio and trio alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio

from streamres._core.redact import redact_url
from streamres._fleet.fleet import Budgeted, Changed, News, Weighed
from streamres._shell.log import log
from streamres._shell.shared.broadcast import SCRIPTS as BROADCAST
from streamres._shell.shared.broadcast import Broadcast
from streamres._shell.shared.budget import SCRIPTS as BUDGET
from streamres._shell.shared.budget import Budget
from streamres._shell.shared.connection import STARTUP, SharedStatus
from streamres._shell.shared.leases import LEASE, Leases
from streamres._shell.shared.leases import SCRIPTS as LEASES
from streamres._shell.shared.metrics import SCRIPTS as METRICS
from streamres._shell.shared.metrics import Metrics
from streamres._shell.shared.servers import Servers, held

__all__ = ["LEASE", "SharedState", "SharedStatus"]

#: Every script, by name (``scripts/<name>.lua``).
SOURCES: dict[str, str] = {**LEASES, **BROADCAST, **BUDGET, **METRICS}


class SharedState(Leases, Broadcast, Budget, Metrics):
    """Concurrency slots, breaker openings and cool-downs shared through Redis (see module):
    the parts, started together, and the watch that rejoins Redis when it is back."""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SharedState]:
        from coredis.retry import NoRetryPolicy

        servers = Servers.parse(self.url)
        # No retries inside the client: a call that fails is this module's to handle (local
        # mode), within its own bound.
        self._redis, streams = servers.client(
            stream_timeout=self.timeout,
            # A connection's handshake may take the start's patience; a stream's call is
            # bounded all the same (``_bounded``).
            connect_timeout=STARTUP,
            retry_policy=NoRetryPolicy(),
            decode_responses=True,
        )
        # Pub/sub waits for messages indefinitely: its own connection, without a read timeout.
        self._subscriber, messages = servers.client(
            connect_timeout=STARTUP, retry_policy=NoRetryPolicy(), decode_responses=True
        )
        sources = SOURCES
        self._scripts.update(
            (name, self._redis.register_script(src)) for name, src in sources.items()
        )
        self.handlers.setdefault("weight", self._weighed)
        self.fleet.telling = True
        try:
            # The clients are held by tasks of their own, outside the parts' task group: they
            # outlive the parts' last calls (the drain, the releases).
            async with anyio.create_task_group() as clients:
                await clients.start(held, streams)
                await clients.start(held, messages)
                try:
                    async with anyio.create_task_group() as tg:
                        await self._warm_up(servers, sources)
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
                finally:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        await self._drain()  # before the connections close
                        await self._release_all()
                    clients.cancel_scope.cancel()
        finally:
            self.fleet.telling = False
            self.fleet.take_news()
            self._outbox_send.close()
            self._outbox.close()

    def tell(self, news: list[News]) -> None:
        """Send what this process's fleet found to every other (``Fleet.take_news``)."""
        for item in news:
            match item:
                case Changed(index=i, kind=kind, until=until):
                    self._share(i, kind, until)
                case Weighed(index=i, outcome=outcome):
                    self._weigh(i, outcome)
                case Budgeted(op=op):
                    self._budget_post(op)

    async def _warm_up(self, servers: Servers, sources: Mapping[str, str]) -> None:
        """The first calls — the connection, loading the scripts — with their own patience
        (``STARTUP``): a machine busy starting many processes at once would otherwise see
        them pass the 0.25 s bound of a stream's call and start on local limits."""
        from coredis.retry import NoRetryPolicy

        patient, enter = servers.client(
            stream_timeout=STARTUP,
            connect_timeout=STARTUP,
            retry_policy=NoRetryPolicy(),
            decode_responses=True,
        )
        try:
            with anyio.fail_after(STARTUP):
                async with enter():  # the scripts are the server's: loaded once for all
                    for source in sources.values():
                        await patient.script_load(source)  # a cluster's: on every node
                    if servers.kind == "server":
                        await self._not_a_cluster_node(patient)
                await self._redis.ping()  # the streams' own connection, made now
        except Exception as exc:  # down or far too slow: local limits until it answers
            self._lost(exc)

    async def _not_a_cluster_node(self, client: Any) -> None:
        """A ``redis://`` URL that names one node of a cluster: every call for a key another
        node holds is refused (``MOVED``), so say what URL to use."""
        try:
            info = await client.info("cluster")
        except Exception:  # a server that keeps its INFO to itself: nothing to say
            return
        if str(info.get("cluster_enabled", "0")) == "1":
            log.warning(
                "streamres.shared_url_is_a_cluster_node",
                url=redact_url(self.url),
                hint="this server is a node of a Redis Cluster: "
                "use redis+cluster://host:port[,host:port] to use the whole cluster",
            )

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
