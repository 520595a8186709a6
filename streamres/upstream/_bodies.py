"""How the embedded upstream writes a response: the HTTP/1.1 plumbing (h11 over anyio), each
reply as its provider streams it, and the faults played on it (a reset, a stall, an in-band
error, a truncation, a flood, a gzip bomb)."""

from __future__ import annotations

import functools
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import h11

from ._answers import Reply, sign, split_tokens
from ._faults import Fault
from ._render import Render

__all__ = [
    "SEND_BATCH",
    "Pace",
    "Reset",
    "bomb",
    "clean_events",
    "end_with_fault",
    "next_event",
    "play",
    "render_clean",
    "send_simple",
    "start_events",
    "stream_body",
]

#: Bytes a fault-free body is sent in, at most, per write.
SEND_BATCH = 32 * 1024


@dataclass(frozen=True, slots=True)
class Pace:
    """The server's timing settings a body is written with."""

    #: How long a stall (and a slow first token) lasts, and how often it sends a ping.
    stall_seconds: float
    ping_interval: float
    #: Each delta is the time it was sent (benchmarks of the relay's added latency).
    stamp: bool = False
    #: A stall sends keep-alive comments (llama.cpp's server sends none: it is silent).
    pings: bool = True


@dataclass(frozen=True, slots=True)
class _Item:
    """One piece of a response body: its bytes, the tokens it streams, whether it is a delta
    (fault positions count deltas), and the content block it belongs to."""

    data: bytes
    tokens: int = 0
    delta: bool = False
    block: int = 0


def _script(render: Render, reply: Reply) -> list[_Item]:
    """Everything a reply streams between the message start and the finish, in order."""
    items: list[_Item] = []
    block = 0
    if reply.thinking:
        items.append(_Item(render.thinking_start(block), block=block))
        items += [
            _Item(render.reasoning(p, block), n, True, block)
            for p, n in split_tokens(reply.thinking)
        ]
        items.append(_Item(render.signature(block, sign(reply.thinking)), block=block))
        items.append(_Item(render.block_stop(block), block=block))
        block += 1
    items.append(_Item(render.text_start(block), block=block))
    items += [_Item(render.delta(p, block), n, True, block) for p, n in split_tokens(reply.text)]
    items.append(_Item(render.block_stop(block), block=block))
    for call, (call_id, name, arguments) in enumerate(reply.tool_calls):
        block += 1
        items.append(_Item(render.tool_start(block, call, call_id, name), block=block))
        items += [
            _Item(render.tool_args(block, call, arguments[i : i + 12]), 1, True, block)
            for i in range(0, len(arguments), 12)
        ]
        items.append(_Item(render.block_stop(block), block=block))
    return items


def clean_events(
    render: Render, reply: Reply, max_tokens: int | None, input_tokens: int
) -> tuple[list[tuple[int, bytes, bool]], int]:
    """A whole fault-free body as its events — (number, bytes, a text delta?) — and the tokens
    it streams."""
    parts = [render.start(input_tokens)]
    deltas = [False]
    tokens = 0
    finish = "tool_calls" if reply.tool_calls else "stop"
    for item in _script(render, reply):
        if max_tokens is not None and tokens + item.tokens > max_tokens:
            parts.append(render.block_stop(item.block))
            deltas.append(False)
            finish = "length"
            break
        parts.append(item.data)
        deltas.append(item.delta)
        tokens += item.tokens
    parts.append(render.finish(finish, input_tokens, tokens))
    deltas.append(False)
    return [
        (i, data, delta) for i, (data, delta) in enumerate(zip(parts, deltas, strict=True))
    ], tokens


def render_clean(
    render: Render, reply: Reply, max_tokens: int | None, input_tokens: int
) -> tuple[bytes, int]:
    """A whole fault-free body, and the tokens it streams."""
    events, tokens = clean_events(render, reply, max_tokens, input_tokens)
    return b"".join(data for _, data, _ in events), tokens


@functools.cache
def bomb() -> bytes:
    """~2 MiB of gzip that inflates to 1 GiB of keep-alive comment lines (made once).

    One 1 MiB block is compressed after a full flush, which resets the compressor's history,
    so its compressed form is the same every time and can simply be repeated."""
    block = (b": " + b"x" * 1021 + b"\n") * 1024  # 1 MiB
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    part = z.compress(block) + z.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(1024):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, (1024 * len(block)) & 0xFFFFFFFF)
    return header + part * 1024 + z.flush() + trailer


class Reset(Exception):
    """Drop the connection abruptly (RST), as a crashed server would."""


async def next_event(conn: h11.Connection, stream: anyio.abc.SocketStream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(65536)
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


async def send_simple(
    conn: h11.Connection,
    stream: anyio.abc.SocketStream,
    status: int,
    body: bytes,
    headers: list[tuple[str, str]] | None = None,
) -> None:
    hdrs = [("content-type", "application/json"), ("content-length", str(len(body)))]
    await stream.send(
        conn.send(h11.Response(status_code=status, headers=hdrs + (headers or [])))
        + conn.send(h11.Data(data=body))
        + conn.send(h11.EndOfMessage())
    )


async def start_events(
    conn: h11.Connection,
    stream: anyio.abc.SocketStream,
    extra: list[tuple[str, str]] | None = None,
) -> None:
    """The head of a 200 event stream (its body follows in chunks)."""
    headers = [
        ("content-type", "text/event-stream; charset=utf-8"),
        ("cache-control", "no-cache"),
        ("transfer-encoding", "chunked"),
        *(extra or []),
    ]
    await stream.send(conn.send(h11.Response(status_code=200, headers=headers)))


async def play(
    conn: h11.Connection,
    stream: anyio.abc.SocketStream,
    events: list[tuple[int, bytes, bool]],
    fault: Fault,
    delay: float,
    render: Render,
    pace: Pace,
) -> None:
    """Send stored events, with a mid-stream fault after ``fault.after`` text deltas."""
    midstream = fault.kind not in ("ok", "status", "at-capacity", "empty", "bomb")
    deltas = 0
    for _, data, is_delta in events:
        if is_delta:
            if midstream and deltas >= fault.after:
                break
            deltas += 1
        await stream.send(conn.send(h11.Data(data=data)))
        if is_delta and delay > 0:
            await anyio.sleep(delay)
    else:
        await stream.send(conn.send(h11.EndOfMessage()))
        return
    await end_with_fault(conn, stream, render, fault, pace)


async def stream_body(
    conn: h11.Connection,
    stream: anyio.abc.SocketStream,
    render: Render,
    reply: Reply,
    fault: Fault,
    max_tokens: int | None,
    input_tokens: int,
    delay: float,
    pace: Pace,
    count: Callable[[int], None],
    each: bool = False,
) -> None:
    """A reply streamed as ``render`` writes it, with ``fault`` played; ``count`` hears the
    tokens sent so far."""
    buf = bytearray(render.start(input_tokens))

    async def flush() -> None:
        if buf:
            await stream.send(conn.send(h11.Data(data=bytes(buf))))
            buf.clear()

    # A slow answer pauses and goes on: the rest of it is a normal answer's.
    slow = fault.kind == "slow"
    midstream = fault.kind not in ("ok", "status", "at-capacity", "empty", "bomb", "slow")
    emitted = tokens = 0  # deltas (what fault positions count) and tokens
    finish = "tool_calls" if reply.tool_calls else "stop"
    for item in _script(render, reply):
        if item.delta and midstream and emitted >= fault.after:
            break
        if item.delta and slow and emitted >= fault.after:
            slow = False
            await flush()
            until = anyio.current_time() + pace.stall_seconds
            while anyio.current_time() < until:
                await anyio.sleep(max(0.0, min(pace.ping_interval, until - anyio.current_time())))
                await stream.send(conn.send(h11.Data(data=render.ping())))
        if max_tokens is not None and tokens + item.tokens > max_tokens:
            buf += render.block_stop(item.block)
            finish = "length"
            break
        if pace.stamp and item.delta:
            buf += render.delta(f"{time.monotonic():.6f} ", item.block)
        else:
            buf += item.data
        if not item.delta:
            continue
        emitted += 1
        tokens += item.tokens
        count(tokens)
        if delay > 0:
            await flush()
            await anyio.sleep(delay)
        elif each or len(buf) >= SEND_BATCH:
            await flush()
    if not midstream:
        buf += render.finish(finish, input_tokens, tokens)
        await flush()
        await stream.send(conn.send(h11.EndOfMessage()))
        return
    await flush()
    await end_with_fault(conn, stream, render, fault, pace)


async def end_with_fault(
    conn: h11.Connection,
    stream: anyio.abc.SocketStream,
    render: Render,
    fault: Fault,
    pace: Pace,
) -> None:
    """End a response the way ``fault`` says, once its deltas have been sent."""
    kind = fault.kind
    tail = b""
    if kind in ("error", "error-openrouter"):
        tail = render.in_band_error(kind, fault.error_type, fault.message)
    elif kind == "malformed":
        tail = render.malformed()
    elif kind == "done-no-finish":
        tail = render.terminator_without_finish()
    elif kind == "flood":
        # data: lines that never end their event, until the client gives up.
        line = b"data: " + b"x" * 65_000 + b"\n"
        while True:
            await stream.send(conn.send(h11.Data(data=line)))
    elif kind == "stall":
        until = anyio.current_time() + pace.stall_seconds
        while anyio.current_time() < until:
            await anyio.sleep(pace.ping_interval)
            if pace.pings:
                await stream.send(conn.send(h11.Data(data=render.ping())))
    if kind in ("reset", "stall"):
        raise Reset
    if tail:
        await stream.send(conn.send(h11.Data(data=tail)))
    await stream.send(conn.send(h11.EndOfMessage()))  # truncate: a clean end, no terminator
