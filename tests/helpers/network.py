"""A loopback TCP relay whose network can be cut: every connection through it closed, and new
ones refused, until it is restored — a phone's Wi-Fi dropping, as the client sees it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc


class Relay:
    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.url = ""
        self.down = False
        self.connections = 0
        self._live: set[anyio.CancelScope] = set()

    def cut(self) -> None:
        """The network goes: every connection through the relay ends, new ones are refused."""
        self.down = True
        for scope in list(self._live):
            scope.cancel()

    def restore(self) -> None:
        self.down = False

    def retarget(self, target: str) -> None:
        """New connections go to ``target`` (a load balancer moving a client to another
        replica); those open stay where they are."""
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            if self.down:
                return
            self.connections += 1
            with anyio.CancelScope() as scope:
                self._live.add(scope)
                try:
                    async with (
                        await anyio.connect_tcp(self.host, self.port) as upstream,
                        anyio.create_task_group() as tg,
                    ):

                        async def pipe(src: Any, dst: Any) -> None:
                            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                                async for data in src:
                                    await dst.send(data)
                            tg.cancel_scope.cancel()

                        tg.start_soon(pipe, client, upstream)
                        tg.start_soon(pipe, upstream, client)
                finally:
                    self._live.discard(scope)


@contextlib.asynccontextmanager
async def relay(target: str) -> AsyncIterator[Relay]:
    """A :class:`Relay` to ``target`` (``http://host:port``) while the block runs."""
    r = Relay(target)
    async with (
        await anyio.create_tcp_listener(local_host="127.0.0.1") as listener,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(listener.serve, r._handle)
        r.url = f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
        try:
            yield r
        finally:
            tg.cancel_scope.cancel()
