"""Answers that outlive their connection: read again after a drop, a reload, a stop.

Against the proxy on loopback (the embedded upstream behind it), with plain HTTP as a browser's
``fetch`` sends it and with the official ``openai`` SDK's own background calls.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from openai import AsyncOpenAI

from streamres.proxy.config import HoldLimits, parse
from streamres.proxy.server.serve import running
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.answers import (
    BODIES,
    Q,
    asked,
    assert_exact,
    begin,
    proxy_process,
    read_on,
    shared_config,
    sse_events,
    start_answer,
    text_of,
    two_proxies,
)
from tests.helpers.network import relay
from tests.helpers.node import node_env
from tests.helpers.redis import EVERY_REDIS_ASYNCIO, connected

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the official SDKs and uvicorn run on asyncio


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
async def test_a_reader_that_comes_back_gets_exactly_the_rest(api: str) -> None:
    """The client goes after a few events and comes back with ``Last-Event-ID``: it gets
    exactly the events after it (numbered on, none twice, none missing), and the text is the
    upstream's fault-free answer; the upstream was asked once — the answer kept running."""
    async with (
        running(port=0, faults="none", token_delay=0.01) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        assert run.upstream is not None
        answer, first = await start_answer(http, run.url, api, upto=5)
        rest = await read_on(http, run.url, answer, first[-1]["id"])
        every = first + rest
        assert_exact(every, run.upstream.answer(Q))
        assert len(run.upstream.requests) == 1


async def test_a_reload_reads_the_whole_answer_again() -> None:
    """A page that reloads has lost what it showed: without ``Last-Event-ID`` it gets every
    event from the first, then the live ones."""
    async with (
        running(port=0, faults="none", token_delay=0.01) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        assert run.upstream is not None
        answer, first = await start_answer(http, run.url, "openai", upto=3)
        again = await read_on(http, run.url, answer, None)
        assert again[: len(first)] == first
        assert "".join(text_of(e) for e in again) == run.upstream.answer(Q)


async def test_an_answer_past_its_hold_is_continued_from_its_partial() -> None:
    """With no hold, the client going closes the upstream at once and parks the answer; the
    client coming back starts it again from what it had (a continuation of the partial, not
    the whole answer again), and the text is still exact."""
    async with (
        running(port=0, faults="none", token_delay=0.02, answers=HoldLimits(hold=0)) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        up = run.upstream
        assert up is not None
        answer, first = await start_answer(http, run.url, "openai", upto=6)
        with anyio.fail_after(5):
            await up.wait_streams_done()  # the upstream was closed: nobody reads
        held = run.proxy.answers.find(answer, None)
        assert held is not None and held.parked and held.log.text
        partial = held.log.text
        rest = await read_on(http, run.url, answer, first[-1]["id"])
        every = first + rest
        assert_exact(every, up.answer(Q))
        assert len(up.requests) == 2
        sent = json.dumps(up.requests[1].body, ensure_ascii=False)
        assert partial[:40] in sent  # the second request continues the partial


async def test_stop_ends_the_answer_and_closes_the_upstream() -> None:
    """``POST /v1/answers/{id}/stop``: the upstream sees its stream closed, the readers get
    the partial answer ended cleanly, and the answer says ``cancelled``."""
    async with (
        running(port=0, faults="none", token_delay=0.05) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        up = run.upstream
        assert up is not None
        path, body = BODIES["openai"]
        events: list[dict[str, Any]] = []
        async with http.stream("POST", run.url + path, json=body) as r:
            answer = r.headers["x-streamres-answer"]
            async for ev in sse_events(r):
                events.append(ev)
                if len(events) == 3:
                    stopped = await http.post(f"{run.url}/v1/answers/{answer}/stop")
                    assert stopped.status_code == 200
        with anyio.fail_after(2):  # the answer would take seconds more: only the stop ends it
            await up.wait_streams_done()
        assert events[-1]["data"] == "[DONE]"
        assert json.loads(events[-2]["data"])["choices"][0]["finish_reason"] == "stop"
        state = (await http.get(f"{run.url}/v1/answers/{answer}")).json()
        assert state["status"] == "cancelled"
        text = "".join(text_of(e) for e in events)
        assert text and state["text"] == text and up.answer(Q).startswith(text)


async def test_answers_are_their_keys_alone_and_bad_reads_are_refused() -> None:
    """Another client key is told the answer does not exist; no key is a 401; an unknown id
    a 404; a garbage or too-large ``Last-Event-ID`` a 400 — each in the API's error shape."""
    async with Upstream(token_delay=0) as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key_env": "B_KEY"}],
        }
        config = parse(raw, {"A_KEY": "key-a", "B_KEY": "key-b"})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            a = {"authorization": "Bearer key-a"}
            r = await http.post(
                run.url + "/v1/chat/completions",
                json={"model": "m", "messages": Q, "stream": True},
                headers=a,
            )
            answer = r.headers["x-streamres-answer"]
            last = max(int(e.split("\n")[0][4:]) for e in r.text.split("\n\n") if e[:4] == "id: ")
            events = f"{run.url}/v1/answers/{answer}/events"
            assert (await http.get(events, headers=a)).status_code == 200
            other = await http.get(events, headers={"authorization": "Bearer key-b"})
            assert other.status_code == 404
            assert answer not in other.text and "error" in other.json()
            assert (await http.get(events)).status_code == 401
            unknown = await http.get(f"{run.url}/v1/answers/chatcmpl-{'0' * 32}/events", headers=a)
            assert unknown.status_code == 404
            for bad in ("abc", "-1", "1e9", "9" * 40, str(last + 1)):
                got = await http.get(events, headers={**a, "last-event-id": bad})
                assert got.status_code == 400, bad
                assert "Last-Event-ID" in got.json()["error"]["message"]
            stop = await http.post(
                f"{run.url}/v1/answers/{answer}/stop", headers={"authorization": "Bearer key-b"}
            )
            assert stop.status_code == 404
            msg = await http.get(f"{run.url}/v1/answers/msg_{'0' * 32}", headers=a)
            assert msg.status_code == 404 and msg.json()["type"] == "error"


async def test_the_openai_sdk_resumes_a_background_response() -> None:
    """The official SDK's own calls: ``responses.create(background=True, stream=True)`` read
    to event N and dropped; ``responses.retrieve(id, stream=True, starting_after=N)`` gives
    exactly the rest; the whole text is the upstream's fault-free answer."""
    async with (
        running(port=0, faults="none", token_delay=0.01) as run,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="k") as sdk,
    ):
        assert run.upstream is not None
        stream = await sdk.responses.create(
            model="demo", input=Q[0]["content"], background=True, stream=True
        )
        text, seqs, rid = "", [], ""
        async for ev in stream:
            seqs.append(ev.sequence_number)
            if ev.type == "response.created":
                rid = ev.response.id
            elif ev.type == "response.output_text.delta":
                text += ev.delta
            if len(seqs) == 6:
                break
        await stream.close()
        again = await sdk.responses.retrieve(rid, stream=True, starting_after=seqs[-1])
        async for ev in again:
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            last = ev
        assert seqs == list(range(len(seqs)))
        assert last.type == "response.completed"
        assert text == run.upstream.answer(Q) == last.response.output_text
        done = await sdk.responses.retrieve(rid)
        assert done.status == "completed" and done.output_text == text
        assert len(run.upstream.requests) == 1


async def test_the_openai_sdk_cancels_a_background_response() -> None:
    """``responses.cancel(id)``: the upstream sees its stream closed, the response says
    ``cancelled`` and keeps the partial output; a background answer not streamed runs to
    its end with nobody reading, and ``retrieve`` gives it whole."""
    async with (
        running(port=0, faults="none", token_delay=0.05) as run,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="k") as sdk,
    ):
        up = run.upstream
        assert up is not None
        queued = await sdk.responses.create(model="demo", input=Q[0]["content"], background=True)
        assert queued.status in ("queued", "in_progress") and queued.background
        with anyio.fail_after(10):
            # Polled, as OpenAI's guide to background responses does.
            while not (now := await sdk.responses.retrieve(queued.id)).output_text:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        cancelled = await sdk.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        with anyio.fail_after(2):
            await up.wait_streams_done()
        kept = await sdk.responses.retrieve(queued.id)
        assert kept.status == "cancelled"
        assert kept.output_text.startswith(now.output_text)
        assert up.answer(Q).startswith(kept.output_text) and kept.output_text != up.answer(Q)

        whole = await sdk.responses.create(model="demo", input="Why?", background=True)
        with anyio.fail_after(30):
            while (got := await sdk.responses.retrieve(whole.id)).status != "completed":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert got.output_text == up.answer([{"role": "user", "content": "Why?"}])


@pytest.mark.parametrize("hold", [0.0, 30.0])
async def test_a_thousand_readers_that_come_and_go(hold: float) -> None:
    """Many answers at once, each read by a client that drops at a random event and comes
    back (with ``Last-Event-ID``, or from the start as a reload) one or more times: every
    answer exact — held for its reader, or (no hold) parked and continued from its partial;
    after ``keep`` nothing is held. Seeded; ``STREAMRES_RESUME_SOAK`` sets the count (a
    thousand in the soak command)."""
    import os

    count = int(os.environ.get("STREAMRES_RESUME_SOAK", "100"))
    limits = HoldLimits(hold=hold, keep=60)
    async with (
        running(port=0, faults="none", token_delay=0.002, answers=limits) as run,
        httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http,
    ):
        up = run.upstream
        assert up is not None
        wrong: list[str] = []
        room = anyio.Semaphore(32)

        async def one(i: int) -> None:
            question = [{"role": "user", "content": f"Question {i} about rivers"}]
            plan = random.Random(i)
            async with room:
                path, body = BODIES["openai"]
                events: list[dict[str, Any]] = []
                async with http.stream(
                    "POST", run.url + path, json={**body, "messages": question}
                ) as r:
                    assert r.status_code == 200, (await r.aread()).decode()
                    answer = r.headers["x-streamres-answer"]
                    drop = plan.randint(1, 12)
                    async for ev in sse_events(r):
                        events.append(ev)
                        if len(events) >= drop:
                            break
                while not events or events[-1]["data"] != "[DONE]":
                    reload = plan.random() < 0.3
                    last = None if reload else events[-1]["id"]
                    url = f"{run.url}/v1/answers/{answer}/events"
                    headers = {} if last is None else {"last-event-id": last}
                    got: list[dict[str, Any]] = []
                    async with http.stream("GET", url, headers=headers) as r:
                        assert r.status_code == 200, (await r.aread()).decode()
                        drop = plan.randint(5, 80)
                        async for ev in sse_events(r):
                            got.append(ev)
                            if len(got) >= drop:
                                break
                    events = got if reload else events + got
                ids = [int(e["id"]) for e in events]
                text = "".join(text_of(e) for e in events)
                if ids != list(range(len(ids))) or text != up.answer(question):
                    wrong.append(answer)

        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                for i in range(count):
                    tg.start_soon(one, i)
        assert not wrong, f"{len(wrong)} of {count} answers not exact"
        answers = run.proxy.answers
        with anyio.fail_after(10):
            await answers.settled()
        answers.sweep(now=anyio.current_time() + limits.keep + 1)  # past ``keep``: forgotten
        assert len(answers) == 0 and answers.held_bytes == 0


CHAT_SCRIPT = r"""
const puppeteer = require("puppeteer-core");
const [browserPath, url, mode, question] = process.argv.slice(2);
(async () => {
  const browser = await puppeteer.launch({
    executablePath: browserPath, headless: true, args: ["--no-sandbox", "--disable-gpu"],
  });
  try {
    const page = await browser.newPage();
    await page.goto(url + "/chat");
    await page.type("#q", question);
    await page.click("#send");
    await page.waitForFunction(() => {
      const a = document.getElementById("answer");
      return a && a.textContent.length > 60;
    }, { timeout: 30000 });
    const before = await page.$eval("#answer", (e) => e.textContent);
    if (mode === "reload") await page.reload();
    else console.log("CUT " + JSON.stringify(before));
    if (mode === "moved") {  // read again by an EventSource once the test has moved it
      await new Promise((done) => process.stdin.once("data", done));
      process.stdin.destroy();
      const got = await page.evaluate((id) => new Promise((done) => {
        const source = new EventSource("/v1/answers/" + id + "/events");
        let text = "";
        source.onmessage = (m) => {
          if (m.data === "[DONE]") { source.close(); done({ whole: true, text }); return; }
          const chunk = JSON.parse(m.data);
          for (const c of chunk.choices || []) text += (c.delta && c.delta.content) || "";
        };
        // Any status but 200 is final for an EventSource: it closes and says error.
        source.onerror = () => { if (source.readyState === 2) done({ whole: false, text }); };
      }), await page.evaluate(() => JSON.parse(localStorage.getItem("streamres.chat")).answer.id));
      console.log("DONE " + JSON.stringify({ before, text: got.text, whole: got.whole }));
      return;
    }
    await page.waitForFunction(
      () => document.body.dataset.state === "idle"
        && document.querySelectorAll('.msg[data-role="assistant"]').length === 1,
      { timeout: 60000 },
    );
    const text = await page.$eval('.msg[data-role="assistant"]', (e) => e.textContent);
    console.log("DONE " + JSON.stringify({ before, text }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _puppeteer(tmp: Path, source: str = CHAT_SCRIPT) -> tuple[str, Path, dict[str, str]]:
    """Chromium, the page's driver script (``source``) and the environment it runs in
    (puppeteer-core, from tests/node), or the test is skipped saying which is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    env = node_env("puppeteer-core")
    script = tmp / "driver.js"
    script.write_text(source, encoding="utf-8")
    return browser, script, env


@pytest.mark.parametrize("mode", ["reload", "cut"])
async def test_the_chat_page_picks_its_answer_up_in_a_browser(mode: str, tmp_path: Path) -> None:
    """Headless Chromium on the proxy's chat page: reloaded mid-answer, or with its network
    cut for a few seconds mid-answer, it ends showing the exact answer, once — and the
    upstream was asked once (the answer kept running while nobody read it)."""
    browser, script, env = _puppeteer(tmp_path)
    question = "Explain TCP slow start in a few sentences."
    async with (
        running(port=0, faults="none", token_delay=0.04) as run,
        relay(run.url) as net,
    ):
        up = run.upstream
        assert up is not None
        command = ["node", str(script), browser, net.url, mode, question]
        async with await anyio.open_process(command, env=env) as node:
            assert node.stdout is not None
            lines = b""
            async for data in node.stdout:
                lines += data
                if mode == "cut" and b"CUT " in lines and not net.down:
                    net.cut()
                    await anyio.sleep(3)  # the network is away for three seconds
                    net.restore()
            await node.wait()
            assert node.returncode == 0, lines.decode()
        done = json.loads(lines.decode().split("DONE ", 1)[1])
        expected = up.answer([{"role": "user", "content": question}])
        assert done["text"] == expected
        assert done["before"] and expected.startswith(done["before"])
        assert done["before"] != expected  # it was mid-answer when the page went
        assert len(up.requests) == 1
        (held,) = run.proxy.answers._held.values()
        assert held.reads >= 2  # read again: after the reload, or the network's return


async def test_the_chat_page_reloads_across_a_redis_restart_onto_another_replica(
    redis_server: Any, tmp_path: Path
) -> None:
    """Headless Chromium on the chat page through a load balancer, mid-answer on replica A:
    Redis stops, the balancer moves the page to replica B, and the page reads the answer
    again with a browser's ``EventSource`` — which gives up on any status but 200. B holds the
    request while it cannot look the answer up; Redis comes back empty, A writes the answer
    again, and the ``EventSource`` gets the whole answer, exact; the upstream was asked
    once."""
    browser, script, env = _puppeteer(tmp_path)
    question = "Explain TCP slow start in a few sentences."
    async with Upstream(token_delay=0.04) as up:
        config = shared_config(up)
        async with (
            running(config, port=0, redis=redis_server.url) as a,
            running(config, port=0, redis=redis_server.url) as b,
            relay(a.url) as balancer,
        ):
            command = ["node", str(script), browser, balancer.url, "moved", question]
            with anyio.fail_after(120):
                async with await anyio.open_process(command, env=env) as node:
                    assert node.stdout is not None and node.stdin is not None
                    lines = b""
                    async for data in node.stdout:
                        lines += data
                        if b"CUT " in lines and balancer.port != int(b.url.rsplit(":", 1)[1]):
                            redis_server.stop()
                            balancer.cut()  # its open connections end: the next go to B
                            balancer.retarget(b.url)
                            balancer.restore()
                            await node.stdin.send(b"read\n")
                            await node.stdin.aclose()
                            # B is asked while Redis is away: it holds the request.
                            await _when_held(b)
                            redis_server.start()
                    await node.wait()
                    assert node.returncode == 0, lines.decode()
        done = json.loads(lines.decode().split("DONE ", 1)[1])
        expected = up.answer([{"role": "user", "content": question}])
        assert done["whole"] and done["text"] == expected
        assert done["before"] != expected  # it was mid-answer when the page went
        assert asked(up, question) == 1


async def _when_held(run: Any) -> None:
    """Until ``run`` is serving a request (the answer's, held while it cannot be looked up)."""
    with anyio.fail_after(30):
        while run.proxy.serving < 1:  # noqa: ASYNC110 (another task's request, polled)
            await anyio.sleep(0.02)


@EVERY_REDIS_ASYNCIO
async def test_another_proxy_reads_an_answer_on_through_redis(redis_servers: Any) -> None:
    """Two proxies sharing a real Redis: an answer started on one and read on through the
    other (``Last-Event-ID``) is exact, each event once; the first proxy kept producing it —
    the upstream was asked once."""
    async with (
        Upstream(token_delay=0.01) as up,
        two_proxies(up, redis_servers.url) as (a, b, http),
    ):
        question = "Explain TCP slow start in a few sentences."
        answer, first = await begin(http, a.url, question, upto=5)
        rest = await read_on(http, b.url, answer, first[-1]["id"])
        every = first + rest
        assert_exact(every, up.answer([{"role": "user", "content": question}]))
        assert asked(up, question) == 1
        assert b.proxy.answers.find(answer, None) is not None  # followed, not produced
        assert not b.proxy.answers._mismatch
        # Ended: its keys in Redis expire after ``keep``; no lease is left.
        await a.proxy.answers.settled()
        keep = a.proxy.answers.limits.keep
        async with connected(redis_servers.url) as r:
            keys = sorted(k.decode() for k in await r.keys(f"*{answer}*"))
            assert [k.rsplit(":", 1)[1] for k in keys] == ["log", "meta"]
            for key in keys:
                assert 0 < await r.ttl(key) <= keep + 1


async def test_a_redis_that_answers_late_for_a_moment_is_written_on(redis_server: Any) -> None:
    """Redis holds its writes back for 0.8 s mid-answer (as a busy machine can): the producing
    proxy's write goes unanswered in time, it waits for Redis and writes the same again — the
    other proxy reads the answer exact, each event once, and never adopts it (the upstream was
    asked once)."""
    import coredis

    async with (
        Upstream(token_delay=0.03) as up,
        two_proxies(up, redis_server.url) as (a, b, http),
        coredis.Redis.from_url(redis_server.url) as r,
    ):
        question = "Explain TCP slow start in a few sentences."
        answer, first = await begin(http, a.url, question, upto=5)
        await r.client_pause(800, coredis.PureToken.WRITE)
        rest = await read_on(http, b.url, answer, first[-1]["id"])
        every = first + rest
        assert_exact(every, up.answer([{"role": "user", "content": question}]))
        assert asked(up, question) == 1
        held = b.proxy.answers.find(answer, None)
        assert held is not None and held.shadow  # followed, never adopted
        assert a.proxy.client._shared_state.outages >= 1  # a write went unanswered


async def test_a_write_that_landed_twice_is_read_once(redis_server: Any) -> None:
    """A write Redis carried out after its producer had given up on it, then the same sent
    again: the log holds an entry twice; another proxy reading it gives each event once."""
    import coredis

    async with (
        Upstream(token_delay=0.005) as up,
        two_proxies(up, redis_server.url) as (a, b, http),
        coredis.Redis.from_url(redis_server.url) as r,
    ):
        question = "Explain TCP slow start in a few sentences."
        answer, _ = await begin(http, a.url, question, upto=1)
        whole = await read_on(http, a.url, answer, None)
        await a.proxy.answers.settled()
        # The same answer under another id, its log with one entry twice.
        twin = answer[:-4] + ("0000" if not answer.endswith("0000") else "1111")
        shared = a.proxy.answers.shared
        assert shared is not None
        (meta, log, _), (meta2, log2, _) = shared._keys(answer), shared._keys(twin)
        await r.hset(meta2, await r.hgetall(meta))
        entries = await r.xrange(log)
        assert len(entries) >= 3
        for i, e in enumerate(entries):
            await r.xadd(log2, dict(e.field_values))
            if i == 1:
                await r.xadd(log2, dict(e.field_values))
        again = await read_on(http, b.url, twin, None)
        assert [text_of(e) for e in again] == [text_of(e) for e in whole]
        assert "".join(text_of(e) for e in again) == up.answer(
            [{"role": "user", "content": question}]
        )


async def test_an_answer_outlives_the_proxy_that_started_it(redis_server: Any) -> None:
    """Answers in flight on a proxy that stops: another proxy sharing Redis adopts each when
    its lease lapses and continues it from what was delivered — every answer exact, each
    asked of the upstream at most once plus one continuation."""
    async with Upstream(token_delay=0.03) as up:
        config = shared_config(up)
        questions = [f"Question {i}: how do rivers carve valleys?" for i in range(8)]
        firsts: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        async with (
            running(config, port=0, redis=redis_server.url) as b,
            httpx.AsyncClient(timeout=60) as http,
        ):
            async with running(config, port=0, redis=redis_server.url) as a:
                for q in questions:
                    firsts[q] = await begin(http, a.url, q, upto=4)
            # ``a`` has stopped: its answers' producers are gone, their leases lapse.
            got: dict[str, list[dict[str, Any]]] = {}

            async def read_one(q: str) -> None:
                answer, first = firsts[q]
                got[q] = first + await read_on(http, b.url, answer, first[-1]["id"])

            async with anyio.create_task_group() as tg:
                for q in questions:
                    tg.start_soon(read_one, q)
            for q, every in got.items():
                assert_exact(every, up.answer([{"role": "user", "content": q}]))
                assert asked(up, q) <= 2


async def test_answers_survive_their_proxy_killed_with_sigkill(
    redis_server: Any, tmp_path: Path
) -> None:
    """Two ``streamres proxy`` processes sharing a real Redis; many answers streaming from
    the first when it is killed (SIGKILL: nothing of it runs after). Every client reads its
    answer on through the second: each ends exact, each event once, and the upstream served
    each at most once plus one continuation."""
    import signal

    async with Upstream(token_delay=0.03) as up:
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
            questions = [f"Question {i}: why is the sea salty?" for i in range(12)]
            got: dict[str, list[dict[str, Any]]] = {}
            killed = anyio.Event()
            reading = 0
            all_reading = anyio.Event()
            async with httpx.AsyncClient(timeout=60) as http:

                async def one(q: str) -> None:
                    nonlocal reading
                    body = {"model": "m", "messages": [{"role": "user", "content": q}]}
                    events: list[dict[str, Any]] = []
                    async with http.stream(
                        "POST", a_url + "/v1/chat/completions", json={**body, "stream": True}
                    ) as r:
                        answer = r.headers["x-streamres-answer"]
                        try:
                            async for ev in sse_events(r):
                                events.append(ev)
                                if len(events) == 4:
                                    reading += 1
                                    if reading == len(questions):
                                        all_reading.set()
                        except httpx.HTTPError:
                            pass  # the proxy died under it
                    await killed.wait()
                    got[q] = events + await read_on(http, b_url, answer, events[-1]["id"])

                async with anyio.create_task_group() as tg:
                    for q in questions:
                        tg.start_soon(one, q)
                    with anyio.fail_after(60):
                        await all_reading.wait()
                    a.send_signal(signal.SIGKILL)
                    await a.wait()
                    killed.set()
            for q in questions:
                every = got[q]
                assert_exact(every, up.answer([{"role": "user", "content": q}]))
                assert asked(up, q) <= 2
        finally:
            for process in (a, b):
                if process.returncode is None:
                    process.kill()
                await process.wait()


async def test_stop_through_another_proxy_stops_the_answer(redis_server: Any) -> None:
    """Stop pressed on a page served by another process: the process producing the answer
    closes its upstream, and both see the answer ``cancelled`` with its partial."""
    async with Upstream(token_delay=0.05) as up, two_proxies(up, redis_server.url) as (a, b, http):
        answer, _ = await begin(http, a.url, Q[0]["content"], upto=3)
        stopped = await http.post(f"{b.url}/v1/answers/{answer}/stop")
        assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
        with anyio.fail_after(5):
            await up.wait_streams_done()
        state = (await http.get(f"{a.url}/v1/answers/{answer}")).json()
        assert state["status"] == "cancelled" and state["text"]
        assert up.answer(Q).startswith(state["text"]) and state["text"] != up.answer(Q)


async def test_served_without_a_lifespan_answers_still_run() -> None:
    """The proxy as a bare ASGI app (no lifespan, so no task group of its own): a streamed
    answer is produced inside its request, and a background one before its response."""
    import streamres
    from streamres.proxy.server.app import Proxy

    async with Upstream(token_delay=0) as up:
        config = parse({"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}, {})
        async with streamres.Client(**config.client_options()) as client:
            app = Proxy(client, config)
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
                r = await http.post(
                    "/v1/chat/completions", json={"model": "m", "messages": Q, "stream": True}
                )
                events = [e for e in r.text.split("\n\n") if e.startswith("id: ")]
                text = "".join(text_of({"data": e.split("data: ", 1)[1]}) for e in events)
                assert text == up.answer(Q)
                r = await http.post(
                    "/v1/responses",
                    json={"model": "m", "input": Q[0]["content"], "background": True},
                )
                got = r.json()
                assert got["status"] == "completed"
                assert got["output"][0]["content"][0]["text"] == up.answer(Q)


EVERYDAY_SCRIPT = r"""
const puppeteer = require("puppeteer-core");
const [browserPath, url, width, height] = process.argv.slice(2);
const idle = (n) => (document.body.dataset.state === "idle"
  && document.querySelectorAll('.msg[data-role="assistant"]').length === n);
(async () => {
  const browser = await puppeteer.launch({
    executablePath: browserPath, headless: true, args: ["--no-sandbox", "--disable-gpu"],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: Number(width), height: Number(height) });
    await page.goto(url + "/chat");
    await page.waitForFunction(() => document.getElementById("model").options.length > 0);
    const picked = await page.$eval("#model", (e) => e.value);
    // Shift+Enter: a new line, nothing sent.
    await page.type("#q", "Explain TCP slow start.");
    await page.keyboard.down("Shift"); await page.keyboard.press("Enter");
    await page.keyboard.up("Shift");
    await page.type("#q", "In a few sentences.");
    const draft = await page.$eval("#q", (e) => e.value);
    const sentEarly = await page.$$eval(".msg", (m) => m.length);
    // Enter: sent.
    await page.keyboard.press("Enter");
    await page.waitForFunction(idle, { timeout: 60000 }, 1);
    const asked = await page.$eval('.msg[data-role="user"]', (e) => e.textContent);
    const left = await page.$eval("#q", (e) => e.value);
    // More answers than the window holds: the last one stays in view, Send with it.
    for (let i = 2; i <= 4; i++) {
      await page.type("#q", "And then, part " + i + "?");
      await page.keyboard.press("Enter");
      await page.waitForFunction(idle, { timeout: 60000 }, i);
    }
    const view = await page.evaluate(() => {
      const send = document.getElementById("send").getBoundingClientRect();
      const last = [...document.querySelectorAll('.msg[data-role="assistant"]')].pop()
        .getBoundingClientRect();
      return { taller: document.documentElement.scrollHeight > window.innerHeight,
               sendInView: send.bottom <= window.innerHeight && send.top >= 0,
               lastEndInView: last.bottom <= window.innerHeight + 1 };
    });
    // Stop mid-answer: the answer keeps a "stopped" mark.
    await page.type("#q", "One more, slowly, please.");
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => {
      const a = document.getElementById("answer");
      return a && a.textContent.length > 20 && !document.getElementById("stop").disabled;
    }, { timeout: 30000 });
    await page.click("#stop");
    await page.waitForFunction(idle, { timeout: 30000 }, 5);
    const stopped = await page.$eval('.msg[data-role="assistant"]:last-of-type',
      (e) => ({ flag: e.dataset.stopped || "", mark: e.querySelector(".mark")?.textContent }));
    console.log("DONE " + JSON.stringify({ picked, draft, sentEarly, asked, left, view, stopped }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.mark.parametrize(("width", "height"), [(1200, 700), (390, 700)], ids=["desktop", "phone"])
async def test_the_chat_page_in_everyday_use(width: int, height: int, tmp_path: Path) -> None:
    """Headless Chromium on /chat in front of the README's routes (a chain named ``chat``), at
    desktop and phone widths: the picker starts on the chain; Shift+Enter is a new line and
    Enter sends; after more answers than the window holds the last one and Send are in view;
    a stopped answer says so."""
    browser, script, env = _puppeteer(tmp_path, EVERYDAY_SCRIPT)
    # The fifth answer (the one stopped) pauses after 25 tokens: the Stop lands mid-answer
    # however busy the machine, never after an answer that was quicker than the click.
    paused = {"demo-large": ModelSpec(faults=FaultPlan("ok*4,slow@25"))}
    async with Upstream(token_delay=0.01, words=60, models=paused) as up:
        routes = [
            {"name": "large", "model": "demo-large", "base_url": up.openai_url},
            {"name": "small", "model": "demo-small", "base_url": up.openai_url},
        ]
        config = parse({"routes": routes, "models": {"chat": ["large", "small"]}}, {})
        async with running(config, port=0) as run:
            done = await anyio.run_process(
                ["node", str(script), browser, run.url, str(width), str(height)],
                check=False,
                env=env,
            )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    got = json.loads(out.split("DONE ", 1)[1])
    assert got["picked"] == "chat"
    assert got["draft"] == "Explain TCP slow start.\nIn a few sentences." and got["sentEarly"] == 0
    assert got["asked"] == got["draft"] and got["left"] == ""
    assert got["view"] == {"taller": True, "sendInView": True, "lastEndInView": True}
    assert got["stopped"] == {"flag": "true", "mark": "stopped"}


async def test_a_reload_during_a_wait_finds_the_answer() -> None:
    """The chat page asks for status events: its head, with the answer's id, comes at once —
    before any text, while the first model says 529 and the proxy waits — the wait is told
    in-band, and a reload during it finds the answer and reads it whole."""
    async with Upstream(faults="529:retry-after=2", token_delay=0.01) as up:
        config = parse({"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}, {})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            body = {"model": "m", "messages": Q, "stream": True}
            page = {"x-streamres-status": "events"}
            async with http.stream(
                "POST", run.url + "/v1/chat/completions", json=body, headers=page
            ) as r:
                assert r.status_code == 200
                answer = r.headers["x-streamres-answer"]
                assert len(up.requests) <= 1  # the head came before the answer (2 s on)
                before: list[dict[str, Any]] = []
                async for ev in sse_events(r):  # the answer's start, then the wait told
                    before.append(ev)
                    if ev["event"] == "streamres.status":
                        break
                assert json.loads(before[-1]["data"])["type"] == "retry"
                assert "".join(text_of(e) for e in before) == ""
                assert len(up.requests) == 1
            # The page reloaded while the proxy waits: it reads the answer from the start.
            again = await read_on(http, run.url, answer, None, **page)
            assert "".join(text_of(e) for e in again) == up.answer(Q)
            assert len(up.requests) == 2  # the 529, then the answer: nothing asked twice
