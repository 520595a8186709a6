"""The proxy's limits on connections, as an HTTP server open to careless or hostile clients.

uvicorn (with httptools, its fast parser) bounds neither how long a request's head may take to
arrive, nor its size, nor how long a client may leave a response unread. :class:`Guarded`, the
HTTP protocol the proxy serves with, adds those; uvicorn's own settings do the rest
(``limit_concurrency`` for connections, ``timeout_keep_alive`` for idle ones):

- **head** — a request's line and headers must arrive within ``header_timeout`` seconds of the
  connection (or of its first byte, on a kept-alive connection), be at most ``header_bytes``
  and ``headers`` in number; else ``408`` / ``431``, and the connection is closed. A connection
  that never sends a byte is closed at ``header_timeout`` too (a slowloris holds nothing).
- **half-close** — with ``half_close``, a client that shuts its sending side after the request
  still gets the whole response; by default that is a client leaving (a FIN either way).
- **write** — a client that reads nothing of its response for ``write_timeout`` seconds (the
  socket's buffers are full) is cut off: its answer is cancelled as for a disconnect, so its
  upstream stream and its slots are freed at once.

The body's own bounds (size, nesting, time) are the app's (``app._body``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from streamres._shell.apps import require
from streamres.proxy.config import ServerLimits

require("uvicorn", "streamres proxy")

from uvicorn.protocols.http.httptools_impl import (  # noqa: E402  (after the check naming the extra)
    HttpToolsProtocol,
)

__all__ = ["Guarded", "guarded"]


def _refusal(status: int, reason: bytes, message: str) -> bytes:
    """A response the protocol sends on its own, closing: JSON both SDK families read."""
    body = json.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    ).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
    )


class Guarded(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head and write limits above."""

    limits: ClassVar[ServerLimits] = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = True  # reading a request's line and headers
        self._head_bytes = 0
        self._head_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._refused = False  # answered and closing: the parser's callbacks do nothing
        self._eof = False  # the client sends no more

    # -- the request's head ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._head and not self.transport.is_closing():
            if self._head_bytes:
                seconds = f"{self.limits.header_timeout:g}"
                self._refuse(
                    408, b"Request Timeout", f"the request's headers took over {seconds} s"
                )
            else:
                self.transport.close()  # nothing asked: nothing to answer

    def _refuse(self, status: int, reason: bytes, message: str) -> None:
        self._refused = True
        self._disarm_head()
        self.logger.info("streamres proxy: refused a request: %s", message)
        self.transport.write(_refusal(status, reason, message))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._head:
            self._arm_head()
            self._head_bytes += len(data)
        super().data_received(data)
        # Past the bound and still no end of the headers: httptools holds at most the bound
        # and one read more.
        big = self._head and self._head_bytes > self.limits.header_bytes
        if big and not self.transport.is_closing():
            self._refuse(
                431,
                b"Request Header Fields Too Large",
                f"the request's line and headers are over {self.limits.header_bytes} bytes",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._head = False
        self._disarm_head()
        if self._head_count > self.limits.headers:
            self._refuse(
                431, b"Request Header Fields Too Large", f"over {self.limits.headers} headers"
            )
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # The next bytes are the next request's head (uvicorn's keep-alive timer covers the
        # wait for them).
        self._head, self._head_bytes, self._head_count = True, 0, 0

    # -- a client that half-closes ---------------------------------------------------------

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio: bool | None
        """The client shut its sending side. That cannot be told from a client that left
        (both are a FIN), so by default it is taken as leaving — the answer is cancelled at
        once, freeing its upstream stream and slots (as nginx does). With ``[server] half_close
        = true``, a request in progress still gets its whole response, then the connection
        closes; a client that left is then noticed at the next write."""
        self._eof = True
        busy = self.cycle is not None and not self.cycle.response_complete
        return busy and self.limits.half_close  # True keeps the transport open

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._eof and not self.transport.is_closing():
            self.transport.close()

    # -- the response ----------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.write_timeout, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _unread(self) -> None:
        """The client read nothing for ``write_timeout``: drop the connection (abort, since a
        close would wait for the unread buffer to drain)."""
        self._write_timer = None
        self.logger.info(
            "streamres proxy: a client read nothing for %g s; its answer is cancelled",
            self.limits.write_timeout,
        )
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)


def guarded(limits: ServerLimits) -> type[Guarded]:
    """The protocol class for one server with ``limits``."""
    return type("Guarded", (Guarded,), {"limits": limits})
