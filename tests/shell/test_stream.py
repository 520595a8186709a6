"""stream_resilient() over real loopback HTTP against the embedded upstream, on asyncio and trio."""

from __future__ import annotations

import ssl
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

import streamres
from streamres._answer import request as _machine
from streamres._shell import stream as _stream
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.streams import FAST, USER, collect, url_for

pytestmark = pytest.mark.anyio

PROVIDERS = ["openai", "anthropic"]


def stream(up: Upstream, provider: str = "openai", **kw: Any) -> streamres.ResilientStream:
    args: dict[str, Any] = {
        "model": "m",
        "base_url": url_for(up, provider),
        "api_key": "sk-test-secret",
        "provider": provider,
        "backoff": FAST,
        "stall_timeout": 2.0,
        "deadline": 20.0,
    }
    args.update(kw)
    return streamres.stream_resilient(USER, **args)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_clean_stream(upstream: Upstream, provider: str) -> None:
    """No faults: one request, the exact answer, usage as the server reported it."""
    text, events, done = await collect(stream(upstream, provider))
    assert text == done.text == upstream.answer(USER)
    assert (done.attempts, done.resumes, done.finish_reason, done.model) == (1, 0, "stop", "m")
    assert done.usage.output_tokens == upstream.requests[0].tokens
    assert done.usage.input_tokens
    assert [e.type for e in events].count("done") == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_connect_time_retries_emit_nothing_twice(upstream: Upstream, provider: str) -> None:
    """Refusals before any text: retry events only, then the answer exactly once."""
    upstream.faults.push("429:retry-after=0.05,503,529:retry-after-ms=50,500:overloaded")
    text, events, done = await collect(stream(upstream, provider))
    assert [e.type for e in events if e.type != "text"] == ["retry"] * 4 + ["done"]
    assert text == upstream.answer(USER)
    assert done.attempts == 5 and done.resumes == 0
    retries = [e for e in events if e.type == "retry"]
    assert [r.status_code for r in retries] == [429, 503, 529, 500]
    assert retries[0].delay >= 0.05 and retries[2].delay >= 0.05
    assert "retrying" in retries[0].message


async def test_retry_after_is_waited(upstream: Upstream) -> None:
    """The next request comes no sooner than the server's Retry-After."""
    upstream.faults.push("503:retry-after=0.3")
    await collect(stream(upstream))
    first, second = upstream.requests
    assert second.at - first.at >= 0.3


async def test_retry_after_beyond_deadline_fails_fast(upstream: Upstream) -> None:
    """A hint longer than the time left fails at once instead of sleeping in vain."""
    upstream.faults.push("529:retry-after=60")
    with anyio.fail_after(5), pytest.raises(streamres.DeadlineExceeded) as info:
        await collect(stream(upstream, deadline=10))
    assert "asked to wait 60.0 s" in str(info.value)
    assert len(upstream.requests) == 1
    assert info.value.status_code == 529 and info.value.partial_text == ""


MIDSTREAM = ["error@15", "reset@15", "stall@15", "malformed@15", "truncate@15", "done-no-finish@15"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("fault", MIDSTREAM)
async def test_midstream_faults_resume_exactly(
    upstream: Upstream, provider: str, fault: str
) -> None:
    """Every mid-stream fault kind resumes and the answer equals the upstream's text exactly."""
    upstream.faults.push(fault)
    text, events, done = await collect(stream(upstream, provider, stall_timeout=0.3))
    assert text == done.text == upstream.answer(USER)
    assert done.resumes == 1 and done.attempts == 2
    resume = next(e for e in events if e.type == "resume")
    assert resume.chars_so_far > 0 and resume.tokens_so_far > 0
    assert text.startswith(
        upstream.requests[1].body["messages"][-1 if provider == "anthropic" else -2]["content"]
    )


async def test_openrouter_error_chunk(upstream: Upstream) -> None:
    """OpenRouter's error chunk with finish_reason 'error' is a failure, then resumed."""
    upstream.faults.push("error-openrouter@12")
    text, _, done = await collect(stream(upstream))
    assert text == upstream.answer(USER)
    assert done.history[0].outcome == "transient"


STRATEGIES = [
    # provider, server prefill, server instruct, client continuation, repeats expected
    ("openai", "continue", "overlap", "instruct", True),
    ("openai", "continue", "restart", "instruct", True),
    ("openai", "continue", "preamble", "instruct", True),
    ("openai", "continue", "exact", "instruct", False),
    ("openai", "continue", "overlap", "prefill", False),
    ("openai", "continue", "overlap", "prefix", False),
    ("openai", "restart", "overlap", "prefill", True),  # llama-cpp-python ignores the prefill
    ("anthropic", "continue", "overlap", "auto", False),
    ("anthropic", "continue", "overlap", "instruct", True),
    ("anthropic", "restart", "overlap", "prefill", True),
]


@pytest.mark.parametrize(("provider", "prefill", "instruct", "continuation", "repeats"), STRATEGIES)
async def test_continuation_strategies(
    provider: str, prefill: Any, instruct: Any, continuation: Any, repeats: bool
) -> None:
    """Prefill, instruct-with-overlap, preamble and restart all end in the exact answer."""
    async with Upstream(faults="reset@40", prefill=prefill, instruct=instruct) as up:
        text, _, done = await collect(stream(up, provider, continuation=continuation))
        assert text == up.answer(USER)
        assert (done.deduplicated_chars > 0) == repeats
        assert (done.usage.wasted_tokens > 0) == repeats


async def test_anthropic_prefill_strips_trailing_whitespace() -> None:
    """The prefill never ends in whitespace (Anthropic answers 400 otherwise)."""
    async with Upstream() as up:
        answer = up.answer(USER)
        cut = answer.index(" ", 40) + 1  # a cut right after a space
        n = len(answer[:cut].split())
        # Find the delta count that ends on that space: stream until the text ends with " ".
        up.faults.push(f"reset@{n * 2}")
        text, _, _ = await collect(stream(up, "anthropic"))
        assert text == answer
        prefill = up.requests[1].body["messages"][-1]["content"]
        assert prefill == prefill.rstrip()
        assert all(r.status == 200 for r in up.requests)


async def test_prefill_refusal_switches_to_instruct_and_is_remembered() -> None:
    """A model that rejects prefill gets the instruct strategy, now and on later calls."""
    _stream._MEMORY.prefill_refused.clear()
    async with Upstream(faults="reset@20", prefill="reject") as up:
        text, _events, _ = await collect(stream(up, "anthropic"))
        assert text == up.answer(USER)
        statuses = [r.status for r in up.requests]
        assert statuses == [200, 400, 200]
        assert up.requests[2].body["messages"][-1]["content"] == streamres.CONTINUE_INSTRUCTION
        up.faults.push("reset@20")
        text, _, _ = await collect(stream(up, "anthropic"))
        assert text == up.answer(USER)
        assert [r.status for r in up.requests[3:]] == [200, 200]  # no second 400
    _stream._MEMORY.prefill_refused.clear()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_permanent_errors_are_not_retried(upstream: Upstream, status: int) -> None:
    """Exactly one request, then a clear RequestRejected."""
    upstream.faults.push(str(status))
    with pytest.raises(streamres.RequestRejected) as info:
        await collect(stream(upstream))
    assert len(upstream.requests) == 1
    assert info.value.status_code == status
    assert "not retried" in str(info.value)


async def test_permanent_error_mid_answer_keeps_the_partial(upstream: Upstream) -> None:
    """A permanent refusal while resuming still hands over every character delivered."""
    upstream.faults.push("reset@10,401")
    got = ""
    with pytest.raises(streamres.RequestRejected) as info:
        async with stream(upstream) as events:
            async for ev in events:
                if ev.type == "text":
                    got += ev.text
    assert got and info.value.partial_text == got
    assert upstream.answer(USER).startswith(got)


async def test_never_recovering_upstream_raises_within_deadline(upstream: Upstream) -> None:
    """An upstream that never recovers: DeadlineExceeded, in time, with the exact partial."""
    upstream.faults.push("reset@10," + ",".join(["503"] * 2000))
    got = ""
    start = anyio.current_time()
    with pytest.raises(streamres.DeadlineExceeded) as info:
        async with stream(upstream, deadline=1.0) as events:
            async for ev in events:
                if ev.type == "text":
                    got += ev.text
    assert anyio.current_time() - start < 1.5
    assert got and info.value.partial_text == got
    assert info.value.attempts == len(upstream.requests) > 2
    assert info.value.history[0].outcome == "connection"
    assert isinstance(info.value, TimeoutError)


async def test_stall_ignores_keepalives(upstream: Upstream) -> None:
    """Pings every 20 ms do not keep a silent stream alive past stall_timeout."""
    upstream.faults.push("stall@10")
    text, _, done = await collect(stream(upstream, "anthropic", stall_timeout=0.3))
    assert text == upstream.answer(USER)
    assert done.history[0].outcome == "stall"


async def test_attempt_cap(upstream: Upstream) -> None:
    """max_attempts, when set, ends the answer after that many requests."""
    upstream.faults.push("503*5")
    with pytest.raises(streamres.AttemptsExhausted):
        await collect(stream(upstream, max_attempts=2))
    assert len(upstream.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_max_tokens_holds_across_resumes(upstream: Upstream, provider: str) -> None:
    """The resumed request asks only for the tokens left; the answer stops at the budget."""
    upstream.faults.push("reset@15")
    text, events, done = await collect(stream(upstream, provider, max_tokens=40))
    resume = next(e for e in events if e.type == "resume")
    second = upstream.requests[1].body
    assert second["max_tokens"] == 40 - resume.tokens_so_far
    assert done.finish_reason == "length"
    assert done.usage.delivered_tokens <= 40
    assert upstream.answer(USER).startswith(text)


async def test_budget_spent_before_resume_finishes_with_length(upstream: Upstream) -> None:
    """Nothing left of max_tokens when the stream breaks: done, finish reason 'length'."""
    upstream.faults.push("truncate@12")
    _, _, done = await collect(stream(upstream, max_tokens=10))
    assert len(upstream.requests) == 1 or upstream.requests[0].tokens < 10
    assert done.finish_reason == "length"


async def test_breaking_out_closes_the_connection() -> None:
    """Leaving the stream early closes the HTTP response: no connection is left open."""
    async with Upstream(token_delay=0.01) as up:
        async with stream(up) as events:
            async for ev in events:
                if ev.type == "text":
                    break
        with anyio.fail_after(5):
            await up.wait_idle()
        assert up.open_connections == 0


async def test_cancelling_the_caller_closes_the_connection() -> None:
    """Cancelling the consuming task mid-answer closes the response and the connection."""
    async with Upstream(token_delay=0.01) as up:
        got = []
        with anyio.CancelScope() as scope:
            async with stream(up) as events:
                async for ev in events:
                    got.append(ev)
                    if len(got) == 3:
                        scope.cancel()
        assert scope.cancelled_caught
        with anyio.fail_after(5):
            await up.wait_idle()


async def test_uses_the_callers_client(upstream: Upstream) -> None:
    """A caller's httpx.AsyncClient is used, and left open for reuse."""
    seen: list[str] = []

    async def hook(request: httpx.Request) -> None:
        seen.append(str(request.url))

    async with httpx.AsyncClient(event_hooks={"request": [hook]}) as client:
        await collect(stream(upstream, client=client))
        await collect(stream(upstream, client=client))
        assert not client.is_closed
    assert len(seen) == 2


async def test_no_ssl_setup_per_call(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls without a client share one SSL context instead of building one each time."""
    built: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*a: Any, **kw: Any) -> ssl.SSLContext:
        ctx = real(*a, **kw)
        built.append(ctx)
        return ctx

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(_stream, "_ssl_context", None)
    for _ in range(3):
        await collect(stream(upstream))
    assert len(built) == 1


async def test_fallback_before_connect_on_at_capacity() -> None:
    """'Selected model is at capacity' moves to the next model at once."""
    models = {"big": ModelSpec(faults=FaultPlan("at-capacity*50"))}
    async with Upstream(models=models) as up:
        text, events, done = await collect(stream(up, model=["big", "small"]))
        assert text == up.answer(USER)
        fb = next(e for e in events if e.type == "fallback")
        assert (fb.from_model, fb.to_model) == ("big", "small")
        assert "switching you to small" in fb.message
        assert done.model == "small"
        assert [r.model for r in up.requests] == ["big", "small"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_fallback_mid_stream_continues_on_the_next_model(provider: str) -> None:
    """A model failing mid-answer hands over to the next one, which continues exactly."""
    models = {"big": ModelSpec(faults=FaultPlan("reset@20,503*50"))}
    async with Upstream(models=models) as up:
        text, events, done = await collect(stream(up, provider, model=["big", "small"]))
        assert text == up.answer(USER)
        assert done.model == "small"
        assert [e.type for e in events if e.type not in ("text", "done")] == ["resume", "fallback"]


async def test_logs_name_events_and_never_show_keys(upstream: Upstream) -> None:
    """structlog events are dotted and flat; the API key appears nowhere."""
    upstream.faults.push("503,reset@10")
    with capture_logs() as logs:
        await collect(stream(upstream))
    names = [e["event"] for e in logs]
    assert names.count("streamres.retry_scheduled") == 1
    assert names.count("streamres.resume_scheduled") == 1
    assert "streamres.done" in names
    assert all(n.startswith("streamres.") for n in names)
    assert "sk-test-secret" not in repr(logs)
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-test-secret"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": "hello"}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
        ({"messages": [{"content": "x"}]}, "'role' and 'content'"),
        ({"provider": "cohere"}, "provider must be"),
        ({"deadline": 0}, "deadline must be"),
        ({"max_tokens": 0}, "max_tokens must be"),
        ({"model": []}, "model must be"),
        ({"base_url": "ftp://x"}, "base_url must be"),
        ({"stream": False}, "set by streamres"),
    ],
)
async def test_bad_arguments_are_refused_before_any_request(
    upstream: Upstream, kwargs: dict[str, Any], match: str
) -> None:
    """Bad input raises InvalidRequest (a ValueError) at once, saying what to fix."""
    args: dict[str, Any] = {"model": "m", "base_url": upstream.openai_url, "messages": USER}
    args.update(kwargs)
    with pytest.raises(streamres.InvalidRequest, match=match):
        streamres.stream_resilient(args.pop("messages"), **args)
    assert upstream.requests == []


async def test_a_closed_port_fails_fast_naming_the_address_and_the_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A URL that never answered and refuses connections: a few quick tries, then
    UpstreamUnreachable naming the address and the cause — not the whole 120 s deadline."""
    monkeypatch.setattr(_stream._MEMORY, "reached", set())  # the port may have served another test
    async with Upstream() as up:
        url = up.openai_url
    start = anyio.current_time()
    with pytest.raises(streamres.UpstreamUnreachable) as info:
        await collect(streamres.stream_resilient(USER, model="m", base_url=url, api_key="k"))
    assert anyio.current_time() - start < 10
    err = info.value
    assert isinstance(err, ConnectionError) and err.attempts == 3
    assert url in str(err) and "connection refused" in str(err)
    assert "Check that the server is running" in str(err)
    assert err.history[0].outcome == "connection"


async def test_a_url_that_answered_before_keeps_the_patient_policy() -> None:
    """Once a server has answered, a refused connection is retried like any drop."""
    async with Upstream() as up:
        url = up.openai_url
        await collect(streamres.stream_resilient(USER, model="m", base_url=url, api_key="k"))
    with pytest.raises(streamres.DeadlineExceeded) as info:
        await collect(
            streamres.stream_resilient(USER, model="m", base_url=url, deadline=1.0, backoff=FAST)
        )
    assert info.value.attempts > 3


async def test_unserialisable_body_is_an_invalid_request(upstream: Upstream) -> None:
    """An extra body field JSON cannot encode is a clear InvalidRequest, not a TypeError."""
    with pytest.raises(streamres.InvalidRequest, match="cannot build the request"):
        await collect(stream(upstream, temperature=object()))
    assert upstream.requests == []


async def test_anthropic_default_max_tokens_bounds_the_whole_answer(upstream: Upstream) -> None:
    """Without max_tokens, Anthropic gets the default once, and resumes ask for what is left."""
    upstream.faults.push("reset@15")
    _, events, _ = await collect(stream(upstream, "anthropic"))
    resume = next(e for e in events if e.type == "resume")
    first, second = (r.body["max_tokens"] for r in upstream.requests)
    assert first == 4096
    assert second == 4096 - resume.tokens_so_far


async def test_400_to_a_prefill_continuation_falls_back_to_instruct(upstream: Upstream) -> None:
    """The first request was accepted, so a 400 to the prefill continuation means the server
    refuses prefill: the answer goes on with the instruct strategy instead of failing."""
    _stream._MEMORY.prefill_refused.clear()
    upstream.faults.push("reset@20,400")
    text, _, _ = await collect(stream(upstream, continuation="prefill"))
    assert text == upstream.answer(USER)
    assert [r.status for r in upstream.requests] == [200, 400, 200]
    assert upstream.requests[2].body["messages"][-1]["content"] == streamres.CONTINUE_INSTRUCTION
    _stream._MEMORY.prefill_refused.clear()


async def test_logs_never_reach_stdout_unconfigured(
    upstream: Upstream, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """With structlog unconfigured, events go to stdlib logging (silent by default), never to
    the stdout a chat UI writes its answer to."""
    import logging

    import structlog

    structlog.reset_defaults()  # capture_logs() in other tests leaves structlog "configured"
    assert not structlog.is_configured()
    caplog.set_level(logging.DEBUG, logger="streamres")
    upstream.faults.push("503")
    await collect(stream(upstream))
    assert capsys.readouterr().out == ""
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("streamres.retry_scheduled ") for m in messages)
    assert "sk-test-secret" not in caplog.text


async def test_a_held_head_released_between_slow_tokens_does_not_cut_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A resumed slow stream whose de-dup hold runs out between two tokens goes on: the read in
    progress is not cancelled (httpcore would close the response and the attempt would end as
    truncated, again and again). One resume, and the answer reaches its end."""
    from functools import partial

    monkeypatch.setattr(
        _machine, "Deduplicator", partial(_machine.Deduplicator, max_hold_seconds=0.05)
    )
    async with Upstream(faults="reset@8", token_delay=0.15, words=14, instruct="overlap") as up:
        text, events, done = await collect(
            streamres.stream_resilient(
                USER,
                model="m",
                base_url=up.openai_url,
                api_key="k",
                backoff=FAST,
                continuation="instruct",
            )
        )
    # (A 50 ms hold releases the head before the repeat is certain: it may show twice.)
    assert text.endswith(up.answer(USER, words=14)[-40:]) and done.finish_reason == "stop"
    assert done.attempts == 2 and [e.reason for e in events if e.type == "resume"] == ["connection"]


async def test_a_server_remembered_at_a_url_is_forgotten_when_another_answers_there(
    upstream: Upstream,
) -> None:
    """A URL remembered as llama.cpp's (it continues a final assistant message) and now served
    by another server: its 200 response says so, and the resume goes by instruct, not by a
    prefill this server would answer as a new turn."""
    from streamres._shell.stream import _MEMORY

    _MEMORY.continues.add(upstream.openai_url)
    try:
        upstream.faults.push("reset@15")
        text, _, done = await collect(stream(upstream, "openai"))
    finally:
        _MEMORY.continues.discard(upstream.openai_url)
    assert text == done.text == upstream.answer(USER)
    assert upstream.requests[1].body["messages"][-1]["role"] == "user"  # instruct: a new turn
    assert upstream.openai_url not in _MEMORY.continues


async def test_the_upstream_waits_for_the_answers_served_at_a_moment_not_those_begun_since() -> (
    None
):
    """``Upstream.wait_streams_begun_done`` (what the fault tests synchronise on): it returns
    when the answers being served when it was called have ended, while a later one goes on."""
    body = {"model": "m", "stream": True, "messages": USER}
    async with (
        # Each answer stops after its first token and keeps its stream open (pings) until
        # the client closes it.
        Upstream(faults="stall@1,stall@1", ping_interval=0.05) as up,
        httpx.AsyncClient(timeout=10) as http,
    ):
        url = up.openai_url + "/chat/completions"
        done = anyio.Event()

        async def wait() -> None:
            await up.wait_streams_begun_done()
            done.set()

        first = await http.send(http.build_request("POST", url, json=body), stream=True)
        await anext(first.aiter_raw())  # being served
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            second = await http.send(http.build_request("POST", url, json=body), stream=True)
            await anext(second.aiter_raw())
            assert not done.is_set() and up.in_flight() == 2
            await first.aclose()
            with anyio.fail_after(10):
                await done.wait()
            assert up.in_flight() == 1  # the later answer is still being served
            await second.aclose()
