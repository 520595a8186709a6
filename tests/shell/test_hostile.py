"""Hostile and broken upstreams: nothing but StreamError escapes, nothing balloons, no key leaks.

Most tests here talk to ``tests.hostile``, a raw server that sends exactly the bytes a test
says, so nothing about the responses agrees with streamres' assumptions.
"""

from __future__ import annotations

import gzip
import json
import logging
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

import streamres
from streamres import Client, ReadLimits, Route
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.hostile import (
    END,
    chunk,
    head,
    hostile,
    openai_answer,
    openai_chunk,
    streamed,
    whole,
)
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio

WORDS = ["Slow ", "start ", "doubles ", "the ", "window."]
ANSWER = "".join(WORDS)
KEY = "sk-proj-SECRETKEY1234567890abcdef"


def call(url: str, **kw: Any) -> streamres.ResilientStream:
    args: dict[str, Any] = {
        "model": "m",
        "base_url": url,
        "api_key": KEY,
        "backoff": FAST,
        "stall_timeout": 2.0,
        "deadline": 10.0,
        "continuation": "prefill",
    }
    args.update(kw)
    return streamres.stream_resilient(USER, **args)


async def run(stream: streamres.ResilientStream) -> tuple[str, list[Any], Any]:
    """(text yielded, events, the done event or the StreamError raised)."""
    text, events = "", []
    try:
        async with stream:
            async for ev in stream:
                events.append(ev)
                if ev.type == "text":
                    text += ev.text
    except streamres.StreamError as exc:
        return text, events, exc
    return text, events, events[-1]


def broken_then_whole(bad: bytes) -> tuple[list[bytes | str], list[bytes | str]]:
    """Two responses: two words then ``bad``; then the rest of the answer (a prefill
    continuation, as the caller asks for it)."""
    first = [head(), chunk(openai_chunk(WORDS[0])), chunk(openai_chunk(WORDS[1])), chunk(bad), END]
    rest = streamed(openai_answer(WORDS[2:]))
    return first, rest


WRONG_SHAPES = {
    "choices is a string": b'data: {"id":"x","choices":"x"}\n\n',
    "delta is a string": b'data: {"id":"x","choices":[{"index":0,"delta":"abc"}]}\n\n',
    "usage is a string": b'data: {"id":"x","choices":[],"usage":"x"}\n\n',
    "finish_reason is a list": b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":["stop"]}]}\n\n',
    "tool index is a list": b'data: {"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":[0]}]}}]}\n\n',
    "content is a number": b'data: {"id":"x","choices":[{"index":0,"delta":{"content":123}}]}\n\n',
    "nested 100k deep": b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n",
    "choice is null": b'data: {"id":"x","choices":[null]}\n\n',
}


@pytest.mark.parametrize("bad", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
async def test_valid_json_of_the_wrong_shape_is_malformed_and_resumed(bad: bytes) -> None:
    """A chunk of the wrong shape fails the attempt as malformed; the answer resumes exactly."""
    async with hostile(*broken_then_whole(bad)) as srv:
        text, events, done = await run(call(srv.url))
    assert isinstance(done, streamres.DoneEvent), done
    assert text == done.text == ANSWER
    assert done.history[0].outcome == "malformed"
    assert all(type(e.text) is str for e in events if e.type == "text")


async def test_token_counts_that_are_not_numbers_are_not_usage() -> None:
    """Usage with text for counts is no report (the ledger counts instead), never a crash."""
    events = openai_answer(WORDS)
    events.insert(
        -1,
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":"9","completion_tokens":[1]}}\n\n',
    )
    async with hostile(streamed(events)) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER and done.attempts == 1
    assert done.usage.input_tokens is None  # unknown
    assert done.usage.estimated and done.usage.output_tokens == done.usage.delivered_tokens


async def test_anthropic_events_of_the_wrong_shape_are_malformed() -> None:
    """The Anthropic decoder validates too: an index that is not an integer is malformed."""
    bad = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":"0","delta":{"type":"text_delta","text":1}}\n\n'
    async with hostile([head(), chunk(bad), END]) as srv:
        text, _, err = await run(call(srv.url, provider="anthropic", max_attempts=2))
    assert isinstance(err, streamres.AttemptsExhausted)
    assert err.history[0].outcome == "malformed" and text == err.partial_text == ""


async def test_error_body_nested_past_the_stack_is_classified() -> None:
    """A 500 whose JSON body nests past Python's stack is a server error, retried — no RecursionError."""
    body = b'{"error":' * 7_000 + b"1" + b"}" * 7_000  # under the 64 KiB read for errors
    async with hostile(
        [whole(500, body, "application/json")], streamed(openai_answer(WORDS))
    ) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER and done.history[0].status_code == 500


@pytest.mark.parametrize(
    "body",
    [
        b"\x1f\x8b\x08\x00garbage",  # a gzip header cut short
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 20,  # invalid deflate data
        b"not gzip at all",
    ],
)
async def test_corrupt_gzip_body_is_malformed_and_retried(body: bytes) -> None:
    """A body that claims gzip but is not: malformed, and the next attempt completes."""
    bad = [head(extra=[("content-encoding", "gzip")]), chunk(body), END]
    async with hostile(bad, streamed(openai_answer(WORDS))) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER
    assert done.history[0].outcome == "malformed" and "gzip" in done.history[0].message


async def test_gzip_event_stream_is_read() -> None:
    """A gzip-compressed event stream (which requests accept) reads exactly."""
    async with hostile(streamed(openai_answer(WORDS), gzipped=True)) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER and done.attempts == 1
    assert b"accept-encoding: gzip, deflate" in srv.requests[0][0].lower()


async def test_gzip_bomb_is_stopped_at_the_inflate_bound() -> None:
    """A small gzip body inflating past the bound fails that attempt as malformed, at once."""
    bomb = gzip.compress(b": " + b"x" * (64 << 20) + b"\n")  # 64 MiB of comment, ~64 KiB sent
    first = [head(extra=[("content-encoding", "gzip")]), chunk(bomb), END]
    async with hostile(first, streamed(openai_answer(WORDS))) as srv:
        text, _, done = await run(call(srv.url, read_limits=ReadLimits(inflate=1 << 20)))
    assert text == ANSWER
    assert done.history[0].outcome == "malformed"
    assert "expands past" in done.history[0].message


async def test_an_event_that_never_ends_is_bounded() -> None:
    """``data:`` lines with no blank line after them: the attempt fails at the event bound."""
    line = b"data: " + b"y" * 1000 + b"\n"
    first = [head(), chunk(openai_chunk(WORDS[0])), *(chunk(line * 64) for _ in range(40)), "hang"]
    async with hostile(first, streamed(openai_answer(WORDS[1:]))) as srv:
        limits = ReadLimits(line=64 << 10, event=1 << 20)
        text, _, done = await run(call(srv.url, read_limits=limits))
    assert text == ANSWER
    assert done.history[0].outcome == "malformed"
    assert "event's data longer than" in done.history[0].message


async def test_a_line_that_never_ends_is_bounded() -> None:
    """One line without a newline, sent in many pieces: stopped at the line bound."""
    first = [head(), chunk(b"data: "), *(chunk(b"z" * 4096) for _ in range(64)), "hang"]
    async with hostile(first, streamed(openai_answer(WORDS))) as srv:
        text, _, done = await run(call(srv.url, read_limits=ReadLimits(line=128 << 10)))
    assert text == ANSWER
    assert "line longer than" in done.history[0].message


@pytest.mark.parametrize(
    ("body", "content_type", "kind", "words"),
    [
        (
            b'{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}',
            "application/json",
            streamres.RequestRejected,
            "Incorrect API key",
        ),
        (
            b'{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}',
            "application/json; charset=utf-8",
            streamres.RequestRejected,
            "quota",
        ),
        (
            b"<html><body>Welcome to nginx</body></html>",
            "text/html",
            streamres.RequestRejected,
            "text/html",
        ),
        (
            b'{"id":"x","choices":[]}',
            "application/json",
            streamres.RequestRejected,
            "not an event stream",
        ),
    ],
)
async def test_a_200_that_is_not_an_event_stream_is_classified_at_once(
    body: bytes, content_type: str, kind: type[Exception], words: str
) -> None:
    """HTTP 200 with JSON or HTML is classified from its body at once: one request, no retries."""
    async with hostile([whole(200, body, content_type)]) as srv:
        _, _, err = await run(call(srv.url))
    assert isinstance(err, kind), err
    assert words in str(err)
    assert len(srv.requests) == 1


async def test_a_200_json_overload_is_retried() -> None:
    """A JSON error body inside a 200 that says "overloaded" is a capacity failure: retried."""
    overloaded = whole(
        200,
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        "application/json",
    )
    async with hostile([overloaded], streamed(openai_answer(WORDS))) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER and done.history[0].outcome == "capacity"


async def test_a_redirect_is_never_followed() -> None:
    """A 307 to another origin fails for good, naming the target; the key goes nowhere else."""
    async with hostile(streamed(openai_answer(WORDS))) as other:
        target = f"{other.url}/chat/completions"
        redirect = whole(307, b"", "text/plain", extra=[("location", target)])
        async with (
            hostile([redirect]) as srv,
            httpx.AsyncClient(follow_redirects=True) as mine,
        ):
            _, _, err = await run(call(srv.url, provider="anthropic", client=mine))
            _, _, err2 = await run(call(srv.url))
        assert other.requests == []
    assert isinstance(err, streamres.RequestRejected) and isinstance(
        err2, streamres.RequestRejected
    )
    assert target in str(err) and "redirect" in str(err)
    assert len(srv.requests) == 2


async def test_a_key_echoed_by_the_server_is_redacted_everywhere() -> None:
    """An error body quoting the key: masked in the error, its history and the logs."""
    body = json.dumps(
        {
            "error": {
                "message": f"Incorrect API key provided: {KEY}.",
                "type": "invalid_request_error",
            }
        }
    ).encode()
    async with hostile([whole(401, body, "application/json")]) as srv:
        with capture_logs() as logs:
            _, _, err = await run(call(srv.url))
    assert isinstance(err, streamres.RequestRejected)
    shown = [str(err), err.message, *(a.message for a in err.history), repr(logs)]
    assert all(KEY not in s and KEY[-8:] not in s for s in shown), shown
    assert "[redacted]" in str(err)


async def test_a_key_echoed_in_response_headers_is_masked_in_httpcore_s_own_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An application that turns on DEBUG for the HTTP stack: httpcore prints the response's
    headers, and a server echoing the key in one must not put it in that log."""
    answer = streamed(openai_answer(WORDS))
    echoing = [
        answer[0].replace(b"\r\n\r\n", f"\r\nx-echo: Bearer {KEY}\r\n\r\n".encode()),
        *answer[1:],
    ]
    async with hostile(echoing) as srv:
        with caplog.at_level(logging.DEBUG, logger="httpcore"):
            text, _, end = await run(call(srv.url))
    assert end.type == "done" and text == ANSWER
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("httpcore"))
    assert "receive_response_headers" in logged and "x-echo" in logged
    assert KEY not in logged and "[redacted]" in logged


async def test_url_credentials_never_reach_messages_or_logs() -> None:
    """user:KEY@ and ?api-key= in a base URL: masked in errors and in the debug logs."""
    refusal = whole(404, b'{"error":{"message":"no such route"}}', "application/json")
    async with hostile([refusal]) as srv:
        url = srv.url.replace("http://", "http://user:PASSWORD123@") + "?api-key=QUERYSECRET99"
        with capture_logs() as logs:
            _, _, err = await run(call(url, api_key=None))
    shown = str(err) + repr(err.history) + repr(logs)
    assert "PASSWORD123" not in shown and "QUERYSECRET99" not in shown
    started = [e for e in logs if e["event"] == "streamres.attempt_started"]
    assert started and "[redacted]" in started[0]["url"]


async def test_a_bad_url_with_credentials_is_masked_in_invalid_request() -> None:
    """InvalidRequest for a URL that cannot be used does not repeat its credentials."""
    with pytest.raises(streamres.InvalidRequest) as info:
        streamres.stream_resilient(USER, model="m", base_url="ftp://u:TOPSECRET77@host/v1")
    assert "TOPSECRET77" not in str(info.value)


async def test_retry_after_with_an_absurd_date_is_ignored() -> None:
    """A Retry-After HTTP date with an absurd zone offset is no hint: the retry just happens."""
    bad = whole(
        503,
        b'{"error":{"message":"busy"}}',
        "application/json",
        extra=[("retry-after", "Mon, 01 Jan 2024 00:00:00 +99999999999999")],
    )
    async with hostile([bad], streamed(openai_answer(WORDS))) as srv:
        text, _, done = await run(call(srv.url))
    assert text == ANSWER and done.attempts == 2


async def test_done_does_not_wait_for_the_body_to_end() -> None:
    """The done event comes as soon as the terminal event does, even if the body never ends."""
    async with hostile([head(), *(chunk(e) for e in openai_answer(WORDS)), "hang"]) as srv:
        stream = call(srv.url)
        async with stream:
            with anyio.fail_after(0.9):  # the body's end is awaited only after done, up to 1 s
                events = [ev async for ev in _until_done(stream)]
    assert events[-1].type == "done" and events[-1].text == ANSWER


async def _until_done(stream: streamres.ResilientStream) -> Any:
    async for ev in stream:
        yield ev
        if ev.type == "done":
            return


async def test_deadline_mid_stream_with_one_attempt_is_a_deadline() -> None:
    """max_attempts=1 and the deadline passing mid-stream: DeadlineExceeded (a TimeoutError),
    at the deadline — not at the stall limit, which is far later."""
    async with hostile([head(), chunk(openai_chunk(WORDS[0])), "hang"]) as srv:
        with anyio.fail_after(5):  # the stall limit is 30 s: only the deadline can end it
            _, _, err = await run(call(srv.url, deadline=0.5, stall_timeout=30, max_attempts=1))
    assert isinstance(err, TimeoutError) and isinstance(err, streamres.DeadlineExceeded)
    assert err.partial_text == WORDS[0]


async def test_the_deadline_bounds_the_wait_for_headers() -> None:
    """A server that accepts and never answers: the deadline ends it, not the stall timer."""
    async with hostile(["hang"]) as srv:
        with anyio.fail_after(3):
            _, _, err = await run(call(srv.url, deadline=0.6, stall_timeout=60))
    assert isinstance(err, streamres.DeadlineExceeded)


# -- a healthy server under load, quotas and long hints -----------------------------------


async def test_waiting_for_a_pooled_connection_is_not_a_stall() -> None:
    """More streams than pooled connections: the queued ones wait, none counts as a stall."""
    async with Upstream(token_delay=0.004) as up:
        pool = httpx.AsyncClient(limits=httpx.Limits(max_connections=2), timeout=None)
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with pool, Client(routes, http_client=pool, stall_timeout=0.25, backoff=FAST) as c:
            results = await _many(c, 8, words=40)
            m = c.metrics()["m"]
        assert all(text == up.answer(USER, words=40) for text, _ in results)
        assert [done.attempts for _, done in results] == [1] * 8
        assert m.stalls == 0 and m.queued_seconds > 0


async def _many(client: Client, n: int, **kw: Any) -> list[tuple[str, streamres.DoneEvent]]:
    results: list[tuple[str, streamres.DoneEvent]] = []
    headers = {"x-upstream-words": str(kw.pop("words"))} if "words" in kw else None

    async def one() -> None:
        text, _, done = await collect(client.stream(USER, headers=headers, **kw))
        results.append((text, done))

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return results


async def test_a_quota_429_with_retry_after_is_a_cooldown_not_a_broken_model() -> None:
    """A quota of 2 in flight, 12 streams: 429 Retry-After never opens the breaker; all finish."""
    async with Upstream(max_in_flight=2, quota_retry_after=0.05, token_delay=0.002) as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        budget = streamres.RetryBudget(ratio=10.0, floor=100.0, cap=1000.0, balance=1000.0)
        async with Client(routes, backoff=FAST, breaker_threshold=2, retry_budget=budget) as c:
            results = await _many(c, 12, words=20)
            m = c.metrics()["m"]
        assert len(results) == 12 and all(t == up.answer(USER, words=20) for t, _ in results)
        assert m.capacity_errors > 0  # the quota did refuse some
        assert m.breaker == "closed"


async def test_streams_wait_for_a_half_open_probe_instead_of_failing() -> None:
    """While the one half-open probe is in flight, other streams wait for its outcome."""
    async with Upstream(token_delay=0.01) as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with Client(routes, backoff=FAST, breaker_recovery=60.0, deadline=20) as c:
            breaker = c.fleet.states[0].breaker
            breaker.state, breaker.opened_at = "open", anyio.current_time() - 60.0
            probe = c.stream(USER, headers={"x-upstream-words": "30"})
            async with probe:
                first = await probe.__anext__()  # the probe is in flight now
                assert first.type == "text" and c.fleet.probing(0)
                waiter: list[Any] = []
                async with anyio.create_task_group() as tg:

                    async def other() -> None:
                        waiter.append(await collect(c.stream(USER)))

                    tg.start_soon(other)
                    async for _ in probe:
                        pass
        ((text, events, _done),) = waiter
        assert text == up.answer(USER)
        assert any(e.type == "retry" and e.reason == "circuit_open" for e in events)


async def test_a_long_retry_after_moves_later_streams_to_the_next_model() -> None:
    """429 Retry-After: 3600 on model a: this and later answers go to b at once; health says why."""
    models = {"a": ModelSpec(faults=FaultPlan("429:retry-after=3600"))}
    async with Upstream(models=models) as up:
        routes = [Route(m, base_url=up.openai_url, api_key="k") for m in ("a", "b")]
        async with Client(routes, backoff=FAST, deadline=20) as c:
            _, _, first = await collect(c.stream(USER, model="a"))
            text, events, second = await collect(c.stream(USER, model="a"))
            health = c.health()["a"]
            cooldown = c.metrics()["a"].cooldown
        assert first.model == second.model == "b" and text == up.answer(USER)
        assert [r.model for r in up.requests].count("a") == 1
        assert events[0].type == "fallback"
        assert 290 < cooldown <= 300  # the hint is capped
        assert health.status == "degraded" and "cooling down" in health.reasons[0]


async def test_five_hundred_concurrent_streams_all_finish() -> None:
    """500 streams through one Client (httpx's pool holds 100) against a healthy server."""
    async with Upstream() as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with Client(routes, backoff=FAST, stall_timeout=5, deadline=120) as c:
            results = await _many(c, 500, words=12)
            m = c.metrics()["m"]
        assert len(results) == 500
        assert all(t == up.answer(USER, words=12) for t, _ in results)
        assert m.failures == 0 and m.requests == 500


def _responses_event(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\ndata: ".encode() + json.dumps(obj).encode() + b"\n\n"


async def test_a_failed_background_response_is_not_re_attached_to() -> None:
    """response.failed on a background response: the next request is a new one (re-attaching
    would only replay the failure, again and again until the deadline)."""
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_1", "background": True, "status": "in_progress"},
    }
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "Slow "}
    failed = {
        "type": "response.failed",
        "sequence_number": 2,
        "response": {"id": "resp_1", "error": {"code": "server_error", "message": "boom"}},
    }
    rest = [
        {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_2"}},
        {"type": "response.output_text.delta", "sequence_number": 1, "delta": "start."},
        {"type": "response.completed", "sequence_number": 2,
         "response": {"id": "resp_2", "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 2}}},
    ]  # fmt: skip
    first = [head(), *(chunk(_responses_event(e)) for e in (created, delta, failed)), END]
    second = [head(), *(chunk(_responses_event(e)) for e in rest), END]
    async with hostile(first, second) as srv:
        text, _, done = await run(
            call(srv.url, provider="openai-responses", background=True, store=True)
        )
    assert isinstance(done, streamres.DoneEvent) and text == "Slow start."
    assert [h.split(b" ")[0] for h, _ in srv.requests] == [b"POST", b"POST"]
