"""Shared state's connection to Redis: every call bounded in time, and this process's own view
and its share of each limit while Redis is away. I/O shell."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from streamres._core.redact import Redactor, redact_url, url_secrets
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route
from streamres._shell.limits import Limits, Slots
from streamres._shell.log import log
from streamres._shell.shared.servers import tagged

__all__ = ["STARTUP", "Connection", "SharedStatus"]

#: Seconds the first calls to Redis (connecting, loading the scripts) may take at start.
STARTUP = 5.0


@dataclass(frozen=True)
class SharedStatus:
    """Where shared state lives, and whether this process can reach it."""

    url: str
    connected: bool
    #: Slots this process took on its own while Redis was unreachable.
    local_fallbacks: int


def _cause(exc: BaseException) -> str:
    """What went wrong, in words: the first error inside a group (a connect to every address
    of a host failed), its type and message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Connection(Limits):
    """What every part of shared state holds and calls through: the Redis client, the bound on
    each call, the outbox of calls nobody waits for, and local mode."""

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
        #: The fleet's name, and the prefix of its keys: the name as a hash tag
        #: (``{streamres}``), one slot on a Redis Cluster (``servers``).
        self.name = prefix
        self.prefix = tagged(prefix)
        self.timeout = timeout
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.connected = True
        self.local_fallbacks = 0
        #: Times Redis went away (or answered too late) and this process went on alone.
        self.outages = 0
        #: When (anyio's clock) Redis last answered again after an outage, or turned out to
        #: have lost its data: what was written before may not be there yet.
        self.rejoined_at = float("-inf")
        self._limits_of = {r.key: r.max_in_flight for r in routes}
        self._account_limits = dict(account_limits)
        self._held: dict[str, list[str | None]] = {}  # route -> lease ids (None: local)
        self._leases: dict[str, list[str]] = {}  # lease id -> its keys
        self._released = anyio.Event()
        #: Set when Redis answers again (made when first waited for).
        self._rejoined: anyio.Event | None = None
        #: The fleet's epoch as this process last saw it ('' before the first slot), and the
        #: one recovery at a time when Redis turns out to have lost the leases.
        self._epoch = ""
        self._epoch_key = f"{self.prefix}:epoch"
        self._recovering = anyio.Lock()
        #: Leases Redis may hold that no answer here uses — asked for by calls that got no
        #: answer, released while Redis was away — taken back at the rejoin.
        self._doubtful: collections.deque[tuple[str, list[str]]] = collections.deque(
            maxlen=65_536  # older ones have expired in Redis by the rejoin anyway
        )
        self._subscribed = anyio.Event()
        self._deposits = 0
        #: The balance the shared retry bucket starts with (the first process creates it):
        #: this process's own when it attached (``SharedState.running``).
        self._initial_balance = self.fleet.budget.balance
        self._outbox_send, self._outbox = anyio.create_memory_object_stream[
            tuple[str, list[str], list[Any]]
        ](10_000)
        self._redis: Any = None
        #: Pub/sub's own connection (``Broadcast``), opened with the client's.
        self._subscriber: Any = None
        self._scripts: dict[str, Any] = {}
        #: Round trips made, by script (or command) name.
        self.calls: collections.Counter[str] = collections.Counter()
        #: The other processes' figures at the last sync (``Client.fleet_metrics``).
        self.others: list[dict[str, dict[str, object]]] = []
        #: The local limits cut to this process's share while Redis is away, and by how much.
        self._shrunk: list[tuple[Slots, int]] = []
        self._channel = f"{prefix}:events"  # channels have no slots: the plain name
        #: What to do with other kinds of news (by its ``kind``), for state kept elsewhere
        #: (the shared answer cache).
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}

    def status(self) -> SharedStatus:
        return SharedStatus(redact_url(self.url), self.connected, self.local_fallbacks)

    def _lost(self, exc: BaseException) -> None:
        if self.connected:
            self.connected = False
            self.outages += 1
            where = redact_url(self.url)
            peers = len(self.others) + 1
            self._keep_share(peers)
            log.warning(
                "streamres.shared_unavailable",
                url=where,
                error=Redactor(url_secrets(self.url)).redact(_cause(exc)),
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
            self.rejoined_at = anyio.current_time()
            log.info("streamres.shared_rejoined", url=redact_url(self.url))
            if self._rejoined is not None:
                self._rejoined.set()
                self._rejoined = None

    async def back(self) -> None:
        """Wait until Redis answers again (at once when it does now)."""
        if self.connected:
            return
        if self._rejoined is None:
            self._rejoined = anyio.Event()
        await self._rejoined.wait()

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

    def _post(self, name: str, keys: list[str], args: list[Any]) -> None:
        # Full: dropped (a lease lapses by itself). Closed: the client has ended, and gave
        # back everything it held as it did — a stream closed afterwards has nothing to send.
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
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
