"""OpenTelemetry traces, checked with the SDK's in-memory exporter: a clean answer, a resumed
one, a fallback and a failure; no key or prompt text unless asked; the proxy continues a
caller's ``traceparent`` and passes the answer's context upstream."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamres
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.streams import FAST, collect

pytestmark = pytest.mark.anyio
SECRET = "sk-very-secret-key-1234"
Q = [{"role": "user", "content": "The prompt text that must not leak: explain slow start."}]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in finished}


def _everything(finished: tuple[ReadableSpan, ...]) -> str:
    """Every attribute and event of every span, as text (to look for what must not be there)."""
    parts = []
    for s in finished:
        parts.append(json.dumps(dict(s.attributes or {}), default=str, ensure_ascii=False))
        for e in s.events:
            parts.append(
                e.name + json.dumps(dict(e.attributes or {}), default=str, ensure_ascii=False)
            )
    return "\n".join(parts)


async def test_a_clean_answer_is_one_span_with_one_attempt(spans: Any) -> None:
    provider, exporter = spans
    async with Upstream(words=20) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key=SECRET)
        async with streamres.Client([route], tracing=provider) as client:
            text, _, done = await collect(client.stream(Q, model="m", max_tokens=200))
        sent = up.requests[0].headers
    got = _by_name(exporter.get_finished_spans())
    answer, attempt = got["chat m"], got["attempt 1 m"]
    a = dict(answer.attributes or {})
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert "gen_ai.system" not in a  # deprecated: the official instrumentation has it not
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "m"
    assert a["gen_ai.request.max_tokens"] == 200
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]
    assert a["gen_ai.usage.output_tokens"] == done.usage.output_tokens
    assert a["gen_ai.response.id"] == done.response_id
    assert done.response_id.startswith("chatcmpl-")  # the server's, as its chunks carry it
    assert a["server.address"] == "127.0.0.1" and a["streamres.attempts"] == 1
    assert attempt.parent is not None and attempt.parent.span_id == answer.context.span_id
    assert dict(attempt.attributes or {})["streamres.outcome"] == "ok"
    assert dict(attempt.attributes or {})["streamres.chars"] == len(text)
    assert "streamres.time_to_first_token" in dict(attempt.attributes or {})
    assert [e.name for e in answer.events] == ["streamres.done"]
    # The upstream request carried the answer's context.
    trace_id = f"{answer.context.trace_id:032x}"
    assert sent["traceparent"].split("-")[1] == trace_id
    # No key, no prompt, no answer text anywhere.
    everything = _everything(exporter.get_finished_spans())
    assert SECRET not in everything and "must not leak" not in everything
    assert text[:30] not in everything


async def test_a_resumed_answer_and_a_fallback_have_an_attempt_each(spans: Any) -> None:
    provider, exporter = spans
    models = {
        "big": ModelSpec(
            faults=FaultPlan("reset@10,529*5")
        ),  # a resume, then a fallback  # a resume, then a fallback
        "small": ModelSpec(),
    }
    async with Upstream(models=models, words=30) as up:
        routes = [
            streamres.Route("big", base_url=up.openai_url, api_key="k", family="f", size=2),
            streamres.Route("small", base_url=up.openai_url, api_key="k", family="f", size=1),
        ]
        async with streamres.Client(routes, tracing=provider, backoff=FAST) as client:
            _, events, done = await collect(client.stream(Q, model="big"))
    finished = exporter.get_finished_spans()
    answer = next(s for s in finished if s.name == "chat big")
    attempts = sorted(
        (s for s in finished if s.name.startswith("attempt ")), key=lambda s: s.start_time or 0
    )
    kinds = [ev.type for ev in events if ev.type in ("retry", "resume", "fallback")]
    assert len(attempts) == done.attempts == len(kinds) + 1
    outcomes = [dict(s.attributes or {})["streamres.outcome"] for s in attempts]
    assert outcomes[-1] == "ok" and outcomes[0] == "connection"
    assert attempts[-1].name.endswith(" small")  # the fallback's model
    names = [e.name for e in answer.events]
    assert "streamres.resume" in names and "streamres.fallback" in names
    assert names[-1] == "streamres.done"
    fallback = next(e for e in answer.events if e.name == "streamres.fallback")
    assert dict(fallback.attributes or {})["to"] == "small"
    assert dict(answer.attributes or {})["gen_ai.response.model"] == "small"
    assert dict(answer.attributes or {})["streamres.resumes"] == done.resumes >= 1


async def test_a_failed_answer_is_an_error_span(spans: Any) -> None:
    provider, exporter = spans
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("400"))}) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route], tracing=provider) as client:
            with pytest.raises(streamres.RequestRejected):
                await collect(client.stream(Q, model="m"))
    got = _by_name(exporter.get_finished_spans())
    answer, attempt = got["chat m"], got["attempt 1 m"]
    assert answer.status.status_code.name == "ERROR"
    assert dict(answer.attributes or {})["error.type"] == "RequestRejected"
    assert dict(attempt.attributes or {})["http.response.status_code"] == 400


async def test_content_only_when_asked(spans: Any) -> None:
    provider, exporter = spans
    async with Upstream(words=12) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route], tracing=provider, capture_content=True) as client:
            text, _, _ = await collect(client.stream(Q, model="m"))
    everything = _everything(exporter.get_finished_spans())
    assert "must not leak" in everything and text.split("\n")[0] in everything


async def test_no_tracing_without_a_provider_and_a_clear_word_when_asked_without_the_package(
    spans: Any,
) -> None:
    _, exporter = spans
    async with Upstream(words=5) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:  # no global provider configured
            await collect(client.stream(Q, model="m"))
        assert "traceparent" not in up.requests[0].headers
    assert exporter.get_finished_spans() == ()
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None
        import streamres
        try:
            streamres.Client([streamres.Route("m", base_url="http://x/v1")], tracing=True)
        except streamres.MissingExtra as exc:
            print(exc)
        """
    )
    out = await anyio.run_process([sys.executable, "-c", code], check=True)
    assert "pip install 'streamres[otel]'" in out.stdout.decode()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_the_proxy_continues_the_callers_trace(spans: Any) -> None:
    """A client sends ``traceparent``: the proxy's answer span is its child (same trace, its
    span as parent), and the upstream request carries that trace on."""
    from opentelemetry import trace

    from streamres.proxy import running
    from streamres.proxy.config import parse

    provider, exporter = spans
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with Upstream(words=10) as up:
        raw = {"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}
        config = parse(raw, {})
        # The proxy's client traces with the global provider, as an operator sets it up.
        trace._TRACER_PROVIDER_SET_ONCE._done = False  # tests only: a fresh global each time
        trace.set_tracer_provider(provider)
        try:
            async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
                r = await http.post(
                    run.url + "/v1/chat/completions",
                    headers={"traceparent": caller},
                    json={"model": "m", "messages": Q},
                )
                assert r.status_code == 200, r.text
        finally:
            trace._TRACER_PROVIDER_SET_ONCE._done = False
            trace._TRACER_PROVIDER = None
        upstream = up.requests[0].headers["traceparent"]
    answer = _by_name(exporter.get_finished_spans())["chat m"]
    assert f"{answer.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert answer.parent is not None and f"{answer.parent.span_id:016x}" == "b7ad6b7169203331"
    assert upstream.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert upstream.split("-")[2] == f"{answer.context.span_id:016x}"


async def test_an_answer_from_the_cache_has_no_attempt(spans: Any) -> None:
    provider, exporter = spans
    async with Upstream(words=8) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client(
            [route], tracing=provider, cache=streamres.Cache(ttl=60)
        ) as client:
            await collect(client.stream(Q, model="m"))
            _, _, again = await collect(client.stream(Q, model="m"))
    assert again.cache == "hit"
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("chat m") == 2 and names.count("attempt 1 m") == 1
    hit = [s for s in exporter.get_finished_spans() if s.name == "chat m"][-1]
    assert dict(hit.attributes or {})["streamres.cache"] == "hit"


async def test_the_conventions_current_names_and_the_failed_attempts_error_type(
    spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the official instrumentation names them: ``gen_ai.provider.name``; each failed
    attempt's span has ``error.type`` (its failure kind); content as ``gen_ai.input.messages``
    / ``gen_ai.output.messages``; the deprecated ``gen_ai.system`` and content events are not
    there, with the conventions' opt-in to their newest names or without."""
    provider, exporter = spans
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http,gen_ai_latest_experimental")
    async with Upstream(faults="reset@5", words=12) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client(
            [route], tracing=provider, capture_content=True, backoff=FAST
        ) as client:
            text, _, _ = await collect(client.stream(Q, model="m"))
    finished = exporter.get_finished_spans()
    answer = next(s for s in finished if s.name == "chat m")
    a = dict(answer.attributes or {})
    assert a["gen_ai.provider.name"] == "openai" and "gen_ai.system" not in a
    failed = next(s for s in finished if s.name == "attempt 1 m")
    assert dict(failed.attributes or {})["error.type"] == "connection"
    assert "error.type" not in dict(
        next(s for s in finished if s.name == "attempt 2 m").attributes or {}
    )
    (said,) = json.loads(str(a["gen_ai.input.messages"]))
    assert said["role"] == "user" and said["parts"][0]["content"] == Q[0]["content"]
    (out,) = json.loads(str(a["gen_ai.output.messages"]))
    assert out["parts"][0]["content"] == text and out["finish_reason"] == "stop"
    assert not [e for e in answer.events if e.name.startswith("gen_ai.content.")]


async def test_an_answer_that_ended_early_finishes_with_error(spans: Any) -> None:
    """An answer given up: ``gen_ai.response.finish_reasons`` says ``error``."""
    provider, exporter = spans
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("400"))}) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route], tracing=provider) as client:
            with pytest.raises(streamres.RequestRejected):
                await collect(client.stream(Q, model="m"))
    answer = _by_name(exporter.get_finished_spans())["chat m"]
    a = dict(answer.attributes or {})
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("error",)  # type: ignore[arg-type]
    assert a["gen_ai.provider.name"] == "openai" and "gen_ai.system" not in a


def _points(reader: Any) -> dict[str, list[Any]]:
    """Every data point the reader holds, by metric name."""
    got: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                got.setdefault(metric.name, []).extend(metric.data.data_points)
    return got


async def test_the_genai_client_metrics_as_the_official_instrumentation_records_them() -> None:
    """Through a ``MeterProvider`` (no tracing configured): token usage by type, the
    operation's duration and time to first chunk, and streamres's attempts and resumes —
    labelled with the provider and the requested and answering models."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        async with Upstream(faults="reset@5", words=12) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k")
            async with streamres.Client([route], metrics=meters, backoff=FAST) as client:
                _, _, done = await collect(client.stream(Q, model="m"))
        got = _points(reader)
    finally:
        meters.shutdown()
    tokens = {p.attributes["gen_ai.token.type"]: p for p in got["gen_ai.client.token.usage"]}
    assert tokens["output"].sum == done.usage.output_tokens
    assert tokens["input"].sum == done.usage.input_tokens
    labels = dict(tokens["output"].attributes)
    assert labels["gen_ai.provider.name"] == "openai"
    assert labels["gen_ai.request.model"] == labels["gen_ai.response.model"] == "m"
    (duration,) = got["gen_ai.client.operation.duration"]
    assert duration.count == 1 and 0 < duration.sum < 60
    assert got["gen_ai.client.operation.time_to_first_chunk"][0].count == 1
    assert got["streamres.attempts"][0].value == done.attempts == 2
    assert got["streamres.resumes"][0].value == done.resumes == 1


async def test_a_failed_answer_is_measured_with_its_error_type() -> None:
    """An answer given up: its duration carries ``error.type``."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        async with Upstream(models={"m": ModelSpec(faults=FaultPlan("400"))}) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k")
            async with streamres.Client([route], metrics=meters) as client:
                with pytest.raises(streamres.RequestRejected):
                    await collect(client.stream(Q, model="m"))
        (duration,) = _points(reader)["gen_ai.client.operation.duration"]
    finally:
        meters.shutdown()
    assert duration.attributes["error.type"] == "RequestRejected"


def _answer_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "chat m"]
    return span


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the official SDK's client
@pytest.mark.parametrize("opt_in", ["", "gen_ai_latest_experimental"])
async def test_side_by_side_with_the_official_instrumentation(
    opt_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same request made by the ``openai`` SDK under ``opentelemetry-instrumentation-
    openai-v2`` and by streamres, each with its own in-memory exporter and reader: streamres's
    answer span carries every attribute the official span does, with the same values (the
    response id aside: a response of its own); its metrics include every metric the official
    records, with the same attribute names and bucket boundaries; and each measurement's
    exemplar names its own answer's trace — by default and under the conventions' opt-in."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    sides: dict[str, tuple[InMemorySpanExporter, InMemoryMetricReader]] = {}
    providers: list[Any] = []

    def side(name: str) -> tuple[TracerProvider, MeterProvider]:
        exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
        traces, meters = TracerProvider(), MeterProvider(metric_readers=[reader])
        traces.add_span_processor(SimpleSpanProcessor(exporter))
        sides[name] = exporter, reader
        providers.extend((traces, meters))
        return traces, meters

    asked: dict[str, Any] = {"max_tokens": 100, "temperature": 0.5}
    try:
        async with Upstream(words=12) as up:
            traces, meters = side("official")
            official = OpenAIInstrumentor()
            official.instrument(tracer_provider=traces, meter_provider=meters)
            try:
                sdk = openai.AsyncOpenAI(base_url=up.openai_url, api_key="k")
                chunks = await sdk.chat.completions.create(
                    model="m",
                    messages=Q,  # type: ignore[arg-type]
                    stream=True,
                    stream_options={"include_usage": True},
                    **asked,
                )
                async for _ in chunks:
                    pass
                await sdk.close()
            finally:
                official.uninstrument()
            traces, meters = side("streamres")
            route = streamres.Route("m", base_url=up.openai_url, api_key="k")
            async with streamres.Client([route], tracing=traces, metrics=meters) as client:
                await collect(client.stream(Q, model="m", **asked))
        spans = {name: _answer_span(exporter) for name, (exporter, _) in sides.items()}
        points = {name: _points(reader) for name, (_, reader) in sides.items()}
    finally:
        for provider in providers:
            provider.shutdown()
    theirs, ours = (dict(spans[n].attributes or {}) for n in ("official", "streamres"))
    assert spans["official"].kind == spans["streamres"].kind
    assert "gen_ai.provider.name" in theirs  # the official span is what it is said to be
    missing = set(theirs) - set(ours)
    assert not missing, missing
    differ = {k for k in theirs if k != "gen_ai.response.id" and theirs[k] != ours[k]}
    assert not differ, {k: (theirs[k], ours[k]) for k in differ}
    assert "gen_ai.system" not in ours  # deprecated: no name the official one has not
    assert {k for k in ours if k.startswith("gen_ai.")} <= set(theirs) | {
        "gen_ai.response.finish_reasons",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    }, set(ours) - set(theirs)
    assert str(ours["gen_ai.response.id"]).startswith("chatcmpl-")
    assert "gen_ai.client.operation.duration" in points["official"]
    for metric, recorded in points["official"].items():
        assert metric in points["streamres"], metric
        mine = points["streamres"][metric]
        assert {frozenset(p.attributes) for p in recorded} <= {
            frozenset(p.attributes) for p in mine
        }, metric
        assert {tuple(p.explicit_bounds) for p in recorded} == {
            tuple(p.explicit_bounds) for p in mine
        }, metric
    for name, recorded in points.items():
        trace_id = spans[name].context.trace_id  # type: ignore[union-attr]
        for metric in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage"):
            exemplars = [e for p in recorded[metric] for e in p.exemplars]
            assert exemplars and {e.trace_id for e in exemplars} == {trace_id}, (name, metric)


async def test_time_per_output_chunk_is_measured_after_the_first() -> None:
    """One measurement per output chunk after the first, the first being time to first
    chunk; their sum is the time between the first output and the last."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        async with Upstream(words=12, token_delay=0.01) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k")
            async with streamres.Client([route], metrics=meters) as client:
                chunks = 0
                async for ev in client.stream(Q, model="m"):
                    chunks += ev.type == "text"
        got = _points(reader)
    finally:
        meters.shutdown()
    (per_chunk,) = got["gen_ai.client.operation.time_per_output_chunk"]
    (first,) = got["gen_ai.client.operation.time_to_first_chunk"]
    (duration,) = got["gen_ai.client.operation.duration"]
    assert chunks > 2 and per_chunk.count == chunks - 1
    assert 0 < first.sum + per_chunk.sum <= duration.sum
