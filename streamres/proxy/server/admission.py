r"""Who may ask the proxy, and what they may have in flight: client keys and their limits (a
key's answers in flight as :class:`Slot`\ s, its requests a minute; with shared state, counted
for the whole fleet), and, without keys, the private proxy's checks. I/O shell."""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import streamres
from streamres.proxy.config import ClientKey, Config, ServerLimits
from streamres.proxy.faces.refusal import Refused
from streamres.proxy.server.quota import FleetQuota

__all__ = ["Admission", "ClientState", "Slot", "not_private"]

Scope = MutableMapping[str, Any]


@dataclass
class ClientState:
    """A client key and what this process counts for it (its own counts while Redis is
    away): answers in flight, and its bucket of requests a minute."""

    key: ClientKey
    in_flight: int = 0
    tokens: float = 0.0
    updated: float = 0.0


class Slot:
    """One of a client key's answers in flight, given back once (``give_back``): by the
    request — or, handed over to a held answer, when that answer stops running."""

    def __init__(
        self,
        state: ClientState | None = None,
        quota: FleetQuota | None = None,
        lease: str | None = None,
    ) -> None:
        self.state, self.quota, self.lease = state, quota, lease

    def hand_over(self) -> Slot:
        """This slot's count, moved to a new one (this one then gives nothing back)."""
        moved = Slot(self.state, self.quota, self.lease)
        self.state = None
        return moved

    async def give_back(self) -> None:
        state, self.state = self.state, None
        if state is None:
            return
        if self.lease is not None and self.quota is not None:
            await self.quota.leave(state.key.name, self.lease)
        state.in_flight -= 1  # after the fleet's count: this one is the last word


class Admission:
    """The proxy's client keys and their limits (``config.clients``; none: a private proxy)."""

    def __init__(self, client: streamres.Client, config: Config) -> None:
        self.client = client
        self.config = config
        self.clients = [
            ClientState(c, tokens=float(c.requests_per_minute or 0)) for c in config.clients
        ]
        self._quota: FleetQuota | None = None

    def _fleet_quota(self) -> FleetQuota | None:
        """Client keys' limits in Redis, when the proxy shares state (``--redis``)."""
        shared = self.client._shared_state
        if self._quota is None and shared is not None:
            lease = self.config.deadline + self.config.server.write_timeout + 30.0
            self._quota = FleetQuota(shared, lease)
        return self._quota

    async def admit(self, headers: dict[str, str]) -> tuple[ClientState | None, Slot]:
        """The client's key and limits (when keys are configured): its state and the slot it
        takes in its key's answers in flight — or refused."""
        if not self.clients:
            return None, Slot()
        state = self.client_of(headers)
        return state, await self.slot(state)

    async def slot(self, state: ClientState) -> Slot:
        """One of the key's answers in flight (with shared state, its lease in Redis too), or
        refused."""
        key = state.key
        quota = self._fleet_quota() if key.max_in_flight or key.requests_per_minute else None
        if quota is not None:
            got = await quota.admit(key.name, key.max_in_flight, key.requests_per_minute)
            if isinstance(got, str):
                state.in_flight += 1
                return Slot(state, quota, got)
            if got is not None:
                kind, wait = got
                raise Refused(
                    429,
                    f"{key.name} has {key.max_in_flight} answers in flight"
                    if kind == "flight"
                    else f"{key.name} is over {key.requests_per_minute} requests a minute",
                    wait,
                )
            # Redis does not answer: this process's own counts, below.
        if key.max_in_flight is not None and state.in_flight >= key.max_in_flight:
            raise Refused(429, f"{key.name} has {key.max_in_flight} answers in flight", 1.0)
        if key.requests_per_minute:
            now = time.monotonic()
            rate = key.requests_per_minute / 60.0
            state.tokens = min(
                float(key.requests_per_minute), state.tokens + (now - state.updated) * rate
            )
            state.updated = now
            if state.tokens < 1.0:
                wait = (1.0 - state.tokens) / rate
                raise Refused(
                    429, f"{key.name} is over {key.requests_per_minute} requests a minute", wait
                )
            state.tokens -= 1.0
        state.in_flight += 1
        return Slot(state)

    def reader(self, headers: dict[str, str]) -> str | None:
        """Whose answers this request may read: its client key's name (``None`` without
        keys); a missing or wrong key is refused, as for a new answer."""
        return self.client_of(headers).key.name if self.clients else None

    def client_of(self, headers: dict[str, str]) -> ClientState:
        """The client key a request gives (``x-api-key``, or ``Authorization: Bearer``), or a
        401."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = headers.get("x-api-key") or (token.strip() if scheme.lower() == "bearer" else "")
        for c in self.clients:
            if hmac.compare_digest(c.key.key.encode(), given.encode()):
                return c
        raise Refused(401, "invalid API key: give one of the proxy's client keys")


def not_private(scope: Scope, limits: ServerLimits) -> str | None:
    """Without client keys, why this request is not one for a private proxy (``None``:
    it is): reached on a loopback address under another host name (a DNS name rebound
    to 127.0.0.1: a browser always names the host), or sent by a web page of another
    origin."""
    headers = dict(scope["headers"])
    host = headers.get(b"host", b"").decode("latin-1")
    server = scope.get("server") or ("", 0)
    if "*" not in limits.allowed_hosts and _loopback(str(server[0])):
        name = _hostname(host)
        if host and not (_loopback(name) or name in limits.allowed_hosts):
            return (
                f"Host {host!r} is not this proxy's: without client keys it answers only "
                "its loopback names (allow more with [server] allowed_hosts)"
            )
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin or "*" in limits.allowed_origins or origin in limits.allowed_origins:
        return None
    scheme = scope.get("scheme", "http")
    if origin != f"{scheme}://{host}":
        return (
            f"a web page of {origin!r} may not use this proxy: without client keys it "
            "answers only its own pages (allow origins with [server] allowed_origins)"
        )
    return None


def _hostname(host: str) -> str:
    """The name in a ``Host`` header (without its port; an IPv6 address without brackets)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _loopback(name: str) -> bool:
    name = name.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
