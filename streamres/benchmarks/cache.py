"""A request mix with repeats (half in other words) through single-flight, the exact and the
semantic cache. Part of ``streamres bench``."""

from __future__ import annotations

from typing import Any

import anyio

import streamres
from streamres.upstream import Upstream

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


async def cache_replay(requests: int = 120, repeats: float = 0.3) -> list[dict[str, Any]]:
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
