"""Real servers for tests and benchmarks: llama.cpp's ``llama-server`` started on a free
loopback port, a proxy in front of a server that cuts its stream after some bytes, and the
measure of a repeat (the longest run two texts share).

``llama-server`` is not a dependency: the caller names its binary (CI builds it from the
llama.cpp source that llama-cpp-python's sdist vendors).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

__all__ = [
    "MODEL",
    "cutting_proxy",
    "launch",
    "longest_common",
    "raw_stream",
    "request_body",
    "serve_gguf",
]

#: The alias a served GGUF answers to.
MODEL = "smollm2"


def launch(argv_at: Callable[[int], list[str]], ready: str) -> tuple[subprocess.Popen[bytes], str]:
    """A server started with ``argv_at(port)`` on a free loopback port, once ``GET ready``
    answers 200 (within two minutes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = argv_at(port)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}{ready}", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{Path(argv[0]).name} did not become ready (exit {proc.poll()})")


def serve_gguf(binary: str, gguf: str, *, seed: int = 42) -> tuple[subprocess.Popen[bytes], str]:
    """``llama-server`` serving ``gguf`` with its own chat template, on two threads, its
    counters on ``/metrics``."""

    def argv_at(port: int) -> list[str]:
        return [
            binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--jinja",
            "-c", "4096", "-np", "1", "--seed", str(seed), "-t", "2", "--alias", MODEL,
            "--metrics",
        ]  # fmt: skip

    return launch(argv_at, "/health")


@contextlib.asynccontextmanager
async def cutting_proxy(target: str, cut_after: int | None) -> AsyncIterator[str]:
    """A loopback proxy whose first connection's response stops after ``cut_after`` body
    bytes (an abrupt close, as a dropped connection); later connections pass through."""
    host, port = target.removeprefix("http://").split(":")
    served = 0

    async def pipe(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream, limit: int | None) -> None:
        seen, body = b"", None
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            async for data in src:
                if limit is not None:
                    seen += data
                    if body is None and b"\r\n\r\n" in seen:
                        body = len(seen) - seen.index(b"\r\n\r\n") - 4
                    elif body is not None:
                        body += len(data)
                    if body is not None and body >= limit:
                        await dst.send(data[: len(data) - (body - limit)])
                        return
                await dst.send(data)

    async def handle(client: anyio.abc.SocketStream) -> None:
        nonlocal served
        served += 1
        limit = cut_after if served == 1 else None
        async with (
            client,
            await anyio.connect_tcp(host, int(port)) as upstream,
            anyio.create_task_group() as tg,
        ):

            async def both_ways(src: Any, dst: Any, limit: int | None) -> None:
                await pipe(src, dst, limit)
                tg.cancel_scope.cancel()  # one way ended: the connection ends

            tg.start_soon(both_ways, client, upstream, None)
            tg.start_soon(both_ways, upstream, client, limit)

    async with (
        await anyio.create_tcp_listener(local_host="127.0.0.1") as listener,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(listener.serve, handle)
        here = listener.extra(anyio.abc.SocketAttribute.local_port)
        try:
            yield f"http://127.0.0.1:{here}"
        finally:
            tg.cancel_scope.cancel()


def longest_common(a: str, b: str) -> int:
    """Length of the longest common substring of ``a`` and ``b`` (bounded dynamic program)."""
    a, b = a[-1500:], b[:1500]
    best, prev = 0, [0] * (len(b) + 1)
    for ca in a:
        cur = [0] * (len(b) + 1)
        for j, cb in enumerate(b, 1):
            if ca == cb:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def request_body(messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A streamed chat request to the served model, greedy with a fixed seed."""
    return {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "temperature": 0,
        "seed": 42,
        "max_tokens": max_tokens,
        **extra,
    }


async def raw_stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[str, int, str | None]:
    """(text, body bytes, finish reason) of one streamed request; a cut body ends it early."""
    text, size, finish, buf = "", 0, None, b""
    with contextlib.suppress(httpx.HTTPError):
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            async for data in r.aiter_raw():
                size += len(data)
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    text += (choice.get("delta") or {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
    return text, size, finish
