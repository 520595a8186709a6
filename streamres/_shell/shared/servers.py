"""Where shared state's Redis lives: one server, a Redis Cluster, or a primary that Sentinel
watches — read from the URL, and the coredis client for it. I/O shell.

The URL forms (``redis://`` and ``rediss://`` as every Redis client reads them; the cluster and
Sentinel forms streamres's own, as the URL carries no standard for them)::

    redis://[user:password@]host[:6379][/db]         one server (or Valkey)
    rediss://…                                        the same over TLS
    unix:///path/to/redis.sock[?db=0]                 one server on a Unix socket
    redis+cluster://[user:password@]host:port[,host:port…]
                                                      a Redis Cluster, from any of its nodes
    rediss+cluster://…                                the same over TLS
    redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]
                                                      the primary Sentinel names for service
    rediss+sentinel://…                               the same, the primary over TLS

Every key shared state writes carries one hash tag (``{streamres}``: ``Connection.prefix``),
so on a cluster every script's keys share a slot; on one server the tag is only part of a name.
The credentials are the data servers'; Sentinels are asked without them, as coredis does.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc

from streamres._core.redact import redact_url

__all__ = ["Servers", "held", "tagged"]

SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER = ("redis+cluster://", "rediss+cluster://")
SENTINEL = ("redis+sentinel://", "rediss+sentinel://")


@dataclass(frozen=True)
class Servers:
    """A shared-state URL, read."""

    url: str = field(repr=False)  # it may hold the password
    kind: Literal["server", "cluster", "sentinel"]
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> Servers:
        """The URL read, or ``ValueError`` saying what is wrong with it (credentials hidden)."""
        shown = redact_url(url)
        if url.startswith(SCHEMES):
            return cls(url, "server")
        if not url.startswith(CLUSTER + SENTINEL):
            raise ValueError(
                "shared must be a Redis URL: redis://host:6379/0, rediss://…, unix://…, "
                f"redis+cluster://host:port[,host:port], or "
                f"redis+sentinel://host:port[,host:port]/service[/db]; not {shown:.80}"
            )
        scheme, rest = url.split("://", 1)
        kind: Literal["cluster", "sentinel"] = "cluster" if "cluster" in scheme else "sentinel"
        rest, _, query = rest.partition("?")
        netloc, _, path = rest.partition("/")
        if query:
            raise ValueError(f"a {scheme}:// URL takes no options (?{query:.40}): {shown:.80}")
        username = password = None
        if "@" in netloc:
            credentials, netloc = netloc.rsplit("@", 1)
            user, has_password, secret = credentials.partition(":")
            username = urllib.parse.unquote(user) or None
            password = urllib.parse.unquote(secret) if has_password else None
        nodes = tuple(_node(part, shown) for part in netloc.split(",") if part)
        if not nodes:
            raise ValueError(f"a {scheme}:// URL names at least one host:port: {shown:.80}")
        service, db = "", 0
        parts = [p for p in path.split("/") if p]
        if kind == "sentinel":
            if not parts or len(parts) > 2:
                raise ValueError(
                    f"a {scheme}:// URL names the service Sentinel watches, and may name a "
                    f"database: {scheme}://host:26379/mymaster/0, not {shown:.80}"
                )
            service = urllib.parse.unquote(parts[0])
            db = _db(parts[1], shown) if len(parts) == 2 else 0
        elif parts and parts != ["0"]:
            raise ValueError(f"a Redis Cluster has database 0 only: {shown:.80}")
        return cls(url, kind, nodes, service, db, username, password, scheme.startswith("rediss"))

    def client(self, **options: Any) -> tuple[Any, Callable[[], Any]]:
        """A coredis client for these servers (``options``: coredis's connection options) and
        what must be entered for it to run (an async context manager, made anew each time)."""
        import coredis
        from coredis.connection import TCPLocation

        if self.kind == "server":
            one = coredis.Redis.from_url(self.url, **options)
            return one, lambda: one
        auth: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.tls:
            import ssl

            auth["ssl_context"] = ssl.create_default_context()
        locations = [TCPLocation(host, port) for host, port in self.nodes]
        if self.kind == "cluster":
            cluster = coredis.RedisCluster(startup_nodes=locations, **auth, **options)
            return cluster, lambda: cluster
        # The Sentinel's own options: how its replies are read, the retries of the primary's
        # calls, and the time to connect (to the Sentinels and to the primary alike).
        own: dict[str, Any] = {
            k: options.pop(k) for k in ("decode_responses", "retry_policy") if k in options
        }
        if "connect_timeout" in options:
            own["connect_timeout"] = options["connect_timeout"]
        sentinel = coredis.Sentinel(locations, **own)
        primary = sentinel.primary_for(self.service, db=self.db, **auth, **options)

        @contextlib.asynccontextmanager
        async def both() -> AsyncIterator[None]:
            async with sentinel, primary:
                yield

        return primary, both


def tagged(prefix: str) -> str:
    """The prefix of every shared-state key: ``prefix`` as one hash tag (``{streamres}``), so a
    cluster keeps every key of a fleet in one slot; a prefix that has its own tag is kept."""
    opened = prefix.find("{")  # Redis's rule: the first "{", the first "}" after it
    if opened != -1 and prefix.find("}", opened + 1) > opened + 1:
        return prefix
    return "{" + prefix + "}"


async def held(
    enter: Callable[[], Any],
    *,
    again: float = 1.0,
    task_status: anyio.abc.TaskStatus[bool] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Keep a client entered until cancelled. Started with the first try's outcome (``True``:
    entered): a cluster that cannot be reached at start refuses to be entered (one server does
    not), so it is tried again every ``again`` seconds — calls fail meanwhile, which shared
    state treats as Redis being away — and entered when it answers."""
    started = False
    while True:
        try:
            async with enter():
                if not started:
                    started = True
                    task_status.started(True)
                await anyio.sleep_forever()
        except Exception:
            if not started:
                started = True
                task_status.started(False)
            await anyio.sleep(again)


def _node(part: str, shown: str) -> tuple[str, int]:
    host, colon, port = part.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{part!r:.40} is not host:port in {shown:.80}")
    return host.strip("[]"), int(port)


def _db(part: str, shown: str) -> int:
    if not part.isdigit():
        raise ValueError(f"{part!r:.20} is not a database number in {shown:.80}")
    return int(part)
