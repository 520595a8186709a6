"""A hostile HTTP server on 127.0.0.1: it answers each request with raw bytes from a script.

Unlike the embedded upstream, nothing here agrees with streamres' assumptions: a response is
whatever bytes the test says (any status line, headers, chunking, compression, garbage), ended
by a clean close, a reset (RST) or a hang. Requests are answered in order from ``responses``;
once they run out, the last one repeats.
"""

from __future__ import annotations

import gzip
import json
import socket
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

#: A response: parts sent in order. ``bytes`` are written as they are (one write each);
#: ``"reset"`` aborts the connection, ``"hang"`` keeps it open until the test ends, ``"close"``
#: closes it cleanly, ``"pause:S"`` sends nothing for S seconds (a server slow to answer).
Part = bytes | str
Response = Sequence[Part]


@dataclass
class Hostile:
    responses: list[Response]
    #: What each request carried: (request line and headers, body).
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def next_response(self) -> Response:
        n = len(self.requests) - 1
        return self.responses[min(n, len(self.responses) - 1)]

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    buf += await stream.receive(65536)
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += await stream.receive(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((head, body))
                for part in self.next_response():
                    if part == "reset":
                        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        await stream.aclose()
                        return
                    if part == "hang":
                        await anyio.sleep_forever()
                    if isinstance(part, str) and part.startswith("pause:"):
                        await anyio.sleep(float(part.removeprefix("pause:")))  # a slow server
                        continue
                    if part == "close":
                        await stream.aclose()
                        return
                    assert isinstance(part, bytes)
                    await stream.send(part)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


class _Server(Protocol):
    port: int

    async def handle(self, stream: anyio.abc.SocketStream) -> None: ...


S = TypeVar("S", bound=_Server)


@asynccontextmanager
async def serving(server: S) -> AsyncIterator[S]:
    """``server`` on a free loopback port until the block ends."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    server.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def hostile(*responses: Response) -> AsyncIterator[Hostile]:
    async with serving(Hostile(list(responses))) as server:
        yield server


# -- building responses ------------------------------------------------------------------


def head(
    status: int = 200,
    content_type: str = "text/event-stream",
    *,
    extra: Sequence[tuple[str, str]] = (),
    length: int | None = None,
) -> bytes:
    """A status line and headers; chunked unless ``length`` is given."""
    lines = [f"HTTP/1.1 {status} X".encode()]
    if content_type:
        lines.append(f"content-type: {content_type}".encode())
    lines.append(
        b"transfer-encoding: chunked" if length is None else f"content-length: {length}".encode()
    )
    lines += [f"{k}: {v}".encode() for k, v in extra]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


END = b"0\r\n\r\n"


def whole(status: int, body: bytes, content_type: str, **kw: object) -> bytes:
    """A complete response with a content length."""
    return head(status, content_type, length=len(body), **kw) + body  # type: ignore[arg-type]


def openai_chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def openai_answer(words: Sequence[str]) -> list[bytes]:
    """A complete OpenAI stream, one event per part."""
    return [
        *(openai_chunk(w) for w in words),
        openai_chunk(finish="stop"),
        b"data: [DONE]\n\n",
    ]


def streamed(events: Sequence[bytes], *, gzipped: bool = False) -> list[Part]:
    """A 200 event stream sending each event as its own chunk (or one gzip body)."""
    if gzipped:
        body = gzip.compress(b"".join(events))
        return [head(extra=[("content-encoding", "gzip")]), chunk(body), END]
    return [head(), *(chunk(e) for e in events), END]


# -- a server that never stops ---------------------------------------------------------------


@dataclass
class Endless:
    """An OpenAI-shaped upstream whose every answer streams ``piece`` forever, one event per
    write (``gap`` seconds apart; 0: as fast as the socket takes it)."""

    piece: str = "x" * 1000
    gap: float = 0.0
    port: int = 0
    #: Answers being streamed now, and answers whose client closed the stream.
    streaming: int = 0
    closed: int = 0
    #: Set each time a client closes its stream.
    changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                buf += await stream.receive(65536)
            await stream.send(head())
            event = chunk(openai_chunk(self.piece))
            self.streaming += 1
            try:
                while True:
                    await stream.send(event)
                    if self.gap:
                        await anyio.sleep(self.gap)
                    else:
                        await anyio.lowlevel.checkpoint()
            finally:
                self.streaming -= 1
                self.closed += 1
                self.changed.set()
                self.changed = anyio.Event()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


@asynccontextmanager
async def endless(piece: str = "x" * 1000, gap: float = 0.0) -> AsyncIterator[Endless]:
    async with serving(Endless(piece, gap)) as server:
        yield server
