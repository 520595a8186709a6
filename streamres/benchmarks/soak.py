"""A chaos soak: many concurrent streams through connect, mid-stream and stall faults; every
answer exact or an exact partial. Part of ``streamres bench``."""

from __future__ import annotations

import resource
from typing import Any

import anyio

import streamres
from streamres.upstream import answer_for


async def soak(url: str, streams: int, seconds: float) -> dict[str, Any]:
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
