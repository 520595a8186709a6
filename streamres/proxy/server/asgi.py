"""The ASGI plumbing every endpoint of the proxy uses: a request's body within its bounds, and
a response's head, pieces, JSON and errors (in the client's own API's shape). I/O shell."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from streamres.proxy.config import ServerLimits
from streamres.proxy.faces.inbound import API
from streamres.proxy.faces.outbound import error_body
from streamres.proxy.faces.refusal import Refused

__all__ = [
    "Receive",
    "Scope",
    "Send",
    "body",
    "error",
    "json_response",
    "lifespan",
    "piece",
    "respond",
    "start",
    "watch_disconnect",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def body(receive: Receive, limits: ServerLimits) -> bytes:
    """The request body, within ``limits.body_bytes`` and ``limits.body_timeout``."""
    parts: list[bytes] = []
    size = 0
    with anyio.move_on_after(limits.body_timeout):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refused(400, "the client went away before sending its request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.body_bytes:
                raise Refused(413, f"the request body is over {limits.body_bytes} bytes")
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)
    raise Refused(408, f"the request body took over {limits.body_timeout:g} s to arrive")


async def start(
    send: Send, status: int, content_type: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", content_type.encode())]
    if content_type == "text/event-stream":
        headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await start(send, status, content_type, extra)
    await piece(send, body, more=False)


async def piece(send: Send, data: bytes, *, more: bool = True) -> None:
    """A piece of the response body (``more=False``: the last, which ends it)."""
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def json_response(send: Send, status: int, obj: Any) -> None:
    await respond(send, status, json.dumps(obj).encode(), "application/json")


async def error(
    send: Send,
    api: API,
    status: int,
    message: str,
    retry_after: float | None,
    code: str | None = None,
) -> None:
    extra = []
    if retry_after is not None:
        extra.append((b"retry-after", str(max(1, round(retry_after))).encode()))
    await respond(send, status, error_body(api, status, message, code), "application/json", extra)
