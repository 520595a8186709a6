"""OpenTelemetry traces of answers (``pip install 'streamres[otel]'``). I/O shell: it only
observes the events an answer yields and reports them as spans.

One span per answer (``chat {model}``, kind CLIENT) with the GenAI semantic conventions'
attributes — ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``
(and ``max_tokens``, ``temperature``, ``top_p`` when given), ``gen_ai.response.model``,
``gen_ai.response.id`` (the id the server gave the response that finished the answer),
``gen_ai.response.finish_reasons`` (``error`` for an answer that ended early),
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``server.address`` / ``server.port``,
``error.type`` on failure — plus streamres's own
(``streamres.attempts``, ``streamres.resumes``, ``streamres.join``, ``streamres.cache``,
``streamres.deduplicated_chars``). A child span per attempt (``attempt {n} {model}``) with the
route, its outcome (``ok`` or the failure kind, also as ``error.type`` on a failed one), the
HTTP status, the characters it added and its time to first token; events on the answer's span
for each retry, resume (strategy), fallback (from and to) and the done event. The request to
the upstream carries the answer's context (``traceparent``), so a server that traces continues
it.

Prompts and completions are recorded only with ``capture_content=True``, as the span
attributes ``gen_ai.input.messages`` and ``gen_ai.output.messages`` (JSON, the conventions'
message shape); keys and headers never are.

Only the conventions' current names, as the official instrumentation
(``opentelemetry-instrumentation-openai-v2``) records them: ``gen_ai.provider.name``, never the
deprecated ``gen_ai.system``; content as those attributes, never the removed events
``gen_ai.content.prompt`` / ``gen_ai.content.completion``.

**Metrics**, through the OpenTelemetry meter provider (``metrics=``: ``None``, the default,
uses the global one when a program configured it; a ``MeterProvider``; ``False`` never), as the
official instrumentation records them: ``gen_ai.client.token.usage`` (by
``gen_ai.token.type``, input and output), ``gen_ai.client.operation.duration`` (with
``error.type`` for an answer that failed), ``gen_ai.client.operation.time_to_first_chunk`` and
``gen_ai.client.operation.time_per_output_chunk``, with the conventions' bucket boundaries;
plus streamres's own counters ``streamres.attempts``, ``streamres.resumes``,
``streamres.fallbacks`` and ``streamres.deduplicated_chars`` — each with the operation, the
provider, the requested and the answering model, and recorded with the answer's span current,
so that an SDK keeping exemplars (its default ``trace_based`` filter) links them to the trace.

Tracing is off unless asked for: ``tracing=True`` (the global tracer provider; an error naming
the extra if OpenTelemetry is not installed), a ``TracerProvider``, or ``tracing=None`` (the
default) with a tracer provider configured globally and the package installed.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from streamres._core.errors import InvalidRequest, StreamError
from streamres._core.events import DoneEvent, Event
from streamres._fleet.routes import Route
from streamres._shell.extras import installed, require
from streamres._version import __version__

__all__ = ["Tracing", "otel_installed", "traced"]

_SCOPE = "streamres"


@functools.cache
def otel_installed() -> bool:
    """Looked up once: each answer asks (``tracing=None``), and a search of the path is not
    free."""
    return installed("opentelemetry.trace")


def _version() -> str:
    return __version__


class Tracing:
    """A client's tracing: whether it traces, with which tracer, and whether content goes in."""

    def __init__(
        self, setting: Any = None, *, capture_content: bool = False, metrics: Any = None
    ) -> None:
        self.capture_content = bool(capture_content)
        self.tracer: Any = None
        self.meters = _Meters.of(metrics)
        self._resolve(setting)
        if self.tracer is None and self.meters is not None:
            # Metrics without traces: spans that record nothing (and inject no context).
            from opentelemetry import trace

            self.tracer = trace.NoOpTracer()

    def _resolve(self, setting: Any) -> None:
        if setting is False:
            return
        if setting is None:
            if not otel_installed():
                return
            from opentelemetry import trace

            provider = trace.get_tracer_provider()
            if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
                return  # nothing configured: no spans to make
            self.tracer = provider.get_tracer(_SCOPE, _version())
            return
        require("opentelemetry.trace", "tracing=True")
        from opentelemetry import trace

        if setting is True:
            self.tracer = trace.get_tracer(_SCOPE, _version())
        elif hasattr(setting, "get_tracer"):
            self.tracer = setting.get_tracer(_SCOPE, _version())
        else:
            raise InvalidRequest(
                f"tracing must be True, False, None or a TracerProvider, not {setting!r:.60}",
                reason="invalid",
            )

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        route: Route,
        params: Mapping[str, Any],
        max_tokens: int | None,
    ) -> AnswerTrace:
        return AnswerTrace(self, messages, route, params, max_tokens)


#: The buckets the conventions (and the official instrumentation) give these histograms.
_SECONDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
_TOKENS = [4**n for n in range(14)]  # 1, 4, 16, … 67,108,864


class _Meters:
    """A client's GenAI metrics instruments (made once)."""

    def __init__(self, meter: Any) -> None:
        def histogram(name: str, unit: str, description: str, buckets: list[float]) -> Any:
            try:
                return meter.create_histogram(
                    name, unit=unit, description=description,
                    explicit_bucket_boundaries_advisory=buckets,
                )  # fmt: skip
            except TypeError:  # an API before 1.30: the SDK's default buckets
                return meter.create_histogram(name, unit=unit, description=description)

        self.tokens = histogram(
            "gen_ai.client.token.usage", "{token}", "Tokens used per answer", [*_TOKENS]
        )
        self.duration = histogram(
            "gen_ai.client.operation.duration", "s", "An answer's duration", _SECONDS
        )
        self.first_chunk = histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            "s",
            "Time from the request to an answer's first output",
            _SECONDS,
        )
        self.per_chunk = histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            "s",
            "Time from one output chunk to the next, after the first",
            _SECONDS,
        )
        self.attempts = meter.create_counter("streamres.attempts", unit="{attempt}")
        self.resumes = meter.create_counter("streamres.resumes", unit="{resume}")
        self.fallbacks = meter.create_counter("streamres.fallbacks", unit="{fallback}")
        self.deduplicated = meter.create_counter("streamres.deduplicated_chars", unit="{char}")

    @classmethod
    def of(cls, setting: Any) -> _Meters | None:
        """``metrics=``: ``None`` (the global meter provider, when one is configured), a
        ``MeterProvider``, or ``False``. The instruments are made once per provider: every
        ``stream_resilient()`` call asks."""
        if setting is False:
            return None
        if setting is None:
            if not otel_installed():
                return None
            from opentelemetry import metrics

            provider = metrics.get_meter_provider()
            if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
                return None  # nothing configured: nothing to record
            return _meters_of(provider)
        if hasattr(setting, "get_meter"):
            return _meters_of(setting)
        raise InvalidRequest(
            f"metrics must be None, False or a MeterProvider, not {setting!r:.60}",
            reason="invalid",
        )


@functools.cache
def _meters_of(provider: Any) -> _Meters:
    return _Meters(provider.get_meter(_SCOPE, _version()))


class AnswerTrace:
    """The spans of one answer, and its metrics, fed its events."""

    def __init__(
        self,
        tracing: Tracing,
        messages: Sequence[Mapping[str, Any]],
        route: Route,
        params: Mapping[str, Any],
        max_tokens: int | None,
    ) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracing = tracing
        provider = "anthropic" if route.provider == "anthropic" else "openai"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": route.model,
        }
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        for name in ("temperature", "top_p"):
            value = params.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attributes[f"gen_ai.request.{name}"] = float(value)
        if route.base_url:
            where = urlsplit(route.base_url)
            if where.hostname:
                attributes["server.address"] = where.hostname  # never the URL: it may hold keys
                if where.port:
                    attributes["server.port"] = where.port
        self.span = tracing.tracer.start_span(
            f"chat {route.model}", kind=trace.SpanKind.CLIENT, attributes=attributes
        )
        if tracing.capture_content:
            shown = json.dumps(_input_messages(messages), ensure_ascii=False, default=str)
            self.span.set_attribute("gen_ai.input.messages", shown)
        self._context = trace.set_span_in_context(self.span)
        self._metric_attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": route.model,
        }
        self._started = time.monotonic()
        self._first_output: float | None = None
        #: When the last output chunk came (seconds from the start).
        self._last_chunk = 0.0
        self._number = 0
        self._model = route.model
        self._next_model = route.model
        self._pending: int | None = None
        self._open_attempt(time.time_ns())

    def headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) for the upstream requests."""
        from opentelemetry import propagate

        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=self._context)
        return carrier

    # -- attempts ----------------------------------------------------------------------

    def _open_attempt(self, at: int) -> None:
        """The next attempt begins at ``at`` (its span is made when its outcome is known, with
        the times it had: an answer from the cache makes none)."""
        self._pending = at
        self._model = self._next_model
        self._first_at: int | None = None
        self._chars = 0

    def _close_attempt(self, outcome: str, status: int | None, at: int) -> None:
        began, self._pending = self._pending, None
        if began is None:
            return
        self._number += 1
        attributes: dict[str, Any] = {
            "streamres.attempt": self._number,
            "gen_ai.request.model": self._model,
            "streamres.outcome": outcome,
            "streamres.chars": self._chars,
        }
        if status is not None:
            attributes["http.response.status_code"] = status
        if outcome != "ok":
            attributes["error.type"] = outcome
        if self._first_at is not None:
            attributes["streamres.time_to_first_token"] = round((self._first_at - began) / 1e9, 6)
        span = self.tracing.tracer.start_span(
            f"attempt {self._number} {self._model}",
            context=self._context,
            start_time=began,
            attributes=attributes,
        )
        if outcome != "ok":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome))
        span.end(end_time=max(at, began))

    # -- events ------------------------------------------------------------------------

    def observe(self, ev: Event) -> None:
        now = time.time_ns()
        if ev.type in ("text", "thinking", "tool_call"):
            if self._first_output is None:
                self._first_output = time.monotonic() - self._started
                self._last_chunk = self._first_output
            elif (meters := self.tracing.meters) is not None:
                at = time.monotonic() - self._started
                with self._trace.use_span(self.span, end_on_exit=False):  # its exemplars
                    labels = {**self._metric_attributes, "gen_ai.response.model": self._model}
                    meters.per_chunk.record(at - self._last_chunk, labels)
                self._last_chunk = at
            if self._first_at is None:
                self._first_at = now
            if ev.type == "text":
                self._chars += len(ev.text)
            return
        if ev.type in ("retry", "resume", "fallback"):
            data: dict[str, Any] = {"attempt": ev.attempt, "reason": ev.reason}
            if ev.type == "fallback":
                data.update({"from": ev.from_model, "to": ev.to_model})
            else:
                data.update({"model": ev.model, "delay": ev.delay})
                if ev.type == "resume":
                    data["strategy"] = ev.strategy
            self.span.add_event(f"streamres.{ev.type}", data, timestamp=now)
            if ev.type == "fallback" and ev.reason == "hedge":
                return  # the next model asked alongside: no attempt has ended
            if ev.type == "fallback" and ev.reason == "circuit_open":
                # No attempt failed: the one about to go moves to the next model.
                self._model = self._next_model = ev.to_model
                return
            # The attempt failed (one of these events per failure): the next one begins
            # after the backoff, on the same model or the fallback's.
            self._close_attempt(ev.reason, getattr(ev, "status_code", None), now)
            self._next_model = ev.to_model if ev.type == "fallback" else ev.model
            delay = 0.0 if ev.type == "fallback" else ev.delay
            self._open_attempt(now + int(max(0.0, delay) * 1e9))
            return
        if isinstance(ev, DoneEvent):
            self._done(ev, now)

    def _done(self, ev: DoneEvent, now: int) -> None:
        last = ev.history[-1] if ev.history else None
        if ev.cache:
            # From the cache, or sharing an identical request's stream: this answer made no
            # attempt of its own (the shared stream's are in its own trace).
            self._pending = None
        else:
            if last is not None:
                self._model = last.model
            self._close_attempt("ok", last.status_code if last else None, now)
        span = self.span
        span.set_attribute("gen_ai.response.model", ev.model)
        if ev.response_id:
            span.set_attribute("gen_ai.response.id", ev.response_id)
        span.set_attribute("gen_ai.response.finish_reasons", [ev.finish_reason])
        usage = ev.usage
        if usage.input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        if usage.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        span.set_attribute("streamres.attempts", ev.attempts)
        span.set_attribute("streamres.resumes", ev.resumes)
        span.set_attribute("streamres.join", ev.join)
        span.set_attribute("streamres.deduplicated_chars", ev.deduplicated_chars)
        if ev.cache:
            span.set_attribute("streamres.cache", ev.cache)
        span.add_event(
            "streamres.done",
            {"finish_reason": ev.finish_reason, "model": ev.model, "attempts": ev.attempts},
            timestamp=now,
        )
        self._measure(ev)
        if self.tracing.capture_content:
            parts = [{"type": "text", "content": ev.text}] if ev.text else []
            parts += [
                {"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
                for c in ev.tool_calls
            ]
            output = [{"role": "assistant", "parts": parts, "finish_reason": ev.finish_reason}]
            span.set_attribute("gen_ai.output.messages", json.dumps(output, ensure_ascii=False))

    def _measure(self, ev: DoneEvent) -> None:
        meters = self.tracing.meters
        if meters is None:
            return
        # Recorded with the answer's span current: an SDK that keeps exemplars links each
        # measurement to this trace.
        with self._trace.use_span(self.span, end_on_exit=False):
            self._record(meters, ev)

    def _record(self, meters: _Meters, ev: DoneEvent) -> None:
        labels = {**self._metric_attributes, "gen_ai.response.model": ev.model}
        usage = ev.usage
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            if count is not None:
                meters.tokens.record(count, {**labels, "gen_ai.token.type": kind})
        meters.duration.record(time.monotonic() - self._started, labels)
        if self._first_output is not None:
            meters.first_chunk.record(self._first_output, labels)
        meters.attempts.add(ev.attempts, labels)
        meters.resumes.add(ev.resumes, labels)
        pairs = zip(ev.history, ev.history[1:], strict=False)
        fallbacks = sum(1 for a, b in pairs if a.model != b.model)
        meters.fallbacks.add(fallbacks, labels)
        meters.deduplicated.add(ev.deduplicated_chars, labels)

    def failed(self, exc: StreamError) -> None:
        now = time.time_ns()
        meters = self.tracing.meters
        if meters is not None:
            labels = {**self._metric_attributes, "error.type": type(exc).__name__}
            with self._trace.use_span(self.span, end_on_exit=False):
                meters.duration.record(time.monotonic() - self._started, labels)
                meters.attempts.add(exc.attempts, labels)
        if self._pending is not None and now >= self._pending:  # not given up in a backoff
            self._close_attempt(exc.reason or type(exc).__name__, exc.status_code, now)
        self.span.set_attribute("error.type", type(exc).__name__)
        self.span.set_attribute("gen_ai.response.finish_reasons", ["error"])
        self.span.set_attribute("streamres.attempts", exc.attempts)
        self.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)[:200]))

    def end(self) -> None:
        now = time.time_ns()
        if self._pending is not None and now >= self._pending:
            self._close_attempt("cancelled", None, now)  # the caller left mid-attempt
        self.span.end(end_time=now)


def _input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages in the conventions' shape: a role and parts."""
    shaped = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts: list[Any] = [{"type": "text", "content": content}]
        else:
            parts = [
                {"type": "text", "content": p.get("text", "")}
                if isinstance(p, Mapping) and p.get("type") == "text"
                else {"type": str(p.get("type", "part")) if isinstance(p, Mapping) else "part"}
                for p in content or []
            ]
        shaped.append({"role": m.get("role"), "parts": parts})
    return shaped


async def traced(events: AsyncIterator[Event], trace: AnswerTrace) -> AsyncIterator[Event]:
    """The answer's events, reported to its trace as they pass."""
    try:
        async for ev in events:
            trace.observe(ev)
            yield ev
    except StreamError as exc:
        trace.failed(exc)
        raise
    finally:
        trace.end()
