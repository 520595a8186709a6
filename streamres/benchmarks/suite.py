"""``streamres bench``: throughput, ledger cost, recovery and a chaos soak, measured one way.

The upstream for throughput and the soak runs in its own process (``streamres serve``) so it
is never the bottleneck; every consumer reads the same bytes from it over loopback. Machines
are shared and noisy: each figure is a median of several runs, reported as a ratio to bare
httpx-sse + json.loads measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx
import structlog

import streamres
from streamres.benchmarks import dedup as _dedup_bench
from streamres.benchmarks.table import table
from streamres.upstream import Upstream, answer_for, split_tokens

__all__ = ["main"]

Q = [{"role": "user", "content": "Explain TCP slow start."}]


@contextlib.contextmanager
def _server(*extra: str) -> Iterator[str]:
    """``streamres serve`` in a child process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamres", "serve", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[3]  # "embedded upstream on http://127.0.0.1:PORT ..."
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _words_for(events: int) -> int:
    """Answer length (words) that streams about ``events`` deltas."""
    sample = 2000
    per_word = len(split_tokens(answer_for(Q, words=sample))) / sample
    return max(10, round(events / per_word))


# -- throughput ----------------------------------------------------------------------------


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


async def _throughput(url: str, sizes: dict[str, list[int]], runs: int) -> list[dict[str, Any]]:
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
    words = _words_for(size)
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


async def _peak_memory(url: str, events: int) -> dict[str, float]:
    """Peak Python heap allocated while consuming one stream (tracemalloc), in KiB."""
    words = _words_for(events)
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


async def _idle_memory(url: str, streams: int) -> dict[str, float]:
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


# -- token ledger --------------------------------------------------------------------------


def _ledger(sizes: list[int]) -> list[dict[str, Any]]:
    from streamres._core.tokens import TokenLedger, counter_for

    _, count = counter_for("gpt-4o-mini")
    rows = []
    for size in sizes:
        pieces = [p for p, _ in split_tokens(answer_for(Q, words=_words_for(size)))]
        n = len(pieces)
        t = time.perf_counter()
        ledger = TokenLedger(count)
        for p in pieces:
            ledger.add(p)
        _ = ledger.tokens
        ledger_us = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for p in pieces:
            count(p)
        per_delta_us = (time.perf_counter() - t) / n * 1e6
        row = {"events": n, "ledger_us_per_event": ledger_us, "encode_each_delta_us": per_delta_us}
        if n <= 2000:
            t = time.perf_counter()
            text = ""
            for p in pieces:
                text += p
                count(text)
            row["reencode_whole_us"] = (time.perf_counter() - t) / n * 1e6
        rows.append(row)
    return rows


# -- recovery ------------------------------------------------------------------------------

_RECOVERY: list[tuple[str, str, dict[str, Any], str, str]] = [
    # label, provider, upstream kwargs, fault, client continuation
    ("429 Retry-After 0.2 s", "openai", {}, "429:retry-after=0.2", "auto"),
    ("529 Retry-After 0.2 s", "anthropic", {}, "529:retry-after=0.2", "auto"),
    ("error event, prefill", "anthropic", {}, "error@40", "auto"),
    ("error event, instruct-overlap", "openai", {}, "error@40", "auto"),
    ("error event, restart", "openai", {"instruct": "restart"}, "error@40", "auto"),
    ("reset, prefill", "anthropic", {}, "reset@40", "auto"),
    ("reset, instruct-overlap", "openai", {}, "reset@40", "auto"),
    ("reset, instruct-preamble", "openai", {"instruct": "preamble"}, "reset@40", "auto"),
    ("stall (0.5 s), prefill", "anthropic", {"ping_interval": 0.1}, "stall@40", "auto"),
    ("truncation, instruct-overlap", "openai", {}, "truncate@40", "auto"),
    ("[DONE] without finish, prefill", "openai", {}, "done-no-finish@40", "prefill"),
]


async def _recovery() -> list[dict[str, Any]]:
    rows = []
    for label, provider, kw, fault, continuation in _RECOVERY:
        # Token by token, as a real model streams, so the hold-back is what a user would see.
        async with Upstream(faults=fault, token_delay=0.002, **kw) as up:
            base = up.openai_url if provider == "openai" else up.anthropic_url
            marks: list[tuple[str, float, float]] = []
            done: streamres.DoneEvent | None = None
            async for ev in streamres.stream_resilient(
                Q,
                model="m",
                base_url=base,
                api_key="x",
                provider=provider,  # type: ignore[arg-type]
                stall_timeout=0.5,
                continuation=continuation,  # type: ignore[arg-type]
                backoff=streamres.Backoff(initial=0.001, maximum=0.001),
            ):
                delay = getattr(ev, "delay", 0.0)
                marks.append((ev.type, anyio.current_time(), delay))
                if ev.type == "done":
                    done = ev
            assert done is not None
            status = next(i for i, m in enumerate(marks) if m[0] in ("retry", "resume"))
            nxt = next(m for m in marks[status + 1 :] if m[0] == "text")
            gap = nxt[1] - marks[status][1] - marks[status][2]
            last = done.history[-1]
            rows.append(
                {
                    "scenario": label,
                    "gap_ms": gap * 1000,
                    "held_chars": last.held_chars,
                    "hold_ms": last.hold_seconds * 1000,
                    "wasted_tokens": done.usage.wasted_tokens,
                    "exact": done.text == up.answer(Q),
                    "restart_client_wasted": await _restart_waste(base, provider, fault, up),
                }
            )
    return rows


async def _restart_waste(base: str, provider: str, fault: str, up: Upstream) -> int | str:
    """What a restart-from-scratch client regenerates: the whole partial answer (shown twice)."""
    if "@" not in fault:
        return 0
    up.faults.push(fault)
    try:
        async for _ in streamres.stream_resilient(
            Q,
            model="m",
            base_url=base,
            api_key="x",
            provider=provider,  # type: ignore[arg-type]
            max_attempts=1,
            stall_timeout=0.5,
        ):
            pass
    except streamres.StreamError as exc:
        from streamres._core.tokens import counter_for

        return counter_for("m")[1](exc.partial_text)
    return 0


# -- chaos soak ----------------------------------------------------------------------------


async def _soak(url: str, streams: int, seconds: float) -> dict[str, Any]:
    routes = [
        streamres.Route("m1", base_url=url + "/v1", api_key="x", family="f", size=2),
        streamres.Route("m2", base_url=url + "/v1", api_key="x", family="f", size=1),
    ]
    budget = streamres.RetryBudget(ratio=2.0, floor=20.0, cap=50.0)
    initial = budget.balance  # the bank starts here, not at the cap
    results: list[tuple[bool, float, int]] = []
    started = anyio.current_time()
    async with streamres.Client(
        routes,
        retry_budget=budget,
        breaker_threshold=5,
        breaker_recovery=2.0,
        deadline=seconds,
        stall_timeout=1.0,
        backoff=streamres.Backoff(initial=0.05, maximum=1.0),
    ) as client:

        async def one(i: int) -> None:
            msgs = [{"role": "user", "content": f"question {i}"}]
            expected = answer_for(msgs)
            t = anyio.current_time()
            try:
                text = ""
                async for ev in client.stream(msgs, model="m1"):
                    if ev.type == "text":
                        text += ev.text
                    elif ev.type == "done":
                        results.append((ev.text == expected, anyio.current_time() - t, ev.attempts))
            except streamres.StreamError as exc:
                results.append(
                    (
                        expected.startswith(exc.partial_text) and exc.partial_text == text,
                        anyio.current_time() - t,
                        exc.attempts,
                    )
                )

        async with anyio.create_task_group() as tg:
            for i in range(streams):
                tg.start_soon(one, i)
    times = sorted(r[1] for r in results)
    return {
        "streams": streams,
        "exact_or_exact_partial": sum(r[0] for r in results) / len(results),
        "completed": len(results),
        "p50_s": times[len(times) // 2],
        "p95_s": times[min(len(times) - 1, int(0.95 * len(times)))],
        "requests_per_answer": sum(r[2] for r in results) / len(results),
        "budget_allows_per_answer": 1
        + budget.ratio
        + (initial + budget.floor * (anyio.current_time() - started)) / streams,
        "wall_s": anyio.current_time() - started,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# -- stall detection: from a real stall to the resume, default (adaptive) settings ----------

_STALLS = [
    ("fast stream (10 ms between tokens)", 0.01, "stall@20"),
    ("slow stream (1 s between tokens)", 1.0, "stall@6"),
]


async def _stall_detection(quick: bool) -> list[dict[str, Any]]:
    """Seconds from the last token before a stall to the resume event, with the defaults."""
    rows = []
    for label, delay, fault in _STALLS[:1] if quick else _STALLS:
        async with Upstream(faults=fault, token_delay=delay, ping_interval=0.2, words=12) as up:
            last_text = resumed = 0.0
            async for ev in streamres.stream_resilient(
                Q, model="m", base_url=up.openai_url, api_key="x", deadline=120
            ):
                if ev.type == "text" and not resumed:
                    last_text = anyio.current_time()
                elif ev.type == "resume" and not resumed:
                    resumed = anyio.current_time()
            rows.append({"stream": label, "stall_to_resume_s": round(resumed - last_text, 2)})
    return rows


# -- hostile upstreams: memory stays bounded -----------------------------------------------

_ATTACKS = {
    "clean answer (baseline)": "none",
    "data: lines that never end an event": "flood@5",
    "gzip bomb (2 MiB -> 1 GiB)": "bomb",
}


async def _probe(url: str) -> dict[str, Any]:
    """One answer with one attempt, in this (child) process: outcome, time, peak RSS."""
    started = time.perf_counter()
    outcome = "done"
    try:
        async for _ in streamres.stream_resilient(
            Q, model="m", base_url=url, api_key="x", max_attempts=1, deadline=60
        ):
            pass
    except streamres.StreamError as exc:
        outcome = f"{type(exc).__name__} ({exc.reason})"
    return {
        "outcome": outcome,
        "seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mib": round(_peak_rss_kib() / 1024, 1),
    }


async def _first(consumer: str, url: str) -> dict[str, Any]:
    """One short answer in this fresh (child) process, modules already imported: its time and
    the RSS it added (a token encoding loaded on the call's path shows here)."""
    import httpx_sse  # noqa: F401  (imported before timing, like streamres)

    rss = _rss_kib()
    t = time.perf_counter()
    _EXTRA["x-upstream-usage"] = "none"  # as the issue measured: no usage from the server
    async with httpx.AsyncClient(timeout=None) as client:
        if consumer == "streamres":
            await _streamres(client, url, "openai", 40)
        else:
            await _httpx_sse(client, url, "openai", 40)
    return {"ms": (time.perf_counter() - t) * 1e3, "rss_added_mib": (_rss_kib() - rss) / 1024}


def _first_calls(url: str, runs: int) -> list[dict[str, Any]]:
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


def _rss_kib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


_TOPICS = (
    "TCP slow start",
    "DNS caching",
    "HTTP keep-alive",
    "TLS session resumption",
    "a B-tree",
    "a bloom filter",
    "consistent hashing",
    "a write-ahead log",
    "Raft leader election",
    "garbage collection",
    "a hash map",
    "SQL joins",
    "database indexes",
    "CPU caches",
    "virtual memory",
    "a mutex",
    "an event loop",
    "backpressure",
    "rate limiting",
    "CORS",
    "OAuth scopes",
    "JSON Web Tokens",
    "gzip compression",
    "UTF-8",
    "floating point rounding",
    "binary search",
    "merge sort",
    "Dijkstra's algorithm",
    "a trie",
    "copy-on-write",
    "container images",
    "Kubernetes pods",
    "load balancers",
    "a CDN",
    "WebSockets",
    "server-sent events",
    "exponential backoff",
    "circuit breakers",
    "idempotency keys",
    "optimistic locking",
)
_TEMPLATES = ("Explain how {} works.", "What is {} used for?", "What are the pitfalls of {}?")
#: How people ask the same again: other case and punctuation, a greeting, a preamble.
_REPHRASE = ("{lower}", "Hi! {}", "Can you tell me: {}", "Please answer: {}")


def _request_mix(requests: int, repeats: float) -> list[tuple[str, int]]:
    """Questions with their meaning's id: new ones, and ``repeats`` of earlier ones — half
    asked again word for word, half in other words (seeded)."""
    import random

    rng = random.Random(5)
    bases = [t.format(x) for x in _TOPICS for t in _TEMPLATES]
    rng.shuffle(bases)
    mix: list[tuple[str, int]] = []
    used = 0
    for _ in range(requests):
        if mix and rng.random() < repeats:
            _, base = rng.choice(mix)
            text = bases[base]
            if rng.random() < 0.5:
                text = rng.choice(_REPHRASE).format(text, lower=text.lower().rstrip(".?"))
            mix.append((text, base))
        else:
            mix.append((bases[used % len(bases)], used % len(bases)))
            used += 1
    return mix


async def _cache_replay(requests: int = 120, repeats: float = 0.3) -> list[dict[str, Any]]:
    """A request mix with ``repeats`` of repeats and near-repeats, 20 at a time, against an
    upstream that serves 5 streams at once and refuses more (429): no cache, the exact cache,
    and the exact cache with the semantic one (a hit on another meaning counts as wrong)."""
    mix = _request_mix(requests, repeats)
    meaning = dict(mix)
    setups: list[tuple[str, streamres.Cache | None]] = [
        ("no cache", None),
        ("exact cache + single-flight", streamres.Cache()),
        ("+ semantic", streamres.Cache(semantic=streamres.Semantic())),
    ]
    rows = []
    for label, cache in setups:
        failed = wrong = 0
        async with Upstream(
            token_delay=0.005, words=40, max_in_flight=5, quota_retry_after=0.2
        ) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="x")
            async with streamres.Client(
                [route], cache=cache, backoff=streamres.Backoff(initial=0.05, maximum=0.5)
            ) as client:
                await client.cache_ready()
                sem = anyio.Semaphore(20)

                async def one(q: str, base: int, sem: anyio.Semaphore = sem) -> None:
                    nonlocal failed, wrong
                    async with sem:
                        try:
                            async for ev in client.stream(
                                [{"role": "user", "content": q}], model="m", deadline=60
                            ):
                                if ev.type == "done" and ev.cache_match:
                                    wrong += meaning[ev.cache_match] != base
                        except streamres.StreamError:
                            failed += 1

                async with anyio.create_task_group() as tg:
                    for q, base in mix:
                        tg.start_soon(one, q, base)
                stats = client.cache_stats()
            rows.append(
                {
                    "setup": label,
                    "answers": requests,
                    "upstream_requests": len(up.requests),
                    "capacity_errors": sum(r.status == 429 for r in up.requests),
                    "failed_answers": failed,
                    "saved": stats.requests_saved if stats else 0,
                    "semantic_hits": stats.semantic_hits if stats else 0,
                    "wrong_answers": wrong,
                }
            )
    return rows


async def _shared_cost(answers: int = 40) -> list[dict[str, Any]]:
    """What shared state costs an answer: Redis round trips (counted by the server) and time to
    first token, with a shared limit and with an in-process one (a local redis-server)."""
    import shutil
    import socket
    import tempfile

    exe = shutil.which("redis-server")
    if exe is None:
        return [{"setup": "shared", "note": "redis-server is not installed"}]
    import collections

    import coredis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = await anyio.open_process(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            tempfile.gettempdir(),
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    rows = []
    try:
        async with coredis.Redis.from_url(url) as r:
            for _ in range(200):  # the server starting
                try:
                    await r.ping()
                    break
                except Exception:
                    await anyio.sleep(0.02)

        def made(client: streamres.Client) -> collections.Counter[str]:
            """Round trips the client made, by script or command (the tests hold these to the
            server's own counts); the once-a-second metrics sync is not an answer's."""
            state = client._shared_state
            calls = collections.Counter(state.calls) if state is not None else collections.Counter()
            calls.pop("metrics", None)
            return calls

        async with Upstream(words=20) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="x", max_in_flight=8)
            setups: list[tuple[str, str | None, streamres.Cache | None, str]] = [
                ("in-process limits", None, None, "a"),
                ("shared on Redis", url, None, "b"),
                ("shared, with the shared cache (a miss)", url, streamres.Cache(), "c"),
                ("shared cache: another process's answer", url, streamres.Cache(), "c"),
            ]
            for label, shared, cache, series in setups:
                async with streamres.Client([route], shared=shared, cache=cache) as client:
                    ttfts: list[float] = []
                    before = made(client)
                    for i in range(answers):
                        t = time.perf_counter()
                        first = None
                        asked = [{"role": "user", "content": f"Question {series}{i}: TCP?"}]
                        async for ev in client.stream(asked, model="m"):
                            if ev.type == "text" and first is None:
                                first = time.perf_counter() - t
                        ttfts.append(first or 0.0)
                    await anyio.sleep(0.2)  # releases and cache writes go in the background
                    calls = sum((made(client) - before).values())
                rows.append(
                    {
                        "setup": label,
                        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
                        "round_trips_per_answer": round(calls / answers, 2) if shared else 0,
                    }
                )
    finally:
        proc.terminate()
        await proc.wait()
        await proc.aclose()
    return rows


def _peak_rss_kib() -> float:
    """This process's peak RSS. On Linux from VmHWM: ``ru_maxrss`` survives fork and exec, so
    a child started by a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _hostile() -> list[dict[str, Any]]:
    """Peak RSS of a client process under each attack, next to a clean answer's."""
    rows = []
    for name, faults in _ATTACKS.items():
        with _server("--faults", faults) as url:
            out = subprocess.run(
                [sys.executable, "-m", "streamres.benchmarks.suite", "--probe", url],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        rows.append({"attack": name, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


# -- report --------------------------------------------------------------------------------


async def _all(args: argparse.Namespace) -> dict[str, Any]:
    sizes = {
        "large chunks": [2000] if args.quick else [20_000, 200_000],
        "one event per write": [2000] if args.quick else [20_000],
        "paced, 1 ms": [300] if args.quick else [2000],
    }
    runs = 1 if args.quick else args.runs
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}",
    }
    with _server() as url:
        print("throughput…", file=sys.stderr)
        report["throughput"] = await _throughput(url, sizes, runs)
        report["peak_memory_kib"] = await _peak_memory(url, 2000 if args.quick else 20_000)
        print("idle streams…", file=sys.stderr)
        report["idle_stream_kib"] = await _idle_memory(url, 20 if args.quick else 200)
        print("first call in a fresh process…", file=sys.stderr)
        report["first_call"] = _first_calls(url, 1 if args.quick else 5)
    print("token ledger…", file=sys.stderr)
    report["ledger"] = _ledger([1000] if args.quick else [1000, 10_000, 100_000])
    print("recovery…", file=sys.stderr)
    report["recovery"] = await _recovery()
    with _server("--chaos", "0.5,0.33,0.05", "--ping-interval", "0.2") as url:
        print("chaos soak…", file=sys.stderr)
        report["soak"] = await _soak(url, 20 if args.quick else args.soak, 60.0)
    print("hostile upstreams…", file=sys.stderr)
    report["hostile"] = _hostile()
    print("de-duplication…", file=sys.stderr)
    report["dedup"] = _dedup_bench.run(60 if args.quick else 400)
    print("stall detection…", file=sys.stderr)
    report["stalls"] = await _stall_detection(args.quick)
    print("cache replay…", file=sys.stderr)
    report["cache"] = await _cache_replay(40 if args.quick else 120)
    print("semantic cache…", file=sys.stderr)
    report["semantic"] = _semantic()
    print("shared state…", file=sys.stderr)
    report["shared"] = await _shared_cost(10 if args.quick else 40)
    return report


_DEDUP_COLUMNS = [
    "language",
    "cases",
    "exact_pct",
    "exact_boundary_2tok_pct",
    "exact_sentence_pct",
    "near_repeats_kept",
    "duplicated_chars",
    "wrongly_dropped_chars",
    "max_new_tokens_held",
    "max_hold_ms_at_50_tok_s",
]


def _print_dedup(rows: list[dict[str, Any]]) -> None:
    print("\nDe-duplication (instruct resumes backing up 0-60 tokens; near-repeats kept)")
    print(table(rows, _DEDUP_COLUMNS))


def _semantic() -> dict[str, Any]:
    from streamres._shell.embedder import bundled_model
    from streamres.benchmarks import semantic as semantic_eval

    started = time.perf_counter()
    model = bundled_model()
    loaded_ms = (time.perf_counter() - started) * 1000
    return {
        "cost": semantic_eval.model_cost(model, loaded_ms),
        "pairs": semantic_eval.evaluate(model, semantic_eval.load_pairs()),
    }


def _print_semantic(report: dict[str, Any]) -> None:
    print("\nSemantic cache: labelled question pairs (precision = right hits / hits)")
    print(
        table(
            report["pairs"],
            ["threshold", "set", "language", "pairs", "precision", "recall", "wrong_hits"],
        )
    )
    print("Bundled model's cost:", report["cost"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamres bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, one run (a smoke test)")
    p.add_argument("--runs", type=int, default=5, help="runs per throughput figure (median)")
    p.add_argument("--soak", type=int, default=200, help="concurrent streams in the chaos soak")
    p.add_argument("--json", default="bench-results.json", help="where to write the results")
    p.add_argument(
        "--dedup", action="store_true", help="only the de-duplication benchmark (seconds)"
    )
    p.add_argument(
        "--semantic",
        action="store_true",
        help="only the semantic cache's precision and recall on labelled pairs (seconds)",
    )
    p.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one answer in a child process
    p.add_argument("--first", nargs=2, help=argparse.SUPPRESS)  # internal: a first call
    args = p.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
    if args.probe:
        print(json.dumps(anyio.run(_probe, args.probe)))
        return 0
    if args.first:
        print(json.dumps(anyio.run(_first, *args.first)))
        return 0
    if args.dedup:
        rows = _dedup_bench.run(60 if args.quick else 400)
        _print_dedup(rows)
        return 0 if all(r["wrongly_dropped_chars"] == 0 for r in rows) else 1
    if args.semantic:
        semantic = _semantic()
        _print_semantic(semantic)
        return 0
    report = anyio.run(_all, args)
    print("\nThroughput (client CPU µs per SSE event, median; ratio to httpx-sse + json.loads)")
    print(
        table(
            report["throughput"],
            [
                "framing",
                "provider",
                "events",
                "consumer",
                "cpu_us_per_event",
                "ratio_to_httpx_sse",
                "note",
            ],
        )
    )
    print(
        "Heap per idle open stream (KiB):",
        {k: round(v, 1) for k, v in report["idle_stream_kib"].items()},
    )
    print("\nFirst call in a fresh process (imports excluded; median)")
    print(table(report["first_call"], ["consumer", "ms", "rss_added_mib", "ratio_to_httpx_sse"]))
    print(
        "\nPeak heap per stream (KiB):", {k: round(v) for k, v in report["peak_memory_kib"].items()}
    )
    print("\nToken ledger (µs per event)")
    print(
        table(
            report["ledger"],
            ["events", "ledger_us_per_event", "encode_each_delta_us", "reencode_whole_us"],
        )
    )
    print("\nRecovery (gap = fault detected → next new character, minus the backoff)")
    print(
        table(
            report["recovery"],
            [
                "scenario",
                "gap_ms",
                "held_chars",
                "hold_ms",
                "wasted_tokens",
                "exact",
                "restart_client_wasted",
            ],
        )
    )
    print("\nChaos soak")
    print(table([report["soak"]], list(report["soak"])))
    _print_dedup(report["dedup"])
    print("\nStall detection (default settings: the limit follows the stream's pace)")
    print(table(report["stalls"], ["stream", "stall_to_resume_s"]))
    print(
        "\nA request mix with 30 % repeats (half in other words), 20 at a time, upstream "
        "serving 5 at once"
    )
    print(
        table(
            report["cache"],
            [
                "setup",
                "answers",
                "upstream_requests",
                "capacity_errors",
                "failed_answers",
                "saved",
                "semantic_hits",
                "wrong_answers",
            ],
        )
    )
    _print_semantic(report["semantic"])
    print("\nShared state: what an answer costs (sequential answers, a limit of 8)")
    print(table(report["shared"], ["setup", "ttft_p50_ms", "round_trips_per_answer", "note"]))
    print("\nHostile upstreams (one attempt, client process peak RSS)")
    print(table(report["hostile"], ["attack", "outcome", "seconds", "peak_rss_mib"]))
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"\nwritten to {args.json}")
    exact = all(r["exact"] for r in report["recovery"])
    return 0 if exact and report["soak"]["exact_or_exact_partial"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
