"""A bare relay for ``streamres bench proxy``: the least a proxy can do — each request passed
to the upstream as it came, the response's bytes passed back as they arrive, nothing read,
retried or counted. What the proxy adds per request is measured against it as well as against
going straight to the upstream.

``python -m streamres.benchmarks.relay UPSTREAM`` serves it under uvicorn on a free loopback
port and prints ``bare relay on http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx

__all__ = ["relay"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding"}


def relay(upstream: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app that relays every HTTP request to ``upstream`` (a base URL)."""
    client = httpx.AsyncClient(
        base_url=upstream, timeout=None, limits=httpx.Limits(max_connections=None)
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        request = client.build_request(
            scope["method"], scope["path"], headers=headers, content=body
        )
        response = await client.send(request, stream=True)
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": out}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


def main(argv: list[str]) -> int:
    import uvicorn

    # Its protocol named, so that asyncio turns Nagle's algorithm off on each connection (as
    # the proxy's own socket): a fair relay, not one that waits for delayed ACKs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(f"bare relay on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(relay(argv[0]), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
