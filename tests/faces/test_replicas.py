"""Answers across proxy replicas sharing one real Redis: an answer that moved between them, a
stop pressed on another, Redis restarted empty or paused, a producer stalled past its lease,
a crowd of resumes on a replica that does not hold the answer, a resume at the end.

Each is read as a client reads it (SSE over loopback, ``Last-Event-ID``): every event once,
numbered on, the text exactly the upstream's, and each part of the answer produced once.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from openai import AsyncOpenAI

from streamres.proxy.server.serve import running
from streamres.upstream import Upstream
from tests.helpers.answers import (
    Q,
    asked,
    assert_exact,
    begin,
    proxy_process,
    read_on,
    shared_config,
    sse_block,
    sse_events,
    start_answer,
    text_of,
)
from tests.helpers.redis import connected

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn and the official SDK run on asyncio


def _question(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


async def _parked(run: Any, answer: str, up: Upstream) -> None:
    """Wait until ``run`` parked the answer (nobody read it for ``hold``) and gave its lease up."""
    with anyio.fail_after(10):
        await up.wait_streams_done()
        await _released_by(run, answer)


async def _released_by(run: Any, answer: str) -> None:
    held = run.proxy.answers.find(answer, None)
    while not _released(held):
        await held.moved()  # told of each write, and of the park


def _released(held: Any) -> bool:
    """Parked, with everything it made written to Redis."""
    return held is not None and held.parked and not held.producing and not held.outbox


async def _read_some(
    http: httpx.AsyncClient, url: str, answer: str, last: str, upto: int
) -> list[dict[str, Any]]:
    """Read on after ``last`` for ``upto`` events, then go."""
    got: list[dict[str, Any]] = []
    headers = {"last-event-id": last}
    async with http.stream("GET", f"{url}/v1/answers/{answer}/events", headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for ev in sse_events(r):
            got.append(ev)
            if len(got) == upto:
                break
    return got


async def _read_when_found(
    http: httpx.AsyncClient, url: str, answer: str, last: str | None
) -> tuple[list[dict[str, Any]], list[int]]:
    """Read on, as a client that honours 503 and ``Retry-After`` does: the events, and the
    statuses it was told before."""
    told: list[int] = []
    headers = {} if last is None else {"last-event-id": last}
    with anyio.fail_after(40):
        while True:
            async with http.stream(
                "GET", f"{url}/v1/answers/{answer}/events", headers=headers
            ) as r:
                if r.status_code == 200:
                    return [ev async for ev in sse_events(r)], told
                await r.aread()
                told.append(r.status_code)
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"]
            await anyio.sleep(0.5)


async def test_an_answer_that_moved_is_read_on_where_it_began(redis_server: Any) -> None:
    """Parked on A (the person away past ``hold``), continued to its end on B, then read on A
    again — with ``Last-Event-ID`` and by a reload: A reads the shared log over its own older
    copy, each read is exact, and the upstream was asked twice (A's start, B's continuation),
    never a third time."""
    async with Upstream(token_delay=0.02) as up:
        config = shared_config(up, hold=0.2)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            question = "Explain TCP slow start in a few sentences."
            whole = up.answer(_question(question))
            answer, first = await begin(http, a.url, question, upto=4)
            await _parked(a, answer, up)
            on_b = await read_on(http, b.url, answer, first[-1]["id"])  # to its end
            assert_exact(first + on_b, whole)
            assert asked(up, question) == 2
            # Back on A: from where A had left it, and from the start (a reload).
            again = await read_on(http, a.url, answer, first[-1]["id"])
            assert_exact(first + again, whole)
            reload = await read_on(http, a.url, answer, None)
            assert_exact(reload, whole)
            assert asked(up, question) == 2


async def test_an_answer_parked_twice_goes_on_from_its_longest_copy(redis_server: Any) -> None:
    """Parked on A, continued a little on B and parked there too, then asked for on A: A takes
    it on from everything B added (not from its own shorter copy) — exact, and every
    continuation the upstream saw carries all that was delivered before it."""
    async with Upstream(token_delay=0.03) as up:
        config = shared_config(up, hold=0.2)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            question = "Why do rivers meander across flat plains?"
            whole = up.answer(_question(question))
            answer, first = await begin(http, a.url, question, upto=4)
            await _parked(a, answer, up)
            middle = await _read_some(http, b.url, answer, first[-1]["id"], upto=6)
            with anyio.fail_after(10):
                await _released_by(b, answer)
            b_text = b.proxy.answers.find(answer, None).log.text
            rest = await read_on(http, a.url, answer, middle[-1]["id"])
            assert_exact(first + middle + rest, whole)
            assert asked(up, question) == 3
            last = json.dumps(up.requests[-1].body, ensure_ascii=False)
            assert b_text[-30:] in last  # A went on from B's text


async def test_stop_on_a_parked_answer_stops_it_everywhere(redis_server: Any) -> None:
    """Stop pressed through B on an answer parked on A: it ends ``cancelled`` with its partial
    on both, read on either it ends there, and the upstream is not asked again."""
    async with Upstream(token_delay=0.02) as up:
        config = shared_config(up, hold=0.2)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            answer, first = await begin(http, a.url, Q[0]["content"], upto=4)
            await _parked(a, answer, up)
            stopped = await http.post(f"{b.url}/v1/answers/{answer}/stop")
            assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
            for url in (a.url, b.url):
                state = (await http.get(f"{url}/v1/answers/{answer}")).json()
                assert state["status"] == "cancelled", url
                assert state["text"] and up.answer(Q).startswith(state["text"])
                rest = await read_on(http, url, answer, first[-1]["id"])
                assert "".join(text_of(e) for e in first + rest) == state["text"]
            assert len(up.requests) == 1


async def test_redis_restarted_empty_mid_answer(redis_server: Any) -> None:
    """Redis restarts empty while A streams an answer. A reader moving to B meanwhile, as a
    browser's ``EventSource`` does — one request; any status but 200 ends it — is held until
    A has written the answer again, then given the rest, exact: no 503, no 404 for an answer
    that exists, and the upstream asked once."""
    async with Upstream(token_delay=0.04) as up:
        config = shared_config(up)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=60) as http,
        ):
            question = "How does a refrigerator move heat out of its box?"
            answer, first = await begin(http, a.url, question, upto=4)
            redis_server.stop()
            rest: list[dict[str, Any]] = []

            async def reload() -> None:
                headers = {"last-event-id": first[-1]["id"]}
                url = f"{b.url}/v1/answers/{answer}/events"
                async with http.stream("GET", url, headers=headers) as r:
                    assert r.status_code == 200, await r.aread()
                    rest.extend([ev async for ev in sse_events(r)])

            async with anyio.create_task_group() as tg:
                tg.start_soon(reload)
                redis_server.start()
            assert_exact(first + rest, up.answer(_question(question)))
            assert asked(up, question) == 1


async def test_a_resume_that_cannot_be_looked_up_in_time_is_a_503(redis_server: Any) -> None:
    """Past ``[answers] resume_wait`` with Redis still away, a replica that does not hold the
    answer says 503 with Retry-After — never a 404 for an answer that may exist."""
    async with Upstream(token_delay=0.04) as up:
        config = shared_config(up)
        waits = dataclasses.replace(config.answers, resume_wait=0.5)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url, answers=waits) as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            answer, _ = await begin(http, a.url, "Why is the sky blue?", upto=4)
            redis_server.stop()
            gone = await http.get(
                f"{b.url}/v1/answers/{answer}/events", headers={"last-event-id": "0"}
            )
            assert gone.status_code == 503 and gone.headers["retry-after"]
            redis_server.start()


async def test_redis_paused_past_the_lease_mid_answer(redis_server: Any) -> None:
    """Redis stops answering for 4 s (past the 3 s lease) while A streams: A's reader is served
    from A alone meanwhile, then moves to B, which gives the rest exact; nobody adopted the
    answer (the upstream asked once), and A wrote on once Redis was back."""
    import coredis

    async with Upstream(token_delay=0.05) as up:
        config = shared_config(up)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
            coredis.Redis.from_url(redis_server.url) as r,
        ):
            question = "What makes a bridge stand under its own weight?"
            answer, first = await begin(http, a.url, question, upto=3)
            await r.client_pause(4000, coredis.PureToken.ALL)
            more = await _read_some(http, a.url, answer, first[-1]["id"], upto=60)
            rest, _ = await _read_when_found(http, b.url, answer, more[-1]["id"])
            assert_exact(first + more + rest, up.answer(_question(question)))
            assert asked(up, question) == 1
            assert a.proxy.client._shared_state.outages >= 1


async def test_a_crowd_of_resumes_on_a_replica_that_does_not_hold_the_answer(
    redis_server: Any,
) -> None:
    """200 readers at once ask B for a large answer A produced: each gets it whole, B looks it
    up in Redis once for all of them, and B's shared state stays up (no 404 for anyone)."""
    async with Upstream(token_delay=0, words=4000) as up:
        config = shared_config(up)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as http,
        ):
            question = "Tell the long history of the printing press."
            whole = up.answer(_question(question))
            answer, _ = await begin(http, a.url, question, upto=1)
            await a.proxy.answers.settled()
            shared = b.proxy.answers.shared
            assert shared is not None
            got: list[list[dict[str, Any]]] = []

            async def one() -> None:
                got.append(await read_on(http, b.url, answer, None))

            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(one)
            assert len(got) == 200
            for every in got:
                assert_exact(every, whole)
            assert shared.calls.get("meta") == 1
            assert b.proxy.client._shared_state.connected
            assert b.proxy.client._shared_state.outages == 0


async def test_a_resume_at_the_end_is_a_clean_end() -> None:
    """A reader that already has the whole answer asks again from its last event — what a
    browser's ``EventSource`` does at the end of every stream, and the official SDK's
    ``responses.retrieve(…, stream=True, starting_after=last)``: an empty end (204 for
    ``Last-Event-ID``), never a 503 to retry."""
    async with (
        running(port=0, faults="none", token_delay=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        answer, every = await start_answer(http, run.url, "openai", upto=10_000)
        end = await http.get(
            f"{run.url}/v1/answers/{answer}/events", headers={"last-event-id": every[-1]["id"]}
        )
        assert end.status_code == 204 and end.content == b""
        response, events = await start_answer(http, run.url, "responses", upto=10_000)
        last = int(events[-1]["id"])
        async with AsyncOpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0) as sdk:
            again = await sdk.responses.retrieve(response, stream=True, starting_after=last)
            assert [ev async for ev in again] == []


async def test_a_producer_stalled_past_its_lease_stands_down(
    redis_server: Any, tmp_path: Path
) -> None:
    """Two ``streamres proxy`` processes on a real Redis; A streams answers to its readers, and
    the same answers are read through B too. A is stopped (SIGSTOP) for longer than its lease:
    B adopts them. When A wakes its writes are refused, it stops producing and its readers
    read on from the shared log — every reader on either exact, each answer produced by one
    process at a time (at most its start and one continuation)."""
    async with Upstream(token_delay=0.04) as up:
        (tmp_path / "routes.toml").write_text(
            "[[routes]]\n"
            f'name = "m"\nmodel = "m"\nbase_url = "{up.openai_url}"\n'
            "[answers]\nhold = 30\n",
            encoding="utf-8",
        )

        config = tmp_path / "routes.toml"
        (a, a_url) = await proxy_process(config, redis_server.url)
        (b, b_url) = await proxy_process(config, redis_server.url)
        try:
            questions = [f"Question {i}: why does ice float on water?" for i in range(6)]
            on_a: dict[str, list[dict[str, Any]]] = {}
            on_b: dict[str, list[dict[str, Any]]] = {}
            ids: dict[str, str] = {}
            started = 0
            all_started = anyio.Event()
            async with httpx.AsyncClient(timeout=90) as http:

                async def one(q: str) -> None:
                    nonlocal started
                    body = {"model": "m", "messages": _question(q), "stream": True}
                    events: list[dict[str, Any]] = []
                    async with http.stream("POST", a_url + "/v1/chat/completions", json=body) as r:
                        answer = ids[q] = r.headers["x-streamres-answer"]
                        async with anyio.create_task_group() as tg:

                            async def also_on_b() -> None:
                                on_b[q] = await read_on(http, b_url, answer, None)

                            async for ev in sse_events(r):
                                events.append(ev)
                                if len(events) == 3:
                                    tg.start_soon(also_on_b)
                                    started += 1
                                    if started == len(questions):
                                        all_started.set()
                    on_a[q] = events

                async with anyio.create_task_group() as tg:
                    for q in questions:
                        tg.start_soon(one, q)
                    with anyio.fail_after(60):
                        await all_started.wait()
                    a.send_signal(signal.SIGSTOP)
                    await anyio.sleep(4.5)
                    a.send_signal(signal.SIGCONT)
            for q in questions:
                whole = up.answer(_question(q))
                assert_exact(on_a[q], whole)
                assert_exact(on_b[q], whole)
                assert asked(up, q) <= 2
                # One writer at a time: each entry of the answer's log begins where the one
                # before it ended (two producers would each write on from their own count).
                async with connected(redis_server.url) as redis:
                    (log,) = [k for k in await redis.keys(f"*{ids[q]}*") if k.endswith(b":log")]
                    entries = [dict(e.field_values) for e in await redis.xrange(log)]
                at = 0
                for entry in entries:
                    assert int(entry[b"at"]) == at, (q, entries)
                    at += len(json.loads(entry[b"e"]))
        finally:
            for process in (a, b):
                if process.returncode is None:
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                await process.wait()


async def test_ended_answers_are_written_again_after_redis_lost_them(redis_server: Any) -> None:
    """An answer ended on A, then Redis restarted empty: A writes it again, and B reads it
    whole."""
    async with Upstream(token_delay=0) as up:
        config = shared_config(up)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            question = "Why is the sky blue at noon and red at dusk?"
            answer, _ = await begin(http, a.url, question, upto=1)
            await a.proxy.answers.settled()
            redis_server.stop()
            redis_server.start()
            every, _ = await _read_when_found(http, b.url, answer, None)
            assert_exact(every, up.answer(_question(question)))
            async with connected(redis_server.url) as r:
                assert await r.keys(f"*{answer}*")


async def test_a_short_soak_of_replicas_knocked_about(tmp_path: Path) -> None:
    """``streamres bench replicas``, short and seeded, as the command runs: three proxies on
    one Redis, people asking, dropping and reading on at random replicas while a replica is
    killed or stalled and Redis restarted or paused — every answer exact, each log one writer
    at a time."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    out = tmp_path / "soak.json"
    command = [sys.executable, "-m", "streamres", "bench", "replicas"]
    command += ["--seconds", "25", "--people", "6", "--seed", "1", "--json", str(out)]
    done = await anyio.run_process(command, check=False)
    row = json.loads(out.read_text(encoding="utf-8"))
    assert row["answers"] >= 6
    assert row["wrong"] == [], row
    assert row["exact"] == row["one_writer_at_a_time"] == row["answers"], row
    assert sum(v for k, v in row.items() if k.startswith("knock_")) >= 1, row
    assert done.returncode == 0, done.stdout.decode()


async def test_an_answer_parked_and_taken_on_again_while_redis_is_away(redis_server: Any) -> None:
    """Redis stops answering; meanwhile the answer's reader goes (the answer parks after its
    short hold) and comes back to the same replica, which produces the answer on. Once Redis
    answers again, the replica writes on as the answer's one writer — it never finds itself
    overtaken by its own earlier write — and readers on either replica get it exact."""
    import coredis

    async with Upstream(token_delay=0.05) as up:
        config = shared_config(up, hold=0.3)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=30) as http,
            coredis.Redis.from_url(redis_server.url) as r,
        ):
            question = "How do glaciers carve a valley into a U shape?"
            whole = up.answer(_question(question))
            answer, first = await begin(http, a.url, question, upto=3)
            await r.client_pause(4000, coredis.PureToken.ALL)
            held = a.proxy.answers.find(answer, None)
            assert held is not None
            with anyio.fail_after(10):
                while not held.parked:  # its hold passed: parked, its write still waiting
                    await held.moved()
            rest = await read_on(http, a.url, answer, first[-1]["id"])
            assert_exact(first + rest, whole)
            assert not held.lost and held.successor is None
            again, _ = await _read_when_found(http, b.url, answer, None)
            assert_exact(again, whole)


def test_a_reader_ahead_of_a_copy_gets_only_what_it_has_not() -> None:
    """A reader that read on elsewhere asks a copy that is behind it (a shadow catching up,
    a successor after a stand-down): as the copy grows, the reader gets the events past the
    one it named, never again those before it."""
    import streamres
    from streamres.proxy.answers.answer import Held
    from streamres.proxy.faces.inbound import parse
    from streamres.proxy.faces.outbound import Writer

    call = parse("openai", json.dumps({"model": "m", "messages": Q, "stream": True}).encode())
    held = Held(Writer(call, model="m"), call, None, ["m"], {}, None, 0.0)
    for word in ("one", " two", " three"):
        held.add(streamres.TextEvent(text=word))
    behind = held.last_number
    data, i = held.after(behind + 4)  # the reader has four events more than this copy
    assert data == b""
    for word in (" four", " five", " six", " seven", " eight", " nine"):
        held.add(streamres.TextEvent(text=word))
    data, _ = held.after(behind + 4, i)
    got = [e for b in data.decode().split("\n\n") if (e := sse_block(b)) is not None]
    assert [int(ev["id"]) for ev in got] == list(range(behind + 5, held.last_number + 1))
    assert text_of(got[0]) == " eight"
