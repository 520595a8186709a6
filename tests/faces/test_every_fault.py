"""Every fault, the right move: the library and the proxy against loopback servers that break
as real providers do — a bad field, a context limit, a model named for the answer, a tool
call's arguments that are not JSON, a silent server."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

import streamres
from streamres.proxy import running
from streamres.upstream import Upstream
from tests.helpers.redis import RedisServer
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio

#: The proxy runs on uvicorn, which runs on asyncio.
ON_ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])

BAD_FIELDS = [
    {"stream_options": "x"},
    {"stream_options": ["include_usage"]},
    {"stream": "true"},
    {"max_tokens": "10"},
    {"messages": "hi"},
]


@pytest.mark.parametrize("bad", BAD_FIELDS)
async def test_the_embedded_upstream_answers_a_bad_field_with_a_400_and_keeps_serving(
    bad: dict[str, Any],
) -> None:
    """``streamres serve`` given a field of the wrong type: a 400 in the API's own words, and
    the next request is served (one bad request once ended the whole server)."""
    async with Upstream() as up, httpx.AsyncClient() as http:
        body = {"model": "m", "messages": USER, "stream": True, **bad}
        got = await http.post(up.openai_url + "/chat/completions", json=body)
        assert got.status_code == 400
        assert "Invalid type for" in got.json()["error"]["message"]
        ok = await http.post(
            up.openai_url + "/chat/completions", json={"model": "m", "messages": USER}
        )
        assert ok.status_code == 200


@ON_ASYNCIO
@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"stream": True, "stream_options": "x"}, "stream_options must be an object"),
        ({"stream": False, "stream_options": {"include_usage": True}}, "only allowed when stream"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage must be"),
    ],
)
async def test_the_proxy_checks_the_fields_it_manages_before_anything_is_sent(
    fields: dict[str, Any], words: str
) -> None:
    """A ``stream_options`` the proxy cannot honour is a 400 naming it, nothing goes upstream,
    and the proxy goes on serving."""
    async with running(port=0, faults="none", token_delay=0) as run, httpx.AsyncClient() as http:
        assert run.upstream is not None
        sent = len(run.upstream.requests)
        got = await http.post(
            run.url + "/v1/chat/completions", json={"model": "demo", "messages": USER, **fields}
        )
        assert got.status_code == 400 and words in got.json()["error"]["message"]
        assert len(run.upstream.requests) == sent
        ok = await http.post(
            run.url + "/v1/chat/completions", json={"model": "demo", "messages": USER}
        )
        assert ok.status_code == 200


def _chain_config(up: Upstream) -> Any:
    """A proxy config of two routes on ``up`` (``big``, then ``small``) under the alias ``chat``."""
    from streamres.proxy.config import parse

    return parse(
        {
            "routes": [
                {
                    "name": "big",
                    "model": "big",
                    "base_url": up.openai_url,
                    "family": "f",
                    "size": 2,
                },
                {"name": "small", "model": "small", "base_url": up.openai_url, "family": "f"},
            ],
            "models": {"chat": ["big", "small"]},
        },
        {},
    )


@ON_ASYNCIO
@pytest.mark.parametrize("stream", [True, False])
async def test_the_proxy_names_the_model_that_answered(stream: bool) -> None:
    """The primary is at capacity, the fallback answers: every chunk (and a whole response)
    names the fallback, as a provider names the model that served — never the alias asked for
    (the client's accounting reads it)."""
    import openai

    from streamres.upstream import FaultPlan, ModelSpec

    models = {"big": ModelSpec(faults=FaultPlan("at-capacity*50"))}
    async with Upstream(models=models) as up:
        async with running(_chain_config(up), port=0) as run:
            sdk = openai.AsyncOpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0)
            try:
                if stream:
                    chunks = [
                        c
                        async for c in await sdk.chat.completions.create(
                            model="chat",
                            messages=USER,
                            stream=True,  # type: ignore[arg-type]
                        )
                    ]
                    names = {c.model for c in chunks}
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                else:
                    whole = await sdk.chat.completions.create(model="chat", messages=USER)  # type: ignore[arg-type]
                    names, text = {whole.model}, whole.choices[0].message.content or ""
            finally:
                await sdk.close()
        assert text == up.answer(USER)
    assert names == {"small"}


TOO_LONG = "400:type=context_length_exceeded*9"


async def test_a_context_limit_moves_to_the_next_model_without_asking_the_same_again() -> None:
    """The first model refuses the request for its length: the next model of the chain answers
    (a larger window may take it), and the first is asked once, never again."""
    from streamres.upstream import FaultPlan, ModelSpec

    async with Upstream(models={"small": ModelSpec(faults=FaultPlan(TOO_LONG))}) as up:
        routes = [
            streamres.Route("small", base_url=up.openai_url, api_key="k"),
            streamres.Route("large", base_url=up.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, backoff=FAST) as client:
            text, events, done = await collect(client.stream(USER, model=["small", "large"]))
        asked = [r.body.get("model") for r in up.requests]
    assert text == up.answer(USER) and done.model == "large"
    assert asked.count("small") == 1
    assert done.history[0].outcome == "context_length"
    fallback = next(e for e in events if e.type == "fallback")
    assert "too long for small" in fallback.message


async def test_a_context_limit_goes_to_the_model_declaring_a_larger_window() -> None:
    """Routes that declare their context windows: refused by the 8k model, the answer skips
    the chain's 4k model (it would refuse too) and comes from the 128k one — neither the
    refusing model nor the smaller one asked again."""
    from streamres.upstream import FaultPlan, ModelSpec

    async with Upstream(
        models={"mid": ModelSpec(faults=FaultPlan(TOO_LONG)), "mini": ModelSpec()}
    ) as up:
        routes = [
            streamres.Route("mid", base_url=up.openai_url, api_key="k", context_window=8192),
            streamres.Route("mini", base_url=up.openai_url, api_key="k", context_window=4096),
            streamres.Route("long", base_url=up.openai_url, api_key="k", context_window=131072),
        ]
        async with streamres.Client(routes, backoff=FAST) as client:
            text, _, done = await collect(client.stream(USER, model=["mid", "mini", "long"]))
        asked = [r.body.get("model") for r in up.requests]
    assert text == up.answer(USER) and done.model == "long"
    assert asked == ["mid", "long"]


def test_a_route_s_context_window_is_checked() -> None:
    with pytest.raises(ValueError, match="context_window must be a positive number of tokens"):
        streamres.Route("m", context_window=0)
    from streamres.proxy.config import ConfigError, parse

    raw = {"routes": [{"model": "m", "base_url": "http://127.0.0.1:1/v1", "context_windw": 8}]}
    with pytest.raises(ConfigError, match="did you mean 'context_window'"):
        parse(raw, {})
    raw["routes"][0] = {"model": "m", "base_url": "http://127.0.0.1:1/v1", "context_window": 8}
    assert parse(raw, {}).routes[0].context_window == 8


async def test_a_context_limit_with_no_other_model_is_one_clean_refusal() -> None:
    """Alone, the model's refusal is final at once, naming the limit: one request, no retry."""
    async with Upstream(faults=TOO_LONG) as up:
        with pytest.raises(streamres.RequestRejected) as info:
            await collect(
                streamres.stream_resilient(
                    USER, model="m", base_url=up.openai_url, api_key="k", backoff=FAST
                )
            )
        assert len(up.requests) == 1
    assert "context window" in str(info.value) and info.value.reason == "context_length"


@ON_ASYNCIO
async def test_the_proxy_routes_a_context_limit_to_the_next_model() -> None:
    """Through the proxy, the same: the SDK gets the answer of the chain's next model."""
    import openai

    from streamres.upstream import FaultPlan, ModelSpec

    async with Upstream(models={"big": ModelSpec(faults=FaultPlan(TOO_LONG))}) as up:
        async with running(_chain_config(up), port=0) as run:
            sdk = openai.AsyncOpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0)
            try:
                whole = await sdk.chat.completions.create(model="chat", messages=USER)  # type: ignore[arg-type]
            finally:
                await sdk.close()
        assert whole.choices[0].message.content == up.answer(USER)
    assert whole.model == "small"


async def test_a_silent_server_costs_one_header_bound_then_the_fallback_answers() -> None:
    """The primary accepts the request and never sends headers: after the header bound (here
    1 s) the next model answers — the silent one is asked once, not waited on again for the
    first-output minute (before, the answer came after two such minutes)."""
    from tests.helpers.hostile import hostile

    async with hostile(["hang"]) as silent, Upstream() as up:
        routes = [
            streamres.Route("big", base_url=silent.url, api_key="k"),
            streamres.Route("small", base_url=up.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, header_timeout=1, deadline=45, backoff=FAST) as c:
            text, events, done = await collect(c.stream(USER, model=["big", "small"]))
        assert len(silent.requests) == 1
    assert text == up.answer(USER) and done.model == "small"
    assert done.history[0].outcome == "stall" and done.elapsed < 20  # 1 s bound + the answer
    assert [e.type for e in events if e.type != "text"][:1] == ["fallback"]


async def test_a_model_alone_waits_its_first_output_limit_for_headers() -> None:
    """With no model to fall back to, the header bound does not apply: a server that sends its
    headers late (a local model reading a long prompt) is waited for."""
    from tests.helpers.hostile import END, chunk, head, hostile, openai_chunk

    late = [
        "pause:1.5",
        head(),
        chunk(openai_chunk("late")),
        chunk(openai_chunk(finish="stop") + b"data: [DONE]\n\n"),
        END,
    ]
    async with hostile(late) as slow:
        text, _, done = await collect(
            streamres.stream_resilient(
                USER, model="m", base_url=slow.url, api_key="k", header_timeout=0.5
            )
        )
    assert text == "late" and done.attempts == 1


@ON_ASYNCIO
async def test_the_proxy_leaves_a_silent_route_for_the_next_within_its_header_bound() -> None:
    """Through the proxy, with ``header_timeout`` set on the silent route in ``routes.toml``:
    the client gets the fallback's answer, well within the deadline (it once got a 504)."""
    import openai

    from streamres.proxy.config import parse
    from tests.helpers.hostile import hostile

    async with hostile(["hang"]) as silent, Upstream() as up:
        config = parse(
            {
                "routes": [
                    {"name": "big", "model": "big", "base_url": silent.url, "header_timeout": 1},
                    {"name": "small", "model": "small", "base_url": up.openai_url},
                ],
                "models": {"chat": ["big", "small"]},
                "policy": {"deadline": 45},
            },
            {},
        )
        async with running(config, port=0) as run:
            sdk = openai.AsyncOpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0)
            try:
                whole = await sdk.chat.completions.create(model="chat", messages=USER)  # type: ignore[arg-type]
            finally:
                await sdk.close()
        assert whole.choices[0].message.content == up.answer(USER)
    assert whole.model == "small" and len(silent.requests) == 1


async def test_a_wait_for_a_busy_fleet_ends_when_a_model_comes_back(
    redis_server: RedisServer,
) -> None:
    """Every model of the chain refused for a minute (another process's breakers, shared
    through Redis): the answer waits — and when another process says one recovered, it goes
    at once, not at the end of the minute (a batch once sat silent 58 s while both breakers
    had closed 0.3 s after opening)."""
    import json
    import time

    import anyio
    import coredis

    async with Upstream() as up:
        routes = [
            streamres.Route("a", base_url=up.openai_url, api_key="k"),
            streamres.Route("b", base_url=up.openai_url, api_key="k"),
        ]
        peer = coredis.Redis.from_url(redis_server.url, decode_responses=True)
        async with peer, streamres.Client(routes, shared=redis_server.url, deadline=90) as client:

            async def news(kind: str, route: str) -> None:
                until = time.time() + 60
                message = {"kind": kind, "route": route, "until": until, "from": "another"}
                await peer.publish("streamres:events", json.dumps(message))

            for route in ("a", "b"):
                await news("open", route)
            with anyio.fail_after(10):  # the news arrives (one round trip), and wakes the client
                while {m.breaker for m in client.metrics().values()} != {"open"}:
                    await client._limits.changed(0.1)  # type: ignore[union-attr]
            started = anyio.current_time()
            text = ""
            async for ev in client.stream(USER, model=["a", "b"]):
                if ev.type == "retry" and ev.reason == "circuit_open":
                    await news("closed", "b")  # the waiting answer heard: b is back
                elif ev.type == "text":
                    text += ev.text
            waited = anyio.current_time() - started
    assert text == up.answer(USER)
    assert waited < 30  # woken by the news, not at the minute's end


def test_the_first_output_limit_follows_each_models_own_history() -> None:
    """A model that answers in well under a second is given 8 s for its first output once
    its history is known; one that always thinks for half a minute keeps its time (the
    ceiling); until five times are known, the ceiling."""
    from streamres._core.stall import first_output_limit

    assert first_output_limit([0.3, 0.4, 0.2, 0.5, 0.3, 0.4], 60.0) == 8.0
    assert first_output_limit([28.0, 31.0, 25.0, 30.0, 29.0], 60.0) == 60.0
    assert first_output_limit([3.0] * 10, 60.0) == 12.0
    assert first_output_limit([0.3] * 4, 60.0) == 60.0


async def test_a_fast_model_suddenly_slow_to_its_first_token_moves_to_the_fallback() -> None:
    """A model whose answers start in well under a second sends nothing after its headers: with
    a fallback at hand, the answer moves on after its learnt limit (8 s), not the first-output
    minute."""
    from streamres.upstream import FaultPlan, ModelSpec

    models = {"a": ModelSpec(faults=FaultPlan()), "b": ModelSpec()}
    async with Upstream(models=models, stall_seconds=300) as up:
        routes = [
            streamres.Route("a", base_url=up.openai_url, api_key="k"),
            streamres.Route("b", base_url=up.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, backoff=FAST, deadline=90) as client:
            for _ in range(6):  # its history: quick first tokens
                _, _, done = await collect(client.stream(USER, model=["a", "b"]))
                assert done.model == "a"
            faults = up.models["a"].faults
            assert faults is not None
            faults.push("stall@0")  # headers, then keep-alives only
            text, _, done = await collect(client.stream(USER, model=["a", "b"]))
    assert text == up.answer(USER) and done.model == "b"
    assert done.history[0].outcome == "stall" and done.elapsed < 30


@ON_ASYNCIO
async def test_the_proxy_bills_the_answer_not_its_failed_attempts() -> None:
    """An answer cut twice and resumed: the completion tokens the client is told are the
    answer it got, counted once — not the failed attempts' output, nor text generated again
    and dropped, which the library's own usage keeps as the cost."""
    import openai

    async with running(port=0, faults="error@20,reset@40", token_delay=0) as run:
        assert run.upstream is not None
        sdk = openai.AsyncOpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0)
        try:
            chunks = [
                c
                async for c in await sdk.chat.completions.create(
                    model="demo",
                    messages=USER,  # type: ignore[arg-type]
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
        finally:
            await sdk.close()
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
        assert text == run.upstream.answer(USER) and usage is not None
        assert len(run.upstream.requests) == 3
        from streamres._core.tokens import counter_for

        _, count = counter_for("demo-large")
        assert usage.completion_tokens == count(text)


async def _fast_history(client: streamres.Client) -> None:
    """Six quick answers from a: its learnt first-output limit is 8 s from then on."""
    for _ in range(6):
        events = [ev async for ev in client.stream(USER, model=["a", "b"])]
        assert not [e for e in events if e.type == "fallback"]  # never hedged while quick
        assert events[-1].model == "a"  # type: ignore[union-attr]


async def test_a_hedged_first_token_takes_the_fallback_s_and_closes_the_silent_one() -> None:
    """``hedge=True``: a fast model goes silent after its headers; at its learnt limit (8 s)
    the fallback starts alongside, announced (``reason="hedge"``); the fallback's answer wins
    and the silent request is closed at once."""
    from streamres.upstream import FaultPlan, ModelSpec

    async with (
        Upstream(models={"a": ModelSpec(faults=FaultPlan())}, stall_seconds=300) as up_a,
        Upstream() as up_b,
    ):
        routes = [
            streamres.Route("a", base_url=up_a.openai_url, api_key="k"),
            streamres.Route("b", base_url=up_b.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, backoff=FAST, deadline=90, hedge=True) as client:
            await _fast_history(client)
            faults = up_a.models["a"].faults
            assert faults is not None
            faults.push("stall@0")
            started = anyio.current_time()
            events = [ev async for ev in client.stream(USER, model=["a", "b"])]
            took = anyio.current_time() - started
            with anyio.fail_after(5):
                await up_a.wait_streams_done()  # the silent request was closed
    (hedge,) = [e for e in events if e.type == "fallback"]
    assert (hedge.reason, hedge.from_model, hedge.to_model) == ("hedge", "a", "b")  # type: ignore[union-attr]
    done = events[-1]
    assert isinstance(done, streamres.DoneEvent) and done.model == "b"
    assert done.text == up_b.answer(USER)
    assert 8 <= took < 20  # the learnt limit, then the fallback's own time


@pytest.mark.parametrize(
    ("anyio_backend", "hedge"), [("asyncio", True), ("trio", True), ("asyncio", False)]
)
async def test_a_model_slow_this_once_still_wins_a_hedge_it_would_lose_to_a_timeout(
    hedge: bool,
) -> None:
    """A fast model's first token comes at 10 s this once; the fallback would take 20 s. Hedged,
    the fallback starts at 8 s, the first model's token at 10 s wins, and the fallback's
    request is closed at once. Without the hedge, the first model is left at 8 s, the
    fallback (no history of its own, a quick request) at the quick bound 10 s later, and the
    answer comes from the first model asked again, at about 18 s."""
    from streamres.upstream import FaultPlan, ModelSpec

    async with (
        Upstream(models={"a": ModelSpec(faults=FaultPlan())}, stall_seconds=10) as up_a,
        Upstream(models={"b": ModelSpec(faults=FaultPlan())}, stall_seconds=20) as up_b,
    ):
        routes = [
            streamres.Route("a", base_url=up_a.openai_url, api_key="k"),
            streamres.Route("b", base_url=up_b.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, backoff=FAST, deadline=90, hedge=hedge) as client:
            await _fast_history(client)
            for up, model in ((up_a, "a"), (up_b, "b")):
                faults = up.models[model].faults
                assert faults is not None
                faults.push("slow@0")  # keep-alives only, then the whole answer
            started = anyio.current_time()
            text, _, done = await collect(client.stream(USER, model=["a", "b"]))
            took = anyio.current_time() - started
            if hedge:
                with anyio.fail_after(5):
                    await up_b.wait_streams_done()  # the losing request was closed
                assert len(up_b.requests) == 1
    if hedge:
        assert done.model == "a" and text == up_a.answer(USER)
        assert 10 <= took < 18
    else:
        assert done.model == "a" and took >= 18
        assert [r.model for r in up_b.requests] == ["b"]


def test_the_hedge_is_a_policy_of_routes_toml_and_an_argument() -> None:
    """``[policy] hedge = true`` reaches the proxy's client; a wrong value or a misspelt key
    is a clear error; ``Client`` and ``stream`` take only True or False."""
    from streamres.proxy.config import ConfigError, parse

    raw: dict[str, Any] = {"routes": [{"model": "m", "base_url": "http://127.0.0.1:1/v1"}]}
    assert parse(raw, {}).client_options()["hedge"] is False
    raw["policy"] = {"hedge": True}
    assert parse(raw, {}).client_options()["hedge"] is True
    raw["policy"] = {"hedge": "yes"}
    with pytest.raises(ConfigError, match="hedge must be true or false"):
        parse(raw, {})
    raw["policy"] = {"hedg": True}
    with pytest.raises(ConfigError, match="did you mean 'hedge'"):
        parse(raw, {})
    with pytest.raises(streamres.InvalidRequest, match="hedge must be True or False"):
        streamres.Client([streamres.Route("m", base_url="http://x/v1")], hedge=1)  # type: ignore[arg-type]
