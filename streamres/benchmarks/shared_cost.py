"""What shared state costs an answer: first token and Redis round trips, against local
limits. Part of ``streamres bench``."""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any

import anyio

import streamres
from streamres.benchmarks.common import redis_server
from streamres.upstream import Upstream


async def shared_cost(answers: int = 40) -> list[dict[str, Any]]:
    """What shared state costs an answer: Redis round trips (counted by the server) and time to
    first token, with a shared limit and with an in-process one (a local redis-server)."""
    async with redis_server() as url:
        if url is None:
            return [{"setup": "shared", "note": "redis-server is not installed"}]
        return await _measure(url, answers)


async def _measure(url: str, answers: int) -> list[dict[str, Any]]:
    rows = []

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
    return rows
