"""``streamres bench resume``: what picking an answer up again costs, as a client sees it.

Through ``streamres proxy`` on loopback (the embedded upstream behind it, no faults), each
answer is read for a few events, dropped, and read on with ``Last-Event-ID`` on a new
connection. Measured per setup: the time from the resume request to its first event (p50,
p99), beside the time to the first event of a new answer in the same run (the baseline a
client would pay asking again — before any of the answer was generated again); the memory an
ended answer holds while it is kept; and, with Redis, the writes per answer and what writing
through costs a new answer's first event. Setups: the answer held in the same process; read on
through another proxy sharing Redis (a shadow of the answer, made on the first read there).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio
import httpx

from streamres.benchmarks.common import redis_server, summary
from streamres.benchmarks.table import table

__all__ = ["main", "resume"]

_BODY = {"model": "demo", "stream": True}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1e3


def _texts(raw: bytes, upto: int | None = None) -> str:
    """The answer's text in SSE events (those numbered up to ``upto``)."""
    out = []
    for block in raw.split(b"\n\n"):
        number, data = None, b""
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                number = int(line[4:])
            elif line.startswith(b"data: {"):
                data = line[6:]
        if number is None or not data or (upto is not None and number > upto):
            continue
        for choice in json.loads(data).get("choices", []):
            out.append(choice["delta"].get("content") or "")
    return "".join(out)


async def _round(
    http: httpx.AsyncClient, start: str, again: str, i: int
) -> tuple[float, float, str, list[dict[str, str]]]:
    """One answer: its first event's time, then dropped after three events and read on
    (``again``): the resume's time to its first event; the text the client had; the
    question."""
    question = [{"role": "user", "content": f"Question {i}: how does TCP slow start work?"}]
    t = time.perf_counter()
    raw = b""
    async with http.stream(
        "POST", start + "/v1/chat/completions", json={**_BODY, "messages": question}
    ) as r:
        answer = r.headers["x-streamres-answer"]
        first = 0.0
        async for chunk in r.aiter_bytes():
            raw += chunk
            if not first and b"id: " in raw:
                first = time.perf_counter() - t
            if raw.count(b"id: ") >= 3:
                break
    url = f"{again}/v1/answers/{answer}/events"
    t = time.perf_counter()
    resumed = 0.0
    rest = b""
    async with http.stream("GET", url, headers={"last-event-id": "2"}) as r:
        async for chunk in r.aiter_bytes():  # to its end: nothing is left running
            rest += chunk
            if not resumed and b"id: " in chunk:
                resumed = time.perf_counter() - t
    return first, resumed, _texts(raw, 2) + _texts(rest), question


async def resume(answers: int = 200) -> list[dict[str, Any]]:
    from streamres.proxy.server.serve import running

    rows: list[dict[str, Any]] = []
    async with redis_server() as url, httpx.AsyncClient(timeout=60) as http:
        setups: list[tuple[str, str | None]] = [("same process", None)]
        if url is not None:
            setups.append(("another process, through Redis", url))
        for label, redis in setups:
            async with (
                running(port=0, faults="none", token_delay=0.002, redis=redis) as a,
                running(port=0, faults="none", token_delay=0.002, redis=redis) as b,
            ):
                again = a.url if redis is None else b.url
                await _round(http, a.url, again, -1)  # warm: connections, encodings
                firsts, resumes = [], []
                exact = 0
                assert a.upstream is not None
                for i in range(answers):
                    first, resumed, text, question = await _round(http, a.url, again, i)
                    firsts.append(first)
                    resumes.append(resumed)
                    exact += text == a.upstream.answer(question)
                held = a.proxy.answers
                await held.settled()
                shared = held.shared
                writes = (
                    shared.calls.get("write", 0) + shared.calls.get("begin", 0) if shared else 0
                )
                rows.append(
                    {
                        "setup": label,
                        "exact": f"{exact}/{answers}",
                        "new_first_event_p50_ms": _pct(firsts, 0.5),
                        "resume_first_event_p50_ms": _pct(resumes, 0.5),
                        "resume_p99_ms": _pct(resumes, 0.99),
                        "kept_kib_per_answer": held.held_bytes / max(1, len(held)) / 1024,
                        "redis_writes_per_answer": round(writes / (answers + 1), 1),
                    }
                )
        if url is None:
            rows.append({"setup": "another process, through Redis", "note": "no redis-server"})
    base = rows[0]["new_first_event_p50_ms"]
    for row in rows:
        if "new_first_event_p50_ms" in row:
            row["write_through_cost"] = f"{row['new_first_event_p50_ms'] / base:.2f}x"
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench resume", description=summary(__doc__))
    p.add_argument("--answers", type=int, default=200, help="answers per setup")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = anyio.run(resume, args.answers)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    print(f"Reading an answer on after a drop ({args.answers} answers per setup, loopback)")
    print(table(rows))
    return 0
