"""streamres.Client: many models, shared limits, breakers, budget and metrics, over loopback."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import streamres
from streamres import Client, RetryBudget, Route
from streamres.prometheus import register
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio


def family(up: Upstream, **over: Any) -> list[Route]:
    """big and small of one family, plus an Anthropic model of another."""
    base = {"base_url": up.openai_url, "api_key": "k"}
    return [
        Route("big", family="f", size=2, **base, **over),
        Route("small", family="f", size=1, **base, **over),
        Route("claude", provider="anthropic", base_url=up.anthropic_url, api_key="k", **over),
    ]


async def test_jammed_model_falls_back_to_its_smaller_sibling_before_connecting() -> None:
    """At capacity on connect: the small sibling of the same family is tried first."""
    async with Upstream(models={"big": ModelSpec(faults=FaultPlan("at-capacity*50"))}) as up:
        async with Client(family(up), backoff=FAST) as client:
            text, events, done = await collect(client.stream(USER, model="big"))
        assert text == up.answer(USER)
        fb = [e for e in events if e.type == "fallback"]
        assert [(f.from_model, f.to_model) for f in fb] == [("big", "small")]
        assert "Many people are using big right now" in fb[0].message
        assert done.model == "small"


async def test_mid_stream_fallback_continues_exactly() -> None:
    """A model breaking mid-answer, then refusing: the sibling continues the same answer."""
    async with Upstream(models={"big": ModelSpec(faults=FaultPlan("reset@20,503*50"))}) as up:
        async with Client(family(up), backoff=FAST) as client:
            text, _, done = await collect(client.stream(USER, model="big"))
            m = client.metrics()
        assert text == up.answer(USER)
        assert done.model == "small"
        assert (m["big"].requests, m["big"].failures, m["big"].capacity_errors) == (2, 2, 1)
        assert (m["big"].fallbacks_from, m["small"].fallbacks_to) == (1, 1)
        assert (m["small"].successes, m["small"].resumes) == (1, 1)


async def test_an_anthropic_model_backs_up_an_openai_one() -> None:
    """Routes may mix providers; the continuation uses the new model's own strategy."""
    models = {"big": ModelSpec(faults=FaultPlan("reset@25,at-capacity*50"))}
    async with Upstream(models=models) as up:
        routes = [r for r in family(up) if r.model != "small"]
        async with Client(routes, backoff=FAST) as client:
            text, _, done = await collect(client.stream(USER, model="big"))
        assert text == up.answer(USER)
        assert done.model == "claude"
        last = up.requests[-1]
        assert last.path == "/v1/messages"
        assert last.body["messages"][-1]["role"] == "assistant"  # Anthropic prefill


async def test_open_circuit_sends_new_streams_elsewhere() -> None:
    """After the breaker opens, a new stream skips the model without a request to it."""
    async with Upstream(models={"big": ModelSpec(faults=FaultPlan("503*2"))}) as up:
        async with Client(family(up), backoff=FAST, breaker_threshold=2) as client:
            await collect(client.stream(USER, model="big"))
            before = len([r for r in up.requests if r.model == "big"])
            _, events, done = await collect(client.stream(USER, model="big"))
            after = len([r for r in up.requests if r.model == "big"])
            health = client.health()
        assert before == after == 2
        fb = next(e for e in events if e.type == "fallback")
        assert fb.reason == "circuit_open"
        assert done.model == "small"
        assert health["big"].status == "jammed"


async def test_half_open_probe_closes_the_circuit() -> None:
    """After the recovery time one probe goes through; its success closes the circuit."""
    async with (
        Upstream(models={"big": ModelSpec(faults=FaultPlan("503*2"))}) as up,
        Client(family(up), backoff=FAST, breaker_threshold=2, breaker_recovery=0.2) as client,
    ):
        await collect(client.stream(USER, model="big"))
        assert client.metrics()["big"].breaker == "open"
        await anyio.sleep(0.25)  # let the recovery time pass (the behaviour under test)
        _, _, done = await collect(client.stream(USER, model="big"))
        assert done.model == "big"
        assert client.metrics()["big"].breaker == "closed"


async def test_fallback_false_keeps_one_model() -> None:
    """fallback=False: retries stay on the chosen model."""
    async with Upstream(models={"big": ModelSpec(faults=FaultPlan("at-capacity*3"))}) as up:
        async with Client(family(up), backoff=FAST, breaker_threshold=100) as client:
            _, events, done = await collect(client.stream(USER, model="big", fallback=False))
        assert done.model == "big"
        assert not [e for e in events if e.type == "fallback"]
        assert {r.model for r in up.requests} == {"big"}


async def _burst(up: Upstream, max_in_flight: int | None) -> int:
    routes = [Route("m", base_url=up.openai_url, api_key="k", max_in_flight=max_in_flight)]
    results: list[str] = []
    budget = RetryBudget(floor=100.0, cap=100.0, balance=100.0)  # isolate the limit's effect
    async with Client(
        routes, backoff=FAST, breaker_threshold=10_000, deadline=60, retry_budget=budget
    ) as client:

        async def one() -> None:
            text, _, _ = await collect(client.stream(USER))
            results.append(text)

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
    assert results == [up.answer(USER)] * 20
    return sum(r.status == 429 for r in up.requests)


async def test_concurrency_limit_avoids_capacity_errors() -> None:
    """20 streams against a quota of 5: all finish; the limit removes the refusals."""
    async with Upstream(max_in_flight=5, token_delay=0.002) as up:
        unbounded = await _burst(up, None)
    async with Upstream(max_in_flight=5, token_delay=0.002) as up:
        bounded = await _burst(up, 5)
        assert up.peak_in_flight("m") <= 5
    print(f"capacity errors: {unbounded} without the limit, {bounded} with it")
    assert unbounded >= 10
    assert bounded == 0


async def test_retry_after_storm_stays_within_the_budget() -> None:
    """A storm of Retry-After refusals: retries stay within the retry budget."""
    async with Upstream(faults="429:retry-after=0.05*30") as up:
        budget = RetryBudget(ratio=0.2, floor=20.0, cap=2.0, balance=2.0)
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        start = anyio.current_time()
        async with Client(routes, backoff=FAST, breaker_threshold=10_000, retry_budget=budget) as c:

            async def one() -> None:
                await collect(c.stream(USER))

            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(one)
        elapsed = anyio.current_time() - start
    retries = len(up.requests) - 10
    allowed = 2.0 + 0.2 * 10 + 20.0 * elapsed + 1
    print(f"{retries} retries in {elapsed:.2f} s; budget allowed {allowed:.1f}")
    assert retries <= allowed
    assert len(up.requests) >= 40  # the storm was real and every stream got through it


async def test_metrics_match_what_happened() -> None:
    """Counters, token counts and latencies reflect the requests that were made."""
    async with Upstream(faults="503,reset@10") as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k", family="f", size=1)]
        async with Client(routes, backoff=FAST) as client:
            _, _, done = await collect(client.stream(USER))
            m = client.metrics()["m"]
    assert (m.requests, m.successes, m.failures, m.capacity_errors, m.resumes) == (3, 1, 2, 1, 1)
    assert m.success_rate == pytest.approx(1 / 3)
    assert m.tokens_delivered == done.usage.delivered_tokens
    assert m.tokens_wasted == done.usage.wasted_tokens > 0
    assert m.ttft_p50 is not None and m.latency_p50 is not None
    assert m.in_flight == 0
    assert m.breaker == "closed"


async def test_prometheus_exposition() -> None:
    """The optional collector exposes per-model series."""
    async with Upstream(faults="503") as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with Client(routes, backoff=FAST) as client:
            await collect(client.stream(USER))
            registry = CollectorRegistry()
            register(client, registry=registry)
            text = generate_latest(registry).decode()
    assert 'streamres_requests_total{model="m"} 2.0' in text
    assert 'streamres_capacity_errors_total{model="m"} 1.0' in text
    assert 'streamres_breaker_state{model="m"} 0.0' in text


async def test_client_misuse_is_explained() -> None:
    """Outside `async with`, unknown model names and duplicate routes say what to do."""
    routes = [Route("m", base_url="http://127.0.0.1:9/v1", api_key="k")]
    client = Client(routes)
    with pytest.raises(streamres.InvalidRequest, match="async with"):
        client.stream(USER)
    async with client:
        with pytest.raises(streamres.InvalidRequest, match="unknown model 'x'"):
            client.stream(USER, model="x")
    with pytest.raises(streamres.InvalidRequest, match="unique"):
        Client(routes * 2)


async def test_cancelled_probe_is_given_back() -> None:
    """A stream cancelled while holding the half-open probe (waiting out a cool-down) frees it:
    the next stream can still get through."""
    async with Upstream(faults="503:retry-after=1") as up:
        routes = [Route("m", base_url=up.openai_url, api_key="k")]
        async with Client(routes, backoff=FAST, breaker_threshold=1, breaker_recovery=0.1) as c:
            with pytest.raises(streamres.DeadlineExceeded):
                await collect(c.stream(USER, deadline=0.5))  # opens the circuit, sets a cool-down
            await anyio.sleep(0.15)  # the recovery time passes: the next request is the probe
            with anyio.move_on_after(0.1):
                await collect(c.stream(USER))  # takes the probe, waits out the cool-down…
            assert c.metrics()["m"].breaker == "half_open"
            text, _, done = await collect(c.stream(USER, deadline=5))
        assert text == up.answer(USER)
        assert done.model == "m"


async def test_account_limit_is_shared_by_its_routes() -> None:
    """Two models on one account with a quota of 3: never more than 3 streams in flight."""
    async with Upstream(max_in_flight=100, token_delay=0.002) as up:
        routes = [Route(m, base_url=up.openai_url, api_key="k", account="acct") for m in ("a", "b")]
        async with Client(routes, backoff=FAST, account_limits={"acct": 3}) as client:

            async def one(model: str) -> None:
                text, _, _ = await collect(client.stream(USER, model=model, fallback=False))
                assert text == up.answer(USER)

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(one, "ab"[i % 2])
        assert up.peak_in_flight() == 3
        assert {r.model for r in up.requests} == {"a", "b"}


async def test_every_circuit_open_waits_for_the_first_probe() -> None:
    """With every model's circuit open, the stream says so, waits for the earliest recovery,
    and goes on with that model's probe."""
    models = {
        "big": ModelSpec(faults=FaultPlan("503")),
        "small": ModelSpec(faults=FaultPlan("503")),
    }
    async with Upstream(models=models) as up:
        routes = [r for r in family(up) if r.model != "claude"]
        async with Client(routes, backoff=FAST, breaker_threshold=1, breaker_recovery=0.1) as c:
            text, events, _ = await collect(c.stream(USER, model="big"))
        assert text == up.answer(USER)
        waits = [e for e in events if e.type == "retry" and e.reason == "circuit_open"]
        assert waits and "All models are busy" in waits[0].message
        assert 0 <= waits[0].delay <= 0.1


async def test_an_account_out_of_credit_is_left_for_another_accounts_model() -> None:
    """A real 429 ``insufficient_quota`` from the first model's account: the answer comes from
    the next model, on another key, asked at once; the spent account is asked once — and a
    model on the same key as the spent one is never asked."""
    spent = ModelSpec(faults=FaultPlan("429:type=insufficient_quota*9"))
    async with Upstream(models={"a": spent, "a-mini": spent}) as up:
        routes = [
            Route("a", base_url=up.openai_url, api_key="k-spent"),
            Route("a-mini", base_url=up.openai_url, api_key="k-spent"),
            Route("b", base_url=up.openai_url, api_key="k-other"),
        ]
        async with Client(routes, backoff=FAST) as client:
            text, events, done = await collect(client.stream(USER, model=["a", "a-mini", "b"]))
    assert text == up.answer(USER) and done.model == "b"
    assert [r.model for r in up.requests] == ["a", "b"]
    (fallback,) = [e for e in events if e.type == "fallback"]
    assert fallback.reason == "quota" and "out of credit" in fallback.message


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


async def test_requests_go_through_a_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client's pools send each request to their transport directly — unless the
    environment names a proxy, which httpx's client mounts: then the request goes to it.
    Here the "proxy" is a second server, which serves the absolute-form request itself."""
    _no_proxies(monkeypatch)
    async with Upstream() as up, Upstream() as proxy:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            async for _ev in client.stream(USER, model="m"):
                pass
        assert (len(up.requests), len(proxy.requests)) == (1, 0)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        async with streamres.Client([route]) as client:
            got = [ev async for ev in client.stream(USER, model="m")]
        assert got[-1].type == "done"  # the answer, from the server the proxy variable names
        assert (len(up.requests), len(proxy.requests)) == (1, 1)


async def test_a_cookie_an_upstream_sets_is_not_sent_with_later_requests() -> None:
    """A ``Client`` serves many callers (a proxy: every client key): a cookie one upstream
    response set must not ride along with the next request, whoever makes it."""
    seen: list[str | None] = []
    body = (
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi."},'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        headers = {"content-type": "text/event-stream", "set-cookie": "session=tenant-a; Path=/"}
        return httpx.Response(200, content=body, headers=headers)

    route = streamres.Route("m", base_url="http://upstream.test/v1", api_key="k")
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with http, streamres.Client([route], http_client=http) as client:
        for _ in range(2):
            assert [
                ev.text async for ev in client.stream(USER, model="m") if ev.type == "text"
            ] == ["Hi."]
    assert seen == [None, None]
