"""A client key's limits hold for every path that costs upstream work or memory: background
answers, answers still running after their reader went, answers read again, and the readers of
one answer — against the proxy on loopback, the embedded upstream behind it."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import Upstream
from tests.helpers.answers import Q, read_on, sse_events, text_of

pytestmark = pytest.mark.anyio

AUTH = {"authorization": "Bearer key-a"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(up: Upstream, limit: int, **answers: Any) -> Any:
    raw = {
        "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
        "clients": [{"name": "a", "key_env": "A_KEY", "max_in_flight": limit}],
        "answers": answers,
    }
    return parse(raw, {"A_KEY": "key-a"})


async def test_background_answers_count_until_they_end() -> None:
    """A key with ``max_in_flight = 2`` sends 20 background responses at once: two are
    accepted and run, the rest are told 429 with Retry-After; the upstream never has more than
    two at once; once those end, the key may start another."""
    async with (
        Upstream(token_delay=0.02) as up,
        running(_config(up, 2), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        body = {"model": "m", "input": Q[0]["content"], "background": True}
        statuses: list[int] = []

        async def one() -> None:
            r = await http.post(run.url + "/v1/responses", json=body, headers=AUTH)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
        assert sorted(statuses) == [200, 200] + [429] * 18
        await run.proxy.answers.settled()
        assert up.peak_in_flight() == 2
        again = await http.post(run.url + "/v1/responses", json=body, headers=AUTH)
        assert again.status_code == 200


async def test_a_stream_dropped_after_its_first_event_counts_while_it_runs() -> None:
    """Two streams dropped after their first event keep running for their reader's return
    (``hold``): they are still the key's two answers in flight, so a third is a 429 — until
    they stop running."""
    async with (
        Upstream(token_delay=0.02) as up,
        running(_config(up, 2, hold=30), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        body = {"model": "m", "messages": Q, "stream": True}
        answers = []
        for _ in range(2):
            async with http.stream(
                "POST", run.url + "/v1/chat/completions", json=body, headers=AUTH
            ) as r:
                answers.append(r.headers["x-streamres-answer"])
                async for _ev in sse_events(r):
                    break  # the reader goes; the answer runs on
        third = await http.post(run.url + "/v1/chat/completions", json=body, headers=AUTH)
        assert third.status_code == 429
        for answer in answers:  # read to their end: then they stop running
            await read_on(http, run.url, answer, None, **AUTH)
        await run.proxy.answers.settled()
        fourth = await http.post(run.url + "/v1/chat/completions", json=body, headers=AUTH)
        assert fourth.status_code == 200


async def test_an_answer_read_again_runs_again_within_the_limit() -> None:
    """With ``hold = 0`` an answer whose reader went is parked (nothing runs); read again it
    runs again, so it needs one of its key's slots: with the key's one slot taken by another
    answer, the resume is a 429 — and once that answer ended, the resume reads on exact."""
    async with (
        Upstream(token_delay=0.03) as up,
        running(_config(up, 1, hold=0), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        body = {"model": "m", "messages": Q, "stream": True}
        async with http.stream(
            "POST", run.url + "/v1/chat/completions", json=body, headers=AUTH
        ) as r:
            parked = r.headers["x-streamres-answer"]
            first = [ev async for ev in _first(sse_events(r), 3)]
        with anyio.fail_after(5):
            await up.wait_streams_done()
        other = {**body, "messages": [{"role": "user", "content": "And why?"}]}
        async with http.stream(
            "POST", run.url + "/v1/chat/completions", json=other, headers=AUTH
        ) as busy:  # the key's one slot: this answer, being read
            assert busy.status_code == 200
            refused = await http.get(
                f"{run.url}/v1/answers/{parked}/events",
                headers={**AUTH, "last-event-id": first[-1]["id"]},
            )
            assert refused.status_code == 429
            await busy.aread()
        await run.proxy.answers.settled()
        rest = await read_on(http, run.url, parked, first[-1]["id"], **AUTH)
        assert rest and int(rest[0]["id"]) == int(first[-1]["id"]) + 1


async def test_one_answer_has_a_bounded_number_of_readers() -> None:
    """``max_readers = 2``: two readers of one answer are served, a third at once is told 429
    (each reader is sent the whole answer: a crowd of them is memory, not a person's tabs)."""
    async with (
        Upstream(token_delay=0.05) as up,
        running(_config(up, 4, max_readers=2), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        body = {"model": "m", "messages": Q, "stream": True}
        async with http.stream(
            "POST", run.url + "/v1/chat/completions", json=body, headers=AUTH
        ) as r:
            answer = r.headers["x-streamres-answer"]
            async with http.stream(
                "GET", f"{run.url}/v1/answers/{answer}/events", headers=AUTH
            ) as second:
                assert second.status_code == 200
                third = await http.get(f"{run.url}/v1/answers/{answer}/events", headers=AUTH)
                assert third.status_code == 429 and "readers" in third.text


async def _first(events: Any, n: int) -> Any:
    got = 0
    async for ev in events:
        yield ev
        got += 1
        if got == n:
            return


async def test_held_answers_are_bounded_in_bytes_and_one_key_cannot_evict_another() -> None:
    """Key ``a`` floods the proxy with answers (each read to its end, kept for ``keep``): the
    bytes held stay within ``max_bytes`` and ``a``'s within its ``max_bytes_per_key`` (its
    own oldest answers forgotten first; past them by at most the answer running), while key
    ``b``'s one answer is kept and read again whole."""
    async with Upstream(token_delay=0, words=300, framing="event") as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key_env": "B_KEY"}],
            "answers": {"max_bytes": 150_000, "max_bytes_per_key": 100_000},
        }
        config = parse(raw, {"A_KEY": "key-a", "B_KEY": "key-b"})
        b_auth = {"authorization": "Bearer key-b"}
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            answers = run.proxy.answers
            body = {"model": "m", "messages": Q, "stream": True}
            kept = await http.post(run.url + "/v1/chat/completions", json=body, headers=b_auth)
            b_answer = kept.headers["x-streamres-answer"]
            one = answers.find(b_answer, "b")
            assert one is not None and 12_000 < one.weight < 50_000  # what the bounds assume
            for i in range(30):
                flood = {**body, "messages": [{"role": "user", "content": f"Question {i}?"}]}
                r = await http.post(run.url + "/v1/chat/completions", json=flood, headers=AUTH)
                assert r.status_code == 200, (i, r.text)
                # Room is made before an answer starts: what held answers add after that is
                # bounded by the answers running (here one at a time).
                held = list(answers._held.values())
                assert answers.held_bytes == sum(h.weight for h in held)  # counted as they grow
                assert answers.held_bytes <= 150_000 + one.weight
                assert sum(h.weight for h in held if h.owner == "a") <= 100_000 + one.weight
            assert answers.find(b_answer, "b") is one
            again = await read_on(http, run.url, b_answer, None, **b_auth)
            assert "".join(text_of(e) for e in again) == up.answer(Q)
