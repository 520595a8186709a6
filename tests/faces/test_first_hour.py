"""A new user's first mistakes, answered fast and in true words: wrong URLs, bad arguments,
stalls while a person watches, and usage a person can bill from."""

from __future__ import annotations

import random
import socket
import ssl
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

import streamres
from streamres import Backoff, Client, Route
from streamres._core.stall import StallTimer
from streamres._shell import stream as _stream
from streamres._shell.stream import _connect_cause
from streamres.upstream import Upstream
from tests.helpers.hostile import hostile, whole
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio


async def _error(stream: streamres.ResilientStream) -> streamres.StreamError:
    with pytest.raises(streamres.StreamError) as info:
        await collect(stream)
    return info.value


# -- wrong URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "ctype"),
    [
        (501, b"<html><h1>Error response</h1>Unsupported method ('POST')</html>", "text/html"),
        (404, b'{"detail":"Not Found"}', "application/json"),
        (405, b"Method Not Allowed", "text/plain"),
        (404, b"<html>404 page</html>", "text/html"),
    ],
)
async def test_a_server_that_is_not_an_llm_api_is_told_at_once(
    status: int, body: bytes, ctype: str
) -> None:
    """`python -m http.server`, a web app, a wrong path: one request, RequestRejected, and a
    message naming the URL and what to check (no "server error", no retries)."""
    async with hostile([whole(status, body, ctype)]) as srv:
        err = await _error(streamres.stream_resilient(USER, model="m", base_url=srv.url))
    assert isinstance(err, streamres.RequestRejected)
    assert len(srv.requests) == 1
    assert f"{srv.url}/chat/completions answered HTTP {status}" in str(err)
    assert "check base_url" in str(err)


async def test_an_llm_api_404_keeps_its_own_words() -> None:
    """A real API's 404 (an unknown model) is its message, not "not an LLM API"."""
    body = b'{"error":{"message":"The model `gpt-9` does not exist","type":"invalid_request_error","code":"model_not_found"}}'
    async with hostile([whole(404, body, "application/json")]) as srv:
        err = await _error(streamres.stream_resilient(USER, model="gpt-9", base_url=srv.url))
    assert isinstance(err, streamres.RequestRejected)
    assert "does not exist" in str(err) and "not what an LLM API" not in str(err)


async def test_tls_to_a_plain_http_server_names_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """https:// to a server that speaks plain HTTP: unreachable, "TLS handshake failed"."""
    monkeypatch.setattr(_stream._MEMORY, "reached", set())

    async def plain_http(stream: anyio.abc.SocketStream) -> None:
        async with stream:  # answers the TLS hello as an HTTP server answers garbage
            await stream.send(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    url = f"https://127.0.0.1:{port}/v1"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, plain_http)
        with anyio.fail_after(15):
            err = await _error(
                streamres.stream_resilient(USER, model="m", base_url=url, api_key="k")
            )
        tg.cancel_scope.cancel()
    assert isinstance(err, streamres.UpstreamUnreachable)
    assert "TLS handshake failed" in str(err) and url in str(err)


def test_connect_causes_in_words() -> None:
    """Refused, DNS and TLS failures are told apart from the exception chain."""

    def chained(inner: BaseException) -> httpx.ConnectError:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise OSError("All connection attempts failed") from exc
        except OSError as outer:
            err = httpx.ConnectError(str(outer))
            err.__cause__ = outer
            return err

    assert "connection refused" in _connect_cause(chained(ConnectionRefusedError(111, "x")))
    assert "DNS" in _connect_cause(chained(socket.gaierror(-2, "Name or service not known")))
    assert "TLS" in _connect_cause(chained(ssl.SSLError(1, "WRONG_VERSION_NUMBER")))
    group = ExceptionGroup("multiple", [ConnectionRefusedError(111, "x"), OSError("y")])
    assert "connection refused" in _connect_cause(chained(group))


async def test_an_unreachable_model_falls_back_without_capacity_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A route whose server cannot be reached: the fallback says so, not "many people"."""
    monkeypatch.setattr(_stream._MEMORY, "reached", set())  # the port may have served another test
    async with Upstream() as dead:
        dead_url = dead.openai_url
    async with Upstream() as up:
        routes = [
            Route("a", base_url=dead_url, api_key="k"),
            Route("b", base_url=up.openai_url, api_key="k"),
        ]
        async with Client(routes, backoff=FAST) as client:
            text, events, done = await collect(client.stream(USER, model="a"))
    assert text == up.answer(USER) and done.model == "b"
    fallback = next(e for e in events if e.type == "fallback")
    assert fallback.message == "Cannot reach a — switching you to b"
    retries = [e.message for e in events if e.type == "retry"]
    assert all("Cannot reach the server" in m for m in retries)


async def test_an_unreachable_route_is_told_at_once_on_every_answer() -> None:
    """A route whose port is wrong (it never answered, nothing listens): the first answer
    makes its few quick tries; every later one is refused at once — no request, no wait for
    its open circuit — as UpstreamUnreachable naming the refusal and when it is tried again
    (``retry_after``), well inside a deadline the breaker's wait would have run out."""
    async with Upstream() as dead:
        url = dead.openai_url
    async with Client([Route("m", base_url=url, api_key="k")], deadline=10.0) as client:
        errors = [await _error(client.stream(USER, model="m")) for _ in range(10)]
    assert all(isinstance(e, streamres.UpstreamUnreachable) for e in errors), errors
    first, *later = errors
    assert first.attempts == 3 and "connection refused" in str(first)
    assert first.retry_after is not None and first.retry_after > 50  # the open circuit's wait
    for err in later:
        assert err.attempts == 0, err
        assert "connection refused" in str(err) and "not tried again for" in str(err)
        assert err.retry_after is not None and 0 < err.retry_after <= 60


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the proxy serves on asyncio
async def test_the_proxy_answers_a_route_it_cannot_reach_at_once_every_time() -> None:
    """A routes.toml whose port is wrong: every request, streamed or not, is a 502 at once
    with Retry-After and the cause in the caller's error format — the tenth as the first, never
    a wait for the deadline ending in a 504."""
    pytest.importorskip("uvicorn")
    from streamres.proxy import running
    from streamres.proxy.config import parse

    async with Upstream() as dead:
        url = dead.openai_url
    config = parse({"routes": [{"name": "m", "model": "m", "base_url": url}]}, {})
    async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
        for i in range(10):
            body = {"model": "m", "messages": USER, "stream": i % 2 == 0}
            r = await http.post(run.url + "/v1/chat/completions", json=body)
            assert r.status_code == 502, (i, r.status_code, r.text)
            assert int(r.headers["retry-after"]) >= 1
            assert "connection refused" in r.json()["error"]["message"]


async def test_a_server_that_answered_and_restarts_is_waited_for() -> None:
    """The same refusal from a server that has answered before is a restart, not a wrong
    port: the answer waits for it within its deadline and comes back whole."""
    async with Upstream() as up:
        port, url, answer = up.port, up.openai_url, up.answer(USER)
    route = Route("m", base_url=url, api_key="k")
    async with Client([route], deadline=30.0, backoff=Backoff(initial=0.2, maximum=0.5)) as client:
        async with Upstream(port=port):
            await collect(client.stream(USER, model="m"))  # it answered: reached
        refused, done, text = anyio.Event(), anyio.Event(), ""

        async def back_once_refused() -> None:
            await refused.wait()
            async with Upstream(port=port):  # back on the same port
                await done.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(back_once_refused)
            async for ev in client.stream(USER, model="m"):
                if ev.type == "retry":
                    refused.set()
                elif ev.type == "text":
                    text += ev.text
            done.set()
    assert refused.is_set() and text == answer


# -- stalls while a person watches --------------------------------------------------------


def test_stall_limit_waits_long_for_the_first_output_then_follows_the_pace() -> None:
    """Before output: first-output wait; then cap until the pace is known; then 8× the gaps,
    never under the floor; a fixed stall_timeout overrides both phases."""
    t = StallTimer(first=60.0)
    t.start(100.0)
    assert t.deadline() == 160.0
    for i in range(4):
        t.output(101.0 + 0.02 * i)
    assert t.limit() == 4.0  # 8 × 20 ms is under the 4 s floor
    for i in range(4):
        t.output(102.0 + 2.0 * i)
    assert t.limit() == 16.0  # 8 × 2 s
    t.start(200.0)  # the next attempt: its own first-output wait, the pace kept
    assert t.limit() == 60.0
    t.output(201.0)
    assert t.limit() == 16.0
    fixed = StallTimer(fixed=2.5)
    fixed.start(0.0)
    assert fixed.limit() == 2.5


async def test_a_fast_stream_that_stalls_is_resumed_in_seconds_by_default() -> None:
    """Default settings, a fast stream that goes silent (keep-alives only): resumed within
    seconds — a 12 s deadline is enough, where a fixed 30 s stall timer would run it out."""
    async with Upstream(token_delay=0.002, ping_interval=0.05, faults="stall@20") as up:
        stream = streamres.stream_resilient(
            USER, model="m", base_url=up.openai_url, api_key="k", deadline=12, backoff=FAST
        )
        text, events, _ = await collect(stream)
    assert text == up.answer(USER)
    assert [e.reason for e in events if e.type == "resume"] == ["stall"]


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"backoff": "fast"}, "backoff must be a streamres.Backoff"),
        ({"model": 123}, "model must be a model name"),
        ({"client": "x"}, "client must be an httpx.AsyncClient"),
        ({"headers": "x"}, "headers must be a dict"),
        ({"headers": {"x-a": 1}}, "headers must be a dict"),
        ({"deadlne": 5}, "did you mean deadline="),
        ({"stall_timout": 5}, "did you mean stall_timeout="),
        ({"n": 2}, "one answer (choice) per call"),
        ({"rng": 7}, "rng must be a random.Random"),
        ({"read_limits": {}}, "read_limits must be a streamres.ReadLimits"),
        ({"deadline": float("inf")}, "finite"),
        ({"max_tokens": True}, "max_tokens must be None or a positive integer"),
        ({"api_key": 123}, "api_key must be a string"),
        ({"first_token_timeout": 0}, "first_token_timeout must be a positive number"),
    ],
)
def test_every_argument_is_checked_at_the_call(kw: dict[str, Any], words: str) -> None:
    """Bad arguments raise InvalidRequest at the call, saying what is wrong."""
    args: dict[str, Any] = {"model": "m", "base_url": "http://127.0.0.1:9/v1", **kw}
    with pytest.raises(streamres.InvalidRequest, match=None) as info:
        streamres.stream_resilient(USER, **args)
    assert words in str(info.value)


def test_other_extra_arguments_still_go_into_the_body() -> None:
    """An unknown keyword that resembles no streamres argument is a body field, as before."""
    streamres.stream_resilient(USER, model="m", base_url="http://h/v1", temperature=0.2, seed=1)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"http_client": "x"}, "http_client must be an httpx.AsyncClient"),
        ({"backoff": Backoff, "routes": None}, "non-empty list"),
        ({"deadline": -1}, "deadline must be a positive number"),
        ({"account_limits": {"x": 0}}, "account_limits must map"),
        ({"breaker_threshold": "3"}, "breaker_threshold must be"),
        ({"rng": random}, "rng must be a random.Random"),
    ],
)
def test_client_arguments_are_checked_at_construction(kw: dict[str, Any], words: str) -> None:
    """A Client with bad arguments fails when it is made, not at its first stream."""
    routes = kw.pop("routes", [Route("m", base_url="http://h/v1")])
    with pytest.raises(streamres.InvalidRequest) as info:
        Client(routes, **kw)
    assert words in str(info.value)


def test_a_route_with_a_bad_weight_is_refused() -> None:
    """Route fields are checked too (a string weight was a raw TypeError)."""
    with pytest.raises(streamres.InvalidRequest, match="weight must be a positive number"):
        Client([Route("m", base_url="http://h/v1", weight="x")])  # type: ignore[arg-type]


# -- usage a person can bill from ------------------------------------------------------------


async def test_usage_counts_broken_attempts_as_estimates() -> None:
    """A resumed answer: the broken attempt's output is the ledger's estimate (marked), and the
    total never claims fewer output tokens than were delivered."""
    async with Upstream(faults="reset@30", instruct="restart") as up:
        stream = streamres.stream_resilient(
            USER,
            model="m",
            base_url=up.openai_url,
            api_key="k",
            backoff=FAST,
            continuation="instruct",
        )
        _, _, done = await collect(stream)
        reported = up.requests[-1].tokens
    broken, ok = done.history
    assert broken.estimated and broken.output_tokens and broken.output_tokens >= 30
    assert not ok.estimated and ok.output_tokens == reported
    assert done.usage.estimated
    assert done.usage.output_tokens == broken.output_tokens + ok.output_tokens
    assert done.usage.output_tokens >= done.usage.delivered_tokens


async def test_usage_of_a_clean_answer_is_the_servers() -> None:
    """No resume: usage is what the server reported, not an estimate."""
    async with Upstream() as up:
        _, _, done = await collect(
            streamres.stream_resilient(USER, model="m", base_url=up.openai_url, api_key="k")
        )
    assert not done.usage.estimated
    assert done.usage.output_tokens == up.requests[0].tokens == done.history[0].output_tokens


async def test_attempts_is_a_count_and_history_the_list_everywhere() -> None:
    """One name per meaning, on the done event and on errors alike."""
    async with Upstream(faults="503,401") as up:
        err = await _error(
            streamres.stream_resilient(
                USER, model="m", base_url=up.openai_url, api_key="k", backoff=FAST
            )
        )
    assert err.attempts == 2 == len(err.history)
    assert [a.outcome for a in err.history] == ["capacity", "permanent"]


async def test_an_ollama_style_404_keeps_its_own_words() -> None:
    """{"error": "model 'x' not found"} is an API's answer (Ollama's shape), not a wrong URL."""
    body = b'{"error":"model \'llama9\' not found, try pulling it first"}'
    async with hostile([whole(404, body, "application/json")]) as srv:
        err = await _error(streamres.stream_resilient(USER, model="llama9", base_url=srv.url))
    assert isinstance(err, streamres.RequestRejected)
    assert "not found, try pulling it first" in str(err) and "not what an LLM API" not in str(err)


def test_the_library_prints_nothing_when_the_application_configured_no_logging() -> None:
    """A failed answer in a program that set up no logging: the exception says it all, and
    nothing appears on stderr beside it (the library convention: a NullHandler of its own)."""
    import subprocess
    import sys

    script = (
        "import anyio, streamres\n"
        "async def main():\n"
        "    try:\n"
        "        async for _ in streamres.stream_resilient(\n"
        "                [{'role': 'user', 'content': 'hi'}], model='m', api_key='k',\n"
        "                base_url='http://127.0.0.1:9/v1', max_attempts=1):\n"
        "            pass\n"
        "    except streamres.StreamError as exc:\n"
        "        print(type(exc).__name__)\n"
        "anyio.run(main)\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() in ("UpstreamUnreachable", "AttemptsExhausted", "DeadlineExceeded")
    assert got.stderr == ""


# -- shared state that does not answer --------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the proxy serves on asyncio
async def test_a_redis_that_does_not_answer_is_on_the_proxys_health() -> None:
    """``--redis`` at a port where nothing listens: the proxy serves on its own limits, and
    ``/health`` says where shared state is (credentials masked) and that it is not reached."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("coredis")
    from streamres.proxy import running

    redis = f"redis://:hunter2-secret@127.0.0.1:{_closed_port()}/0"
    async with running(port=0, faults="none", redis=redis) as run, httpx.AsyncClient() as http:
        health = (await http.get(run.url + "/health")).json()
        board = (await http.get(run.url + "/")).text
    shared = health["shared"]
    assert shared["connected"] is False and "hunter2" not in shared["url"]
    assert shared["url"].endswith(f"127.0.0.1:{_port_of(redis)}/0")
    assert "NOT REACHABLE" in board


def _lines(proc: Any, *streams: Any) -> list[str]:
    """The next line of each stream, or the process killed after 60 s without one."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError

    pool = ThreadPoolExecutor(len(streams))
    try:
        futures = [pool.submit(stream.readline) for stream in streams]
        return [str(f.result(timeout=60)) for f in futures]
    except TimeoutError:
        proc.kill()  # the reads end with the pipes
        raise
    finally:
        pool.shutdown(wait=True)


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def test_a_redis_that_does_not_answer_is_named_when_the_proxy_starts() -> None:
    """``streamres proxy --redis`` at a dead address: beside the banner, one line on standard
    error names the address (masked) and what that means, without a traceback or a secret."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("coredis")
    import os
    import subprocess
    import sys

    redis = f"redis://:hunter2-secret@127.0.0.1:{_closed_port()}/0"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "streamres", "proxy", "--port", "0", "--faults", "none"]
    with subprocess.Popen(
        [*cmd, "--redis", redis], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            banner, line = _lines(proc, proc.stdout, proc.stderr)
        finally:
            proc.terminate()
    assert banner.startswith("streamres proxy on http://127.0.0.1:")
    assert line.startswith("streamres proxy: shared state at redis://")
    assert "is not answering" in line and "hunter2" not in line + banner
