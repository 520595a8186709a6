"""``streamres bench abuse``: the proxy as a public server, against what a careless or hostile
world sends it.

The proxy runs in its own process (``streamres proxy``, default ``[server]`` limits — but a
10 s ``header_timeout``, a sixth of its default, so that a phase sees it — and ``[policy]``) in
front of an upstream that never stops streaming (1 KB events as fast as the socket takes them,
no end); clients here. The upstream runs at a lower priority (``nice 10``), as if it were
another machine. Measured, phase by phase, against the same proxy idle in the same run: the
proxy's peak RSS, and ``/health``'s latency sampled every 50 ms:

- **endless**: answers that never end, streamed, not streamed, and with ``max_tokens: 100``,
  asked again as each one ends — each must end at its bound (``finish_reason: length``);
- **idle and slow**: connections that never send a byte, and slowloris heads (a header line
  every half second) — each must be closed by the proxy (within ``header_timeout``);
- **stopped readers**: clients that send a streamed request and read nothing — each cut off at
  ``write_timeout``, its upstream stream closed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.abc
import httpx

from streamres.benchmarks.common import summary
from streamres.benchmarks.proxy import _peak_rss_mib, _process
from streamres.benchmarks.table import table

__all__ = ["main"]

Q = [{"role": "user", "content": "Tell me everything."}]
_EVENT = (
    b"data: "
    + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]}).encode()
    + b"\n\n"
)


async def _endless(stream: anyio.abc.SocketStream) -> None:
    """One upstream connection: read the request's head, then stream forever."""
    with contextlib.suppress(Exception):
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive(65536)
        await stream.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        while True:
            await stream.send(_EVENT)


async def _serve_endless() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    print(f"endless upstream on http://127.0.0.1:{port}", flush=True)
    await listener.serve(_endless)


@contextlib.contextmanager
def _servers(server: str = "") -> Iterator[tuple[str, int]]:
    """The endless upstream and the proxy in front of it: (the proxy's URL, its pid)."""
    # The upstream stands for another machine: it runs at a lower priority, so the cores it
    # takes to stream without end are not charged to the proxy's /health.
    upstream = ["nice", "-n", "10", sys.executable, "-m", "streamres.benchmarks.abuse"]
    upstream.append("--serve-endless")
    with _process(upstream, "endless upstream on") as (up, _):
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(f'[policy]\ndeadline = 20\n\n{server}\n[[routes]]\nname = "m"\nmodel = "m"\n')
            f.write(f'base_url = "{up}/v1"\n')
            path = f.name
        argv = [sys.executable, "-m", "streamres", "proxy", "--port", "0", "--config", path]
        try:
            with _process(argv, "streamres proxy on") as got:
                yield got
        finally:
            os.unlink(path)


async def _watch(url: str, pid: int, done: anyio.Event | float, row: dict[str, Any]) -> None:
    """/health every 50 ms and the proxy's RSS, until ``done`` (an event, or seconds): into
    ``row``."""
    lat: list[float] = []
    rss = 0.0
    end = time.monotonic() + done if isinstance(done, float) else float("inf")
    async with httpx.AsyncClient(timeout=60) as http:
        while time.monotonic() < end and not (isinstance(done, anyio.Event) and done.is_set()):
            t = time.perf_counter()
            r = await http.get(url + "/health")
            lat.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200
            rss = max(rss, _peak_rss_mib(pid, "VmRSS"))
            await anyio.sleep(0.05)
    lat.sort()
    row["health_p50_ms"] = statistics.median(lat)
    row["health_p99_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    row["health_max_ms"] = lat[-1]
    row["proxy_rss_mib"] = rss


async def _endless_answers(url: str, seconds: float, row: dict[str, Any]) -> None:
    """Clients asking for endless answers, again as each ends; their ends counted."""
    ends: dict[str, int] = {}
    chars: list[int] = []
    end = time.monotonic() + seconds

    async def client(kind: str) -> None:
        body: dict[str, Any] = {"model": "m", "messages": Q, "stream": kind != "whole"}
        if kind == "max_tokens":
            body["max_tokens"] = 100
        async with httpx.AsyncClient(timeout=60) as http:
            while time.monotonic() < end:
                got = 0
                finish = "?"
                if body["stream"]:
                    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: {"):
                                continue
                            at = line.find('"content":"')
                            if at > 0 and '"finish_reason":null' in line and "\\" not in line:
                                # The common event, counted without parsing it (the client's
                                # CPU is not the proxy's to spend).
                                got += line.index('"', at + 11) - (at + 11)
                                continue
                            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                            got += len((choice.get("delta") or {}).get("content") or "")
                            finish = choice.get("finish_reason") or finish
                else:
                    r = await http.post(url + "/v1/chat/completions", json=body)
                    choice = r.json()["choices"][0]
                    got, finish = len(choice["message"]["content"] or ""), choice["finish_reason"]
                ends[f"{kind}:{finish}"] = ends.get(f"{kind}:{finish}", 0) + 1
                chars.append(got)

    async with anyio.create_task_group() as tg:
        for kind in ("stream", "stream", "whole", "whole", "max_tokens", "max_tokens"):
            tg.start_soon(client, kind)
    row["answers"] = sum(ends.values())
    row["ends"] = ", ".join(f"{k} {v}" for k, v in sorted(ends.items()))
    row["max_answer_chars"] = max(chars, default=0)


async def _idle_and_slow(url: str, count: int, row: dict[str, Any]) -> None:
    """Connections that never send, and slowloris heads: how many the proxy closed."""
    host, port = url.removeprefix("http://").split(":")
    closed = 0

    async def idle(slow: bool) -> None:
        nonlocal closed
        with contextlib.suppress(TimeoutError, OSError):
            async with await anyio.connect_tcp(host, int(port)) as conn:
                if slow:
                    await conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
                with anyio.fail_after(30):  # not closed within 30 s: not counted
                    i = 0
                    try:
                        while True:
                            if slow:
                                await conn.send(b"x-slow-%d: 1\r\n" % i)
                                i += 1
                            with anyio.move_on_after(0.5):
                                await conn.receive()  # the 408
                                break
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        pass  # closed without a word
                closed += 1

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(idle, i % 2 == 1)
    row["connections"] = count
    row["closed_by_proxy"] = closed


async def _stopped_readers(url: str, count: int, wait: float, row: dict[str, Any]) -> None:
    """Clients that read nothing of their endless answer: each cut off by the proxy."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": Q, "stream": True}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    cut = 0

    async def stuck() -> None:
        nonlocal cut
        with contextlib.suppress(Exception):
            async with await anyio.connect_tcp(host, int(port)) as conn:
                await conn.send(request)
                await anyio.sleep(wait)  # reads nothing: the proxy must give up first
                with anyio.move_on_after(20):  # still sending: it never gave up
                    try:
                        while await conn.receive(1 << 20):
                            pass
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        cut += 1

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(stuck)
    row["connections"] = count
    row["closed_by_proxy"] = cut


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    # The head bound a sixth of its default (60 s), so that the idle phase sees it.
    server = "[server]\nwrite_timeout = 2\nheader_timeout = 2\n" if args.quick else ""
    server = server or "[server]\nheader_timeout = 10\n"
    write_timeout = 2.0 if args.quick else 30.0
    with _servers(server) as (url, pid):
        idle: dict[str, Any] = {"phase": "idle (baseline)"}
        await _watch(url, pid, args.seconds / 3, idle)
        rows.append(idle)

        async def until_done(load: Any, row: dict[str, Any], done: anyio.Event) -> None:
            try:
                await load(row)
            finally:
                done.set()

        phases = [
            ("endless answers ×6", lambda row: _endless_answers(url, args.seconds, row)),
            ("idle + slowloris", lambda row: _idle_and_slow(url, args.connections, row)),
            (
                "stopped readers",
                lambda row: _stopped_readers(url, args.stopped, write_timeout + 15, row),
            ),
        ]
        for name, load in phases:
            row: dict[str, Any] = {"phase": name}
            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_done, load, row, done)
                await _watch(url, pid, done, row)
            row["rss_vs_idle"] = row["proxy_rss_mib"] / idle["proxy_rss_mib"]
            row["health_p99_vs_idle"] = row["health_p99_ms"] / idle["health_p99_ms"]
            rows.append(row)
        rows[0]["peak_rss_mib"] = _peak_rss_mib(pid)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench abuse", description=summary(__doc__))
    p.add_argument("--seconds", type=float, default=20, help="each phase's length")
    p.add_argument("--connections", type=int, default=1000, help="idle and slowloris connections")
    p.add_argument("--stopped", type=int, default=20, help="clients that read nothing")
    p.add_argument("--json", default="", help="also write the rows here")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 3 s phases, 100 connections, 4 readers, 2 s timeouts",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.connections, args.stopped = 3.0, 100, 4
    rows = anyio.run(_run, args)
    columns = [
        "phase",
        "proxy_rss_mib",
        "rss_vs_idle",
        "health_p50_ms",
        "health_p99_ms",
        "health_max_ms",
        "health_p99_vs_idle",
        "answers",
        "max_answer_chars",
        "connections",
        "closed_by_proxy",
    ]
    print("The proxy against an endless upstream and careless clients (default limits)")
    print(table(rows, columns))
    for row in rows:
        if "ends" in row:
            print("  answers' ends:", row["ends"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__" and sys.argv[1:] == ["--serve-endless"]:
    anyio.run(_serve_endless)
