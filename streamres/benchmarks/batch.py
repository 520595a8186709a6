"""``streamres bench batch``: batch work against a shared quota, measured as users see it.

Three measurements, all on the embedded upstream (loopback, offline):

1. **The seed's case** — 20 requests fired at once at an account that serves 5 at a time (more
   get 429): one plain request each with no retry (what a loop of SDK calls with retries off
   gets), streamres without limits (it retries its way through the refusals), streamres with
   ``account_limits`` of 5, and ``streamres.run_batch``. Success rate, refusals the upstream
   gave, upstream requests per answer, wall time.
2. **A batch through the storm** — N requests through a sustained seeded fault storm: exact
   answers, upstream requests per answer, retries and resumes, wall time.
3. **A person while a batch saturates the account** — a batch keeps every slot of the account
   busy (and more answers waiting); a person asks a question every so often: their time to first
   token, p50 and p95, with the batch at low priority (lanes) and at the person's own priority
   (first come, first served).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog

import streamres
from streamres.benchmarks.common import summary
from streamres.benchmarks.table import table
from streamres.upstream import FaultPlan, ModelSpec, Upstream

__all__ = ["main", "run"]


def _q(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Request {i}: summarise the report on congestion."}]


def _lines(n: int) -> list[str]:
    return [json.dumps({"id": f"r{i}", "messages": _q(i)}) for i in range(n)]


def _refused(up: Upstream) -> int:
    return sum(r.status != 200 for r in up.requests)


async def _plain_no_retry(n: int, quota: int, words: int, delay: float) -> dict[str, Any]:
    async with (
        Upstream(
            models={"m": ModelSpec(max_in_flight=quota)}, token_delay=delay, words=words
        ) as up,
        httpx.AsyncClient(timeout=60) as http,
    ):
        ok = 0
        started = time.perf_counter()

        async def one(i: int) -> None:
            nonlocal ok
            body = {"model": "m", "messages": _q(i), "stream": True}
            async with http.stream("POST", up.openai_url + "/chat/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass
                ok += r.status_code == 200

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        wall = time.perf_counter() - started
        return _row("one request each, no retry", n, ok, up, wall, exact=None)


def _row(
    setup: str, n: int, ok: int, up: Upstream, wall: float, *, exact: int | None
) -> dict[str, Any]:
    return {
        "setup": setup,
        "requests": n,
        "success_rate": round(ok / n, 3),
        "exact": "—" if exact is None else f"{exact}/{n}",
        "refusals": _refused(up),
        "upstream_per_answer": round(len(up.requests) / n, 2),
        "wall_s": round(wall, 2),
    }


async def _through_streamres(
    n: int, quota: int, words: int, delay: float, setup: str
) -> dict[str, Any]:
    async with Upstream(
        models={"m": ModelSpec(max_in_flight=quota)}, token_delay=delay, words=words
    ) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        limits = {"acct": quota} if setup != "streamres, no limits" else {}
        async with streamres.Client(
            [route],
            account_limits=limits,
            backoff=streamres.Backoff(initial=0.2, maximum=2.0),
            deadline=120,
        ) as client:
            started = time.perf_counter()
            texts: dict[int, str] = {}
            if setup == "streamres batch":
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "results.jsonl"
                    summary = await streamres.run_batch(client, _lines(n), out)
                    records = [json.loads(x) for x in out.read_text().splitlines()]
                texts = {int(r["id"][1:]): r.get("text", "") for r in records if r["ok"]}
                ok = summary.answered
            else:
                ok = 0

                async def one(i: int) -> None:
                    nonlocal ok
                    text = ""
                    try:
                        async for ev in client.stream(_q(i), model="m"):
                            if ev.type == "text":
                                text += ev.text
                    except streamres.StreamError:
                        return
                    ok += 1
                    texts[i] = text

                async with anyio.create_task_group() as tg:
                    for i in range(n):
                        tg.start_soon(one, i)
            wall = time.perf_counter() - started
        exact = sum(t == up.answer(_q(i)) for i, t in texts.items())
        return _row(setup, n, ok, up, wall, exact=exact)


async def seed_case(n: int = 20, quota: int = 5) -> list[dict[str, Any]]:
    words, delay = 60, 0.01
    rows = [await _plain_no_retry(n, quota, words, delay)]
    for setup in ("streamres, no limits", "streamres, account limit", "streamres batch"):
        rows.append(await _through_streamres(n, quota, words, delay, setup))
    return rows


async def storm(n: int = 1000, seed: int = 7) -> dict[str, Any]:
    plan = FaultPlan.storm(connect=0.1, midstream=0.2, stall=0.02, seed=seed)
    async with Upstream(models={"m": ModelSpec(faults=plan)}, ping_interval=0.05) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client(
            [route],
            account_limits={"acct": 32},
            stall_timeout=0.5,
            backoff=streamres.Backoff(initial=0.05, maximum=0.5),
            breaker_threshold=10_000,
            deadline=300,
        ) as client:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "results.jsonl"
                started = time.perf_counter()
                summary = await streamres.run_batch(client, _lines(n), out, when="always")
                wall = time.perf_counter() - started
                records = [json.loads(x) for x in out.read_text().splitlines()]
        exact = sum(r["ok"] and r["text"] == up.answer(_q(int(r["id"][1:]))) for r in records)
        return {
            "requests": n,
            "answered": summary.answered,
            "exact": f"{exact}/{n}",
            "upstream_per_answer": round(len(up.requests) / n, 2),
            "retries": summary.retries,
            "resumes": summary.resumes,
            "wall_s": round(wall, 1),
        }


async def person_while_batch(
    batch: int = 120, slots: int = 4, asks: int = 12, lanes: bool = True
) -> dict[str, Any]:
    """Time to first token of a person's questions while a batch fills the account."""
    async with Upstream(token_delay=0.004, words=60) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client([route], account_limits={"acct": slots}) as client:
            ttfts: list[float] = []

            async def person() -> None:
                with anyio.fail_after(120):
                    while len(up.requests) < slots * 2:  # noqa: ASYNC110 (the batch under way)
                        await anyio.sleep(0.01)
                for i in range(asks):
                    started = time.perf_counter()
                    async for ev in client.stream([{"role": "user", "content": f"chat {i}"}]):
                        if ev.type == "text" and len(ttfts) == i:
                            ttfts.append(time.perf_counter() - started)
                    await anyio.sleep(0.2)

            with tempfile.TemporaryDirectory() as tmp:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(person)
                    await streamres.run_batch(
                        client,
                        _lines(batch),
                        Path(tmp) / "results.jsonl",
                        concurrency=slots * 4,  # more answers waiting than slots
                        priority="low" if lanes else "normal",
                    )
    ttfts.sort()
    return {
        "batch_priority": "low (lanes)" if lanes else "normal (first come)",
        "person_asks": len(ttfts),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000),
        "ttft_p95_ms": round(ttfts[max(0, int(len(ttfts) * 0.95) - 1)] * 1000),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    return {
        "seed_case": await seed_case(),
        "storm": await storm(200 if quick else 1000),
        "person": [
            await person_while_batch(batch=100 if quick else 200, lanes=True),
            await person_while_batch(batch=100 if quick else 200, lanes=False),
        ],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench batch", description=summary(__doc__))
    p.add_argument("--quick", action="store_true", help="a 200-request storm, a shorter batch")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    report = anyio.run(run, args.quick)
    print("The seed's case: 20 requests at once, an account serving 5 at a time (429 beyond)")
    print(table(report["seed_case"], list(report["seed_case"][0])))
    print("\nA batch through a sustained fault storm")
    print(table([report["storm"]], list(report["storm"])))
    print("\nA person's time to first token while a batch saturates the account (4 slots)")
    print(table(report["person"], list(report["person"][0])))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    exact = report["storm"]["exact"].split("/")
    return 0 if exact[0] == exact[1] else 1
