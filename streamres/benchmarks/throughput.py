"""Client CPU per SSE event against httpx-sse and the official SDKs (real framing), heap per
stream, and the first call in a fresh process. Part of ``streamres bench``."""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx

import streamres
from streamres.benchmarks.common import Q, rss_kib, words_for
from streamres.upstream import answer_for, split_tokens


async def _raw(client: httpx.AsyncClient, url: str, provider: str, words: int) -> None:
    path, body = _request(url, provider)
    async with client.stream("POST", path, json=body, headers=_hdr(words)) as r:
        async for _ in r.aiter_bytes():
            pass


async def _httpx_sse(client: httpx.AsyncClient, url: str, provider: str, words: int) -> None:
    from httpx_sse import aconnect_sse

    path, body = _request(url, provider)
    async with aconnect_sse(client, "POST", path, json=body, headers=_hdr(words)) as source:
        async for sse in source.aiter_sse():
            if sse.data != "[DONE]":
                json.loads(sse.data)


async def _streamres(client: httpx.AsyncClient, url: str, provider: str, words: int) -> None:
    base = url + "/v1" if provider == "openai" else url
    async for _ in streamres.stream_resilient(
        Q,
        model="m",
        base_url=base,
        api_key="x",
        provider=provider,  # type: ignore[arg-type]
        client=client,
        headers=_hdr(words),
        max_tokens=10_000_000,
    ):
        pass


_SDKS: dict[str, Any] = {}  # one SDK client per kind, reused like the httpx client


async def _openai_sdk(client: httpx.AsyncClient, url: str, provider: str, words: int) -> None:
    sdk = _SDKS.get("openai")
    if sdk is None:
        openai: Any = importlib.import_module("openai")
        sdk = _SDKS["openai"] = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x")
    stream = await sdk.chat.completions.create(
        model="m", messages=Q, stream=True, extra_headers=_hdr(words)
    )
    async for _ in stream:
        pass


async def _anthropic_sdk(client: httpx.AsyncClient, url: str, provider: str, words: int) -> None:
    sdk = _SDKS.get("anthropic")
    if sdk is None:
        anthropic: Any = importlib.import_module("anthropic")
        sdk = _SDKS["anthropic"] = anthropic.AsyncAnthropic(base_url=url, api_key="x")
    stream = await sdk.messages.create(
        model="m", messages=Q, max_tokens=10_000_000, stream=True, extra_headers=_hdr(words)
    )
    async for _ in stream:
        pass


def _hdr(words: int) -> dict[str, str]:
    return {"x-upstream-words": str(words), **_EXTRA}


def _request(url: str, provider: str) -> tuple[str, dict[str, Any]]:
    if provider == "openai":
        return url + "/v1/chat/completions", {"model": "m", "messages": Q, "stream": True}
    return url + "/v1/messages", {"model": "m", "messages": Q, "stream": True, "max_tokens": 10**7}


Consumer = Callable[[httpx.AsyncClient, str, str, int], Awaitable[None]]


def _consumers(provider: str) -> dict[str, Consumer | None]:
    def available(module: str) -> bool:
        try:
            __import__(module)
        except ImportError:
            return False
        return True

    sdk: dict[str, Consumer | None] = (
        {"openai SDK": _openai_sdk if available("openai") else None}
        if provider == "openai"
        else {"anthropic SDK": _anthropic_sdk if available("anthropic") else None}
    )
    return {
        "httpx aiter_bytes (ceiling)": _raw,
        "httpx-sse + json.loads": _httpx_sse if available("httpx_sse") else None,
        "streamres": _streamres,
        **sdk,
    }


#: How the upstream frames a stream. "large chunks": as fast as it can, in 32 KiB writes (a
#: proxy's buffered relay). "one event per write": each token its own flushed TCP write (Nagle
#: off), as fast as the server goes — how real servers deliver tokens; a client that keeps up
#: reads one event per read. "paced": the same, 1 ms apart (1,000 tokens/s): every read also
#: wakes the event loop from idle, which then costs more than the event itself.
FRAMINGS: dict[str, dict[str, str]] = {
    "large chunks": {},
    "one event per write": {"x-upstream-framing": "event"},
    "paced, 1 ms": {"x-upstream-delay": "0.001"},
}


async def throughput(url: str, sizes: dict[str, list[int]], runs: int) -> list[dict[str, Any]]:
    """CPU time of this (client) process per event, each consumer in turn on the same stream;
    the ratio is to httpx-sse + json.loads measured in the same run."""
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=None) as client:
        for framing, extra in FRAMINGS.items():
            for provider in ("openai", "anthropic"):
                for size in sizes[framing]:
                    rows += await _throughput_one(client, url, framing, extra, provider, size, runs)
    return rows


async def _throughput_one(
    client: httpx.AsyncClient,
    url: str,
    framing: str,
    extra: dict[str, str],
    provider: str,
    size: int,
    runs: int,
) -> list[dict[str, Any]]:
    words = words_for(size)
    events = len(split_tokens(answer_for(Q, words=words)))
    consumers = _consumers(provider)
    skipped = {n for n in consumers if n.endswith("SDK") and size > 50_000}
    for name in skipped:
        consumers[name] = None
    _EXTRA.clear()
    _EXTRA.update(extra)
    for fn in consumers.values():  # warm: server cache, imports, connections
        if fn is not None:
            await fn(client, url, provider, words)
    cpu: dict[str, list[float]] = {name: [] for name in consumers}
    wall: dict[str, list[float]] = {name: [] for name in consumers}
    for _ in range(runs):
        for name, fn in consumers.items():
            if fn is None:
                continue
            t, c = time.perf_counter(), time.process_time()
            await fn(client, url, provider, words)
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - t)
    _EXTRA.clear()
    base = statistics.median(cpu["httpx-sse + json.loads"] or [float("nan")])
    rows = []
    for name, fn in consumers.items():
        row: dict[str, Any] = {
            "framing": framing,
            "provider": provider,
            "events": events,
            "consumer": name,
        }
        if name in skipped:
            row["note"] = "skipped at this size (minutes per run); see the 20k row"
        elif fn is None:
            row["note"] = "not installed (pip install 'streamres[bench]')"
        else:
            med = statistics.median(cpu[name])
            row.update(
                cpu_us_per_event=med / events * 1e6,
                ratio_to_httpx_sse=med / base,
                wall_s=statistics.median(wall[name]),
            )
        rows.append(row)
    return rows


#: Extra request headers of the framing being measured.
_EXTRA: dict[str, str] = {}


async def peak_memory(url: str, events: int) -> dict[str, float]:
    """Peak Python heap allocated while consuming one stream (tracemalloc), in KiB."""
    words = words_for(events)
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=None) as client:
        for name, fn in (("streamres", _streamres), ("httpx-sse + json.loads", _httpx_sse)):
            await fn(client, url, "openai", words)
            tracemalloc.start()
            await fn(client, url, "openai", words)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            out[name] = peak / 1024
    return out


async def idle_memory(url: str, streams: int) -> dict[str, float]:
    """Python heap held per open, idle stream (KiB): ``streams`` answers each past its first
    token and waiting for the next (the upstream sends one token every 30 s)."""
    out: dict[str, float] = {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    for name in ("streamres", "httpx-sse + json.loads"):
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            first = anyio.Event()
            started = 0

            async def one(name: str = name, first: anyio.Event = first) -> None:
                nonlocal started
                headers = {**_hdr(400), "x-upstream-delay": "30"}
                if name == "streamres":
                    events = streamres.stream_resilient(
                        Q,
                        model="m",
                        base_url=url + "/v1",
                        api_key="x",
                        client=client,
                        headers=headers,
                        first_token_timeout=120,
                        stall_timeout=120,
                    )
                    async with events:
                        async for ev in events:
                            if ev.type == "text":
                                break
                else:
                    from httpx_sse import aconnect_sse

                    path, body = _request(url, "openai")
                    async with aconnect_sse(
                        client, "POST", path, json=body, headers=headers
                    ) as src:
                        async for _ in src.aiter_sse():
                            break
                started += 1
                if started == streams:
                    first.set()
                await anyio.sleep_forever()

            tracemalloc.start()
            base, _ = tracemalloc.get_traced_memory()
            async with anyio.create_task_group() as tg:
                for _ in range(streams):
                    tg.start_soon(one)
                await first.wait()
                held, _ = tracemalloc.get_traced_memory()
                tg.cancel_scope.cancel()
            tracemalloc.stop()
            out[name] = (held - base) / streams / 1024
    return out


async def first(consumer: str, url: str) -> dict[str, Any]:
    """One short answer in this fresh (child) process, modules already imported: its time and
    the RSS it added (a token encoding loaded on the call's path shows here)."""
    import httpx_sse  # noqa: F401  (imported before timing, like streamres)

    rss = rss_kib()
    t = time.perf_counter()
    _EXTRA["x-upstream-usage"] = "none"  # a server that reports no usage
    async with httpx.AsyncClient(timeout=None) as client:
        if consumer == "streamres":
            await _streamres(client, url, "openai", 40)
        else:
            await _httpx_sse(client, url, "openai", 40)
    return {"ms": (time.perf_counter() - t) * 1e3, "rss_added_mib": (rss_kib() - rss) / 1024}


def first_calls(url: str, runs: int) -> list[dict[str, Any]]:
    """Each consumer's first call, each run in a new process."""
    rows = []
    for consumer in ("httpx-sse + json.loads", "streamres"):
        got = []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-m", "streamres.benchmarks.suite", "--first", consumer, url],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
        rows.append(
            {
                "consumer": consumer,
                "ms": statistics.median(g["ms"] for g in got),
                "rss_added_mib": statistics.median(g["rss_added_mib"] for g in got),
            }
        )
    for row in rows:
        row["ratio_to_httpx_sse"] = row["ms"] / rows[0]["ms"]
    return rows
