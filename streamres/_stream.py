"""The I/O shell: ``stream_resilient()``.

This is the only module that opens HTTP streams, sleeps and reads clocks (with ``_limits``,
which waits for concurrency slots). Every decision is delegated to the pure core: SSE decoding
(``_sse``), provider events (``_openai``, ``_anthropic``, ``_responses``), classification
(``_classify``), what to do next (``_policy``), continuation requests (``_continuation``),
overlap removal (``_dedup``), the token ledger (``_tokens``), and the state shared by a
client's streams — breakers, weights, cool-downs, retry budget, metrics (``_fleet``).

The deadline is an absolute time fixed when iteration starts; every await (connect, each read,
each backoff) is bounded by it with a cancel scope around *that await only*: a cancel scope
must never span a ``yield`` of an async generator. Reads are also bounded by the stall timer,
which only content resets (keep-alive comments and pings do not).
"""

from __future__ import annotations

import dataclasses
import random
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
import httpx

from . import _anthropic, _openai, _responses
from ._backoff import Backoff, after_hint
from ._bounds import ReadLimits
from ._classify import (
    Failure,
    classify_not_a_stream,
    classify_response,
    failure,
    is_event_stream,
)
from ._continuation import Strategy, build_continuation, choose
from ._dedup import Deduplicator
from ._errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    InvalidRequest,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from ._events import (
    Attempt,
    DoneEvent,
    Event,
    FallbackEvent,
    ResumeEvent,
    RetryEvent,
    TextEvent,
    ThinkingEvent,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from ._fleet import Fleet
from ._inflate import ACCEPT_ENCODING, InflateError, Inflater
from ._limits import Limits
from ._log import log
from ._options import Options, check_options, resolve_route
from ._policy import connect_timeout, decide, reinterpret
from ._redact import Redactor, redact_url, url_secrets
from ._routes import Route
from ._sse import SSEDecoder
from ._stall import FIRST_OUTPUT, StallTimer
from ._tokens import TokenLedger, counter_for, token_starts
from ._wire import DECODE_ERRORS, HttpRequest, StreamDecoder
from ._wording import busy_message, fallback_message, plural, resume_message, retry_message

__all__ = ["ResilientStream", "stream_resilient"]


Provider = Literal["openai", "anthropic", "openai-responses"]

_PROVIDERS: dict[str, tuple[Callable[..., HttpRequest], type[StreamDecoder]]] = {
    "openai": (_openai.build_request, _openai.OpenAIDecoder),
    "anthropic": (_anthropic.build_request, _anthropic.AnthropicDecoder),
    "openai-responses": (_responses.build_request, _responses.ResponsesDecoder),
}
_LOG_EVENT = {
    ("retry", False): "streamres.retry_scheduled",
    ("retry", True): "streamres.resume_scheduled",
    ("switch", False): "streamres.fallback_scheduled",
    ("switch", True): "streamres.fallback_scheduled",
    ("give_up", False): "streamres.attempt_failed",
    ("give_up", True): "streamres.attempt_failed",
}

# (base_url, model) pairs whose server refused an assistant prefill: instruct from now on.
_prefill_refused: set[tuple[str, str]] = set()
# Extra request headers whose values are credentials (masked like the API key).
_SECRET_HEADER = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|signature")
# Base URLs that have answered (any HTTP response) in this process: they get the patient policy.
_reached: set[str | None] = set()

_ssl_context: ssl.SSLContext | None = None


async def _shared_ssl_context() -> ssl.SSLContext:
    """One SSL context per process: building one costs ~40 ms (loading the CA bundle)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = await anyio.to_thread.run_sync(ssl.create_default_context)
    return _ssl_context


_counters: dict[str, tuple[str, Callable[[str], int]]] = {}


async def _counter(model: str) -> tuple[str, Callable[[str], int]]:
    """The token counter for ``model``, loaded once, off the event loop."""
    got = _counters.get(model)
    if got is None:
        got = _counters[model] = await anyio.to_thread.run_sync(counter_for, model)
    return got


def stream_resilient(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str | Sequence[str],
    base_url: str | None = None,
    api_key: str | None = None,
    provider: Provider = "openai",
    deadline: float = 120.0,
    stall_timeout: float | None = None,
    first_token_timeout: float = FIRST_OUTPUT,
    max_tokens: int | None = None,
    client: httpx.AsyncClient | None = None,
    continuation: Literal["auto", "prefill", "prefix", "instruct"] = "auto",
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    fallback_after: int = 2,
    headers: Mapping[str, str] | None = None,
    rng: random.Random | None = None,
    read_limits: ReadLimits | None = None,
    **more: Any,
) -> ResilientStream:
    """Stream one answer, surviving capacity errors, drops, stalls and truncations.

    Returns an async iterator of events (see :mod:`streamres` for the event types) that is
    also an async context manager: ``async with`` closes the HTTP response at once if the
    caller stops early. Extra keyword arguments (``temperature=``…) go into the request body.
    ``model`` may be a sequence of names: a fallback chain on the same server. For many
    models, endpoints and shared limits, use :class:`streamres.Client`.

    >>> async def main():
    ...     async with stream_resilient(
    ...         [{"role": "user", "content": "Hi"}], model="m", base_url=url
    ...     ) as events:
    ...         async for ev in events:
    ...             if ev.type == "text":
    ...                 print(ev.text, end="")

    Raises :class:`InvalidRequest` at once for bad arguments; every other failure is raised
    while iterating, as a :class:`StreamError` carrying ``partial_text``.
    """
    names = (
        (model,) if isinstance(model, str) else tuple(model) if isinstance(model, Sequence) else ()
    )
    if not names or not all(isinstance(m, str) and m for m in names):
        raise InvalidRequest(
            f"model must be a model name or a non-empty sequence of model names, not {model!r:.60}",
            reason="invalid",
        )
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise InvalidRequest(
            f"client must be an httpx.AsyncClient (or None), not {client!r:.60}", reason="invalid"
        )
    routes = [
        resolve_route(
            Route(
                m,
                provider=provider,
                base_url=base_url,
                api_key=api_key,
                name=f"{m}#{i}",
                continuation=continuation,
            )
        )
        for i, m in enumerate(names)
    ]
    # One call has no other streams to protect, so no breakers: it keeps trying until the
    # deadline. A Client shares breakers across its streams.
    fleet = Fleet(routes, breaker_threshold=1_000_000_000)
    opts = check_options(
        messages,
        fleet=fleet,
        chain=range(len(routes)),
        deadline=deadline,
        stall_timeout=stall_timeout,
        first_token_timeout=first_token_timeout,
        max_tokens=max_tokens,
        max_attempts=max_attempts,
        backoff=backoff,
        fallback_after=fallback_after,
        headers=headers,
        more=more,
        rng=rng,
        read_limits=read_limits,
    )
    return ResilientStream(_run(opts, client, None))


class ResilientStream:
    """The events of one answer: an async iterator and an async context manager."""

    __slots__ = ("_gen",)

    def __init__(self, gen: AsyncIterator[Event]) -> None:
        self._gen = gen

    def __aiter__(self) -> ResilientStream:
        return self

    async def __anext__(self) -> Event:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stop the answer and close its HTTP response (idempotent)."""
        await self._gen.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> ResilientStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Answer:
    """State of one answer across attempts: delivered text, position in the chain, usage."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.fleet = opts.fleet
        self.parts: list[str] = []
        self.chars = 0
        self.ledger: TokenLedger | None = None
        self.encoding = ""
        self.history: list[Attempt] = []
        self.failures = [0] * len(opts.chain)
        self.pos = 0
        self.resumes = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        #: Some attempt's output count is the ledger's estimate, not a server's report.
        self.estimated = False
        self.wasted = ""
        self.deduplicated = 0
        self.thinking: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()
        #: Complete signed thinking blocks of the answer so far (sent back on resume).
        self.signed_thinking: list[dict[str, Any]] = []
        #: A background Responses API response to re-attach to: (route, id, last sequence).
        self.replay: tuple[int, str, int] | None = None
        self.start = anyio.current_time()
        self.t_end = self.start + opts.deadline
        self.stall = StallTimer(fixed=opts.stall_timeout, first=opts.first_token_timeout)
        secrets: list[str | None] = [v for k, v in opts.headers.items() if _SECRET_HEADER.search(k)]
        for i in opts.chain:
            r = self.fleet.routes[i]
            secrets += [r.api_key, *url_secrets(r.base_url or "")]
        #: Every secret this answer sends, masked in every message, history entry and log.
        self.redactor = Redactor(secrets)

    @property
    def index(self) -> int:
        """The current route, as an index into ``fleet.routes``."""
        return self.opts.chain[self.pos]

    @property
    def route(self) -> Route:
        return self.fleet.routes[self.index]

    @property
    def model(self) -> str:
        return self.route.model

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    async def tokens(self) -> int:
        """Delivered tokens (loads the encoding the first time it is needed)."""
        if self.ledger is None:
            self.encoding, count = await _counter(self.model)
            self.ledger = TokenLedger(count)
            self.ledger.add(self.text)
        return self.ledger.tokens

    async def count(self, text: str) -> int:
        if not text:
            return 0
        _, count = await _counter(self.model)
        return count(text)

    def deliver(self, text: str) -> None:
        self.parts.append(text)
        self.chars += len(text)
        if self.ledger is not None:
            self.ledger.add(text)

    def account(self, decoder: StreamDecoder, *, estimate: int | None) -> dict[str, Any]:
        """Add one attempt's usage: what its server reported, else the ledger's ``estimate`` of
        what it generated (broken attempts report nothing, yet were generated and billed)."""
        reported = decoder.output_tokens
        estimated = reported is None and estimate is not None
        out = reported if reported is not None else estimate
        if decoder.input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + decoder.input_tokens
        if out is not None:
            self.output_tokens = (self.output_tokens or 0) + out
        self.estimated = self.estimated or estimated
        return {
            "input_tokens": decoder.input_tokens,
            "output_tokens": out,
            "estimated": estimated,
        }

    def error(self, cls: type[StreamError], message: str, last: Failure | None) -> StreamError:
        log.warning("streamres.failed", model=self.model, reason=last.kind if last else None)
        return cls(
            self.redactor.redact(message),
            partial_text=self.text,
            history=tuple(self.history),
            model=self.model,
            status_code=last.status_code if last else None,
            reason=last.kind if last else None,
        )

    def replaying(self) -> bool:
        return self.replay is not None and self.replay[0] == self.index

    def strategy(self) -> Strategy | Literal["replay"]:
        if self.replaying():
            return "replay"
        route = self.route
        assert route.base_url is not None
        if (route.base_url, route.model) in _prefill_refused:
            return "instruct"
        return choose(route.provider, route.base_url, route.continuation, self.opts.extra_body)

    async def request(self) -> tuple[HttpRequest, Deduplicator | None, int | None]:
        """The next request, its de-duplicator, and the token budget left (None: no cap)."""
        opts, route = self.opts, self.route
        assert route.base_url is not None
        build, _ = _PROVIDERS[route.provider]
        budget = opts.max_tokens
        if budget is None and route.provider == "anthropic":
            # The API requires max_tokens; the default bounds the whole answer, as it would
            # bound one uninterrupted stream.
            budget = _anthropic.DEFAULT_MAX_TOKENS
        messages, extra, dedup = opts.messages, opts.extra_body, None
        if self.replay is not None and self.replaying():
            # The server kept generating: re-attach and get exactly what was missed.
            _, response_id, after = self.replay
            req = _responses.replay_request(
                base_url=route.base_url,
                api_key=route.api_key,
                response_id=response_id,
                after=after,
                extra_headers=opts.headers,
            )
            return req, None, budget
        if self.chars:
            if budget is not None:
                budget -= await self.tokens()
            strategy = self.strategy()
            assert strategy != "replay"
            cont = build_continuation(
                opts.messages,
                self.text,
                strategy=strategy,
                provider=route.provider,
                thinking=self.signed_thinking,
            )
            messages, extra = cont.messages, {**opts.extra_body, **cont.extra_body}
            starts: list[int] = []
            if strategy == "instruct":
                # Token seams of the delivered text's end: where a model may restart (CJK).
                starts = await anyio.to_thread.run_sync(token_starts, route.model, self.text)
            dedup = Deduplicator(
                self.text,
                mode="instruct" if strategy == "instruct" else "prefill",
                stripped=cont.stripped,
                token_starts=starts,
            )
        req = build(
            base_url=route.base_url,
            api_key=route.api_key,
            model=route.model,
            messages=messages,
            max_tokens=budget,
            extra_body=extra,
            extra_headers=opts.headers,
        )
        return req, dedup, budget

    def next_available(self, now: float) -> tuple[int | None, float]:
        """A chain position whose breaker lets a request through now (this one first), or the
        earliest time one will. A model cooling down (after a Retry-After) until past the
        deadline is passed over: the answer moves to the next model instead of waiting in vain."""
        n = len(self.opts.chain)
        for step in range(n):
            pos = (self.pos + step) % n
            i = self.opts.chain[pos]
            if self.fleet.cooldown_left(i, now) >= self.t_end - now:
                continue
            before = self.fleet.states[i].breaker.state
            allowed = self.fleet.try_acquire(i, now)
            after = self.fleet.states[i].breaker.state
            _log_breaker(self.fleet.routes[i], after if after != before else None)
            if allowed:
                return pos, now
        return None, min(self.fleet.available_at(i, now) for i in self.opts.chain)

    def probing(self) -> bool:
        """Is a half-open model's one probe in flight? (Its outcome may free the model soon.)"""
        return any(self.fleet.probing(i) for i in self.opts.chain)

    def unavailable(self, now: float) -> str:
        """Why no model can take a request before the deadline, model by model."""
        why = []
        for i in dict.fromkeys(self.opts.chain):
            route, state = self.fleet.routes[i], self.fleet.states[i]
            cool = self.fleet.cooldown_left(i, now)
            if cool > 0:
                why.append(f"{route.model} cooling down for {cool:.0f} s (Retry-After)")
            elif state.breaker.state != "closed":
                wait = max(0.0, state.breaker.available_at(now) - now)
                why.append(f"{route.model} circuit open for {wait:.0f} s")
        return "no model can take a request before the deadline: " + "; ".join(why)

    async def done(self, finish_reason: str, refusal: str = "") -> DoneEvent:
        single = self.resumes == 0 and not self.estimated and self.ledger is None
        if single and self.output_tokens is not None:
            delivered = self.output_tokens  # the server's own count of this single attempt
        else:
            delivered = await self.tokens()
        output = self.output_tokens
        if self.estimated and output is not None:
            output = max(output, delivered)  # never fewer than what reached the caller
        usage = Usage(
            input_tokens=self.input_tokens,
            output_tokens=output,
            estimated=self.estimated,
            delivered_tokens=delivered,
            wasted_tokens=await self.count(self.wasted),
            encoding=self.encoding or "reported",
        )
        elapsed = anyio.current_time() - self.start
        log.info(
            "streamres.done",
            model=self.model,
            attempts=len(self.history),
            resumes=self.resumes,
            chars=self.chars,
            finish_reason=finish_reason,
            seconds=round(elapsed, 3),
        )
        return DoneEvent(
            text=self.text,
            finish_reason=finish_reason,
            model=self.model,
            attempts=len(self.history),
            resumes=self.resumes,
            usage=usage,
            history=tuple(self.history),
            deduplicated_chars=self.deduplicated,
            elapsed=elapsed,
            tool_calls=self.tool_calls,
            thinking="".join(self.thinking),
            refusal=refusal,
        )


def _connect_cause(exc: BaseException) -> str:
    """Why a connection could not be made, in words, from the exception and its causes."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, BaseExceptionGroup) and seen.exceptions:
            seen = seen.exceptions[0]  # every address failed; the first says why
            continue
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused (is the server running, on that port?)"
        if isinstance(seen, socket.gaierror):
            return "the host name could not be resolved (DNS)"
        if isinstance(seen, ssl.SSLError):
            return f"the TLS handshake failed ({getattr(seen, 'reason', None) or seen})"
        if isinstance(seen, (TimeoutError, httpx.ConnectTimeout)):
            return "no connection within the connect timeout"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    if "refused" in text:
        return "connection refused (is the server running, on that port?)"
    if "name or service" in text or "nodename" in text or "getaddrinfo" in text:
        return "the host name could not be resolved (DNS)"
    if "ssl" in text or "certificate" in text or "tls" in text:
        return f"the TLS handshake failed ({exc})"
    return str(exc) or type(exc).__name__


def _transport_failure(exc: Exception, url: str) -> Failure:
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return Failure(
            "connection", f"Cannot reach {redact_url(url)} — {_connect_cause(exc)}", connect=True
        )
    return failure("connection", f"connection lost mid-response ({str(exc) or type(exc).__name__})")


#: httpcore trace events that mark the end of the wait for a pooled connection.
_SERVED = ("connect_tcp.started", "send_request_headers.started")


async def _send(
    client: httpx.AsyncClient, request: httpx.Request, *, t_end: float, stall: float
) -> tuple[httpx.Response | None, Failure | None, float]:
    """Send ``request`` and wait for the response headers: (response, failure, queued seconds).

    Three waits, three bounds. Queued for a pooled connection (other streams hold them all):
    only the deadline, since that says nothing about the model. Connecting: httpx's connect
    timeout. Request sent, waiting for headers: the stall timer. httpcore's trace hook says
    when each phase begins; redirects are never followed (a key must not go to another origin).
    """
    started = anyio.current_time()
    served: list[float] = []
    response: httpx.Response | None = None
    with anyio.CancelScope(deadline=t_end) as scope:

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            if not served and name.endswith(_SERVED):
                served.append(anyio.current_time())
            if name.endswith("send_request_headers.started"):
                scope.deadline = min(t_end, anyio.current_time() + stall)

        request.extensions["trace"] = trace
        try:
            response = await client.send(request, stream=True, follow_redirects=False)
        except httpx.TransportError as exc:
            failed = _transport_failure(exc, str(request.url))
            return None, failed, (served[0] if served else started) - started
        except httpx.HTTPError as exc:
            why = str(exc) or type(exc).__name__
            return None, failure("connection", f"the request failed ({why})"), 0.0
    t = anyio.current_time()
    queued = (served[0] if served else t) - started
    if response is not None:
        return response, None, queued
    if t >= t_end:
        return None, failure("deadline", "no response headers before the deadline"), queued
    return None, failure("stall", f"no response within {stall:g} s of sending the request"), queued


_ERROR_BODY_LIMIT = 64 * 1024


async def _read_body(raw: AsyncIterator[bytes], inflater: Inflater, seconds: float) -> bytes:
    """The start of a body that is not an event stream (an error, a page), bounded in size
    and time: enough to classify it."""
    body = b""
    with anyio.move_on_after(seconds):
        try:
            async for part in raw:
                body += inflater.feed(part)
                if len(body) > _ERROR_BODY_LIMIT:
                    break
        except (httpx.HTTPError, InflateError):
            pass
    return body[:_ERROR_BODY_LIMIT]


async def _close(body_iter: AsyncIterator[bytes] | None, response: httpx.Response | None) -> None:
    if body_iter is not None:
        await body_iter.aclose()  # type: ignore[attr-defined]
    if response is not None:
        await response.aclose()


async def _drain(chunks: AsyncIterator[bytes], seconds: float) -> None:
    """Read what follows the terminal event (usually just the end of the chunked body), so
    the connection can go back to the pool instead of being torn down."""
    with anyio.move_on_after(seconds):
        try:
            async for _ in chunks:
                pass
        except httpx.HTTPError:
            pass


def _log_breaker(route: Route, state: str | None) -> None:
    if state is not None:
        log.info(f"streamres.breaker_{state}", model=route.key)


async def _run(
    opts: Options, client: httpx.AsyncClient | None, limits: Limits | None
) -> AsyncIterator[Event]:
    ans = _Answer(opts)
    fleet = opts.fleet
    own_client = client is None
    #: A complete response whose body's end is read after the done event is out.
    lingering: tuple[AsyncIterator[bytes], httpx.Response] | None = None
    now = anyio.current_time
    try:
        if client is None:
            client = httpx.AsyncClient(verify=await _shared_ssl_context(), timeout=None)
        attempt = 0
        fail: Failure | None = None
        while True:
            # -- where the next attempt goes: a model whose circuit lets it through -----------
            pos, ready_at = ans.next_available(now())
            if pos is None:
                probing = limits is not None and ans.probing()
                if ready_at >= ans.t_end and not probing:
                    raise ans.error(DeadlineExceeded, ans.unavailable(now()), fail)
                wait = max(0.0, min(ready_at, ans.t_end) - now())
                yield RetryEvent(
                    message=busy_message(
                        wait,
                        probing=probing,
                        capacity=fail is None or fail.kind in ("capacity", "rate_limit"),
                    ),
                    attempt=attempt + 1,
                    delay=wait,
                    reason="circuit_open",
                    model=ans.model,
                )
                if probing and limits is not None:
                    # Another stream's probe is deciding: its outcome wakes this one.
                    await limits.changed(wait)
                else:
                    await anyio.sleep(wait)
                if now() >= ans.t_end:
                    raise ans.error(DeadlineExceeded, ans.unavailable(now()), fail)
                continue
            if pos != ans.pos:
                old = ans.index
                ans.pos = pos
                fleet.fell_back(old, ans.index)
                yield FallbackEvent(
                    message=fallback_message(fleet.routes[old].model, ans.model, "circuit_open"),
                    attempt=attempt + 1,
                    from_model=fleet.routes[old].model,
                    to_model=ans.model,
                    reason="circuit_open",
                    tokens_so_far=await ans.tokens() if ans.chars else 0,
                )
            attempt += 1
            index, route = ans.index, ans.route
            # The breaker let this attempt through (in half-open: as the one probe). Until the
            # outcome is recorded, leaving by any path must give that back: "acquired" frees
            # the probe, "started" also takes the request off the in-flight count.
            books: Literal["acquired", "started", "recorded"] = "acquired"
            slot = False
            try:
                # -- a shared cool-down (another stream got Retry-After), the retry budget ---
                wait = fleet.cooldown_left(index, now())
                if wait > 0:
                    wait = after_hint(wait, opts.rng.random())
                while True:
                    if attempt > 1:
                        budget_wait = fleet.budget.wait(now())
                        if budget_wait > 0:
                            log.info(
                                "streamres.retry_budget_spent", model=route.key, wait=budget_wait
                            )
                            # Jitter, so the streams queued on the budget do not wake together.
                            wait = max(wait, budget_wait * (1 + 0.2 * opts.rng.random()))
                    if wait > 0:
                        if now() + wait >= ans.t_end:
                            raise ans.error(
                                DeadlineExceeded,
                                f"{route.model} is cooling down or the retry budget is spent; "
                                f"the next request would come after the deadline",
                                fail,
                            )
                        await anyio.sleep(wait)
                        wait = 0.0
                    if attempt == 1:
                        fleet.budget.deposit(now())
                        break
                    if fleet.budget.withdraw(now()):
                        break
                # -- a slot under the route's and the account's concurrency limits ----------
                if limits is not None:
                    asked = now()
                    slot = await limits.acquire(route, ans.t_end - now())
                    fleet.queued(index, now() - asked)
                    if not slot:
                        raise ans.error(
                            DeadlineExceeded,
                            f"no free slot on {route.model} (max_in_flight) before the deadline",
                            fail,
                        )
                req, dedup, budget = await ans.request()
                if budget is not None and budget <= 0:
                    yield await ans.done("length")
                    return
                _, decoder_cls = _PROVIDERS[route.provider]
                decoder = decoder_cls()
                if isinstance(decoder, _responses.ResponsesDecoder):
                    decoder.custom_tools = _responses.custom_tool_names(opts.extra_body)
                sse = SSEDecoder(max_line=opts.read_limits.line, max_event=opts.read_limits.event)
                started = now()
                ans.stall.start(started)
                first_content: float | None = None
                chars_before = ans.chars
                tokens_before = ans.ledger.tokens if ans.ledger is not None else 0
                fail = None
                fleet.started(index, resume=bool(ans.chars))
                books = "started"
                log.debug(
                    "streamres.attempt_started",
                    model=route.key,
                    attempt=attempt,
                    url=redact_url(req.url),
                )
                reached = route.base_url in _reached
                try:
                    request = client.build_request(
                        req.method,
                        req.url,
                        headers={"accept-encoding": ACCEPT_ENCODING, **req.headers},
                        json=req.body if req.method == "POST" else None,
                        timeout=httpx.Timeout(None, connect=connect_timeout(reached)),
                    )
                except (httpx.InvalidURL, httpx.HTTPError, TypeError, ValueError) as exc:
                    raise ans.error(
                        InvalidRequest,
                        f"cannot build the request to {redact_url(req.url)}: {exc}",
                        None,
                    ) from exc
                response, fail, queued = await _send(
                    client, request, t_end=ans.t_end, stall=ans.stall.limit()
                )
                fleet.queued(index, queued)
                if response is not None:
                    _reached.add(route.base_url)
                body_iter: AsyncIterator[bytes] | None = None
                if response is not None:
                    try:
                        inflater = Inflater(
                            response.headers.get("content-encoding"),
                            limit=opts.read_limits.inflate,
                        )
                        status = response.status_code
                        if status >= 300 or not is_event_stream(response.headers):
                            body = await _read_body(
                                response.aiter_raw(),
                                inflater,
                                min(ans.t_end - now(), ans.stall.limit()),
                            )
                            text = body.decode("utf-8", "replace")
                            fail = (
                                classify_response(
                                    status,
                                    response.headers,
                                    text,
                                    now=time.time(),
                                    url=redact_url(req.url),
                                )
                                if status >= 400
                                else classify_not_a_stream(
                                    status,
                                    response.headers,
                                    text,
                                    url=redact_url(req.url),
                                    now=time.time(),
                                )
                            )
                        else:
                            body_iter = response.aiter_raw()
                            chunks = body_iter.__aiter__()
                            ans.stall.start(now())  # the stall timer starts with the headers
                            while fail is None:
                                # Only the stall timer and the deadline cancel a read: httpcore
                                # closes a response whose read is cancelled, so a held de-dup
                                # head is released when the next bytes come (see below).
                                limit = min(ans.t_end, ans.stall.deadline())
                                chunk: bytes | None = None
                                eof = False
                                with anyio.move_on_after(limit - now()) as scope:
                                    try:
                                        chunk = await chunks.__anext__()
                                    except StopAsyncIteration:
                                        eof = True
                                if scope.cancelled_caught:
                                    t = now()
                                    if t >= ans.t_end:
                                        fail = failure("deadline", "the deadline passed mid-stream")
                                        break
                                    fail = failure(
                                        "stall", f"no output for {ans.stall.limit():.3g} s"
                                    )
                                    break
                                if eof:
                                    inflater.close()
                                    events = sse.close()
                                elif inflater.identity:
                                    events = sse.feed(chunk or b"")
                                else:
                                    events = sse.feed(inflater.feed(chunk or b""))
                                if sse.overflow is not None:
                                    decoder.error = failure("malformed", sse.overflow)
                                pieces: list[str] = []
                                try:
                                    for name, data in events:
                                        piece = decoder.feed(name, data)
                                        if piece:
                                            pieces.append(piece)
                                        if decoder.error is not None or decoder.terminal:
                                            break
                                except DECODE_ERRORS as exc:
                                    decoder.error = failure(
                                        "malformed",
                                        f"an event of an unexpected shape from the server "
                                        f"({type(exc).__name__}: {str(exc)[:200]})",
                                    )
                                ending = decoder.error is not None or decoder.terminal or eof
                                if ending:
                                    # Decided before the side channel is drained: whole tool
                                    # calls may end a turn that had no finish reason.
                                    fail = decoder.end_failure()
                                calls: tuple[ToolCall, ...] = ()
                                if decoder.side or decoder.generating:
                                    ans.stall.output(now())  # reasoning or arguments: working
                                    decoder.generating = False
                                if decoder.side:
                                    # Reasoning comes before the text it leads to; tool calls
                                    # end the turn, so they go after this read's text.
                                    for kind, value in decoder.side:
                                        if kind == "thinking":
                                            ans.thinking.append(value)
                                            yield ThinkingEvent(value)
                                        else:
                                            calls = value
                                    decoder.side.clear()
                                if not pieces and dedup is not None and not dedup.resolved:
                                    text = dedup.poll(now=now())  # a hold that ran out
                                    if text:
                                        ans.deliver(text)
                                        yield TextEvent(text)
                                if pieces:
                                    t = now()
                                    ans.stall.output(t)
                                    if first_content is None:
                                        first_content = t
                                    text = pieces[0] if len(pieces) == 1 else "".join(pieces)
                                    if dedup is not None and not dedup.resolved:
                                        text = dedup.feed(text, now=t)
                                    if text:
                                        ans.deliver(text)
                                        yield TextEvent(text)
                                if calls:
                                    ans.tool_calls = calls
                                    for call in calls:
                                        yield ToolCallEvent(call.id, call.name, call.arguments)
                                if ending:
                                    if fail is None and not eof:
                                        # Complete: read the body's end after the done event
                                        # is out, so the connection can be reused.
                                        lingering = (body_iter, response)
                                    break
                    except InflateError as exc:
                        fail = failure("malformed", str(exc))
                    except httpx.HTTPError as exc:
                        fail = _transport_failure(exc, req.url)
                    finally:
                        if lingering is None:
                            with anyio.CancelScope(shield=True):
                                await _close(body_iter, response)
                replayed = ans.replaying()
                if isinstance(decoder, _responses.ResponsesDecoder):
                    response_id = decoder.response_id or (
                        ans.replay[1] if replayed and ans.replay else None
                    )
                    background = decoder.background or bool(opts.extra_body.get("background"))
                    if decoder.response_failed:
                        ans.replay = None  # a failed response replays its failure: start anew
                    elif response_id and background and decoder.sequence is not None:
                        ans.replay = (index, response_id, decoder.sequence)
                if fail is not None:
                    fail = reinterpret(
                        fail,
                        prefill_continuation=dedup is not None and dedup.mode == "prefill",
                        replaying=replayed,
                    )
                    # Servers echo keys in error bodies: no secret goes further than here.
                    fail = dataclasses.replace(fail, message=ans.redactor.redact(fail.message))
                    if fail.kind == "replay_unavailable":
                        ans.replay = None
                seconds = now() - started
                ttft = first_content - started if first_content is not None else None
                dropped = ""
                if dedup is not None:
                    if fail is None and not dedup.resolved:
                        text = dedup.finish(now=now())
                        if text:
                            ans.deliver(text)
                            yield TextEvent(text)
                    held = dedup.abandon() if not dedup.resolved else ""
                    dropped = dedup.stats.dropped + held
                    ans.wasted += dropped
                    ans.deduplicated += len(dedup.stats.dropped)
                added = ans.chars - chars_before
                if added and not ans.signed_thinking:
                    # The signed blocks that led to the first text shown: sent back on resume.
                    ans.signed_thinking = list(decoder.signed_thinking)
                weight = fleet.states[index].weight.current
                if fail is None:
                    _log_breaker(route, fleet.succeeded(index, now(), ttft=ttft, latency=seconds))
                else:
                    _log_breaker(
                        route,
                        fleet.failed(
                            index, now(), fail.kind, ttft=ttft, retry_after=fail.retry_after
                        ),
                    )
                    if fail.retry_after is not None:
                        log.info(
                            "streamres.cooldown_started",
                            model=route.key,
                            seconds=round(fail.retry_after, 3),
                        )
                books = "recorded"
                if fleet.states[index].weight.current != weight:
                    log.debug(
                        "streamres.weight_changed",
                        model=route.key,
                        weight=round(fleet.states[index].weight.current, 4),
                    )
                wasted_tokens = await ans.count(dropped)
                if attempt == 1 and fail is None and decoder.output_tokens is not None:
                    delivered = decoder.output_tokens
                else:
                    delivered = (await ans.tokens() - tokens_before) if added else 0
                fleet.tokens(index, delivered=delivered, wasted=wasted_tokens)
                usage_fields = ans.account(
                    decoder, estimate=delivered + wasted_tokens if added or dropped else None
                )
            finally:
                if books == "acquired":
                    fleet.release(index)
                elif books == "started":  # cancelled, or an error raised mid-attempt
                    fleet.abandoned(index)
                if limits is not None:
                    if slot:
                        limits.release(route)
                    limits.notify()  # an outcome is recorded: streams waiting on a probe wake

            dedup_fields: dict[str, Any] = {}
            if dedup is not None:
                dedup_fields = {
                    "repeated_chars": len(dedup.stats.dropped),
                    "held_chars": dedup.stats.held_chars,
                    "hold_seconds": dedup.stats.hold_seconds,
                }
            if fail is None:
                ans.history.append(
                    Attempt(
                        attempt,
                        route.model,
                        "ok",
                        chars=added,
                        seconds=seconds,
                        **dedup_fields,
                        **usage_fields,
                    )
                )
                ans.failures[ans.pos] = 0
                refusal = "".join(decoder.refusal)
                finish = "refusal" if refusal else decoder.finish_reason or "stop"
                yield await ans.done(finish, refusal)
                if lingering is not None:
                    # The caller has its done event; now let the connection go back to the pool.
                    await _drain(lingering[0], min(ans.t_end - now(), 1.0))
                return

            # -- the attempt failed: record it, then retry, resume, switch or give up --------
            ans.history.append(
                Attempt(
                    attempt,
                    route.model,
                    fail.kind,
                    fail.message,
                    fail.status_code,
                    chars=added,
                    seconds=seconds,
                    **dedup_fields,
                    **usage_fields,
                )
            )
            if fail.kind == "prefill_rejected":
                assert route.base_url is not None
                _prefill_refused.add((route.base_url, route.model))
            ans.failures[ans.pos] = 1 if added else ans.failures[ans.pos] + 1
            decision = decide(
                fail,
                attempt=attempt,
                max_attempts=opts.max_attempts,
                model_index=ans.pos,
                failures=ans.failures,
                time_left=ans.t_end - now(),
                backoff=opts.backoff,
                rand=opts.rng.random(),
                fallback_after=opts.fallback_after,
                reached=reached,
            )
            tokens = await ans.tokens() if ans.chars else 0
            log.info(
                _LOG_EVENT[decision.action, bool(ans.chars)],
                model=route.key,
                attempt=attempt,
                reason=fail.kind,
                status_code=fail.status_code,
                error=fail.message,
                chars=ans.chars,
                delay=round(decision.delay, 3),
            )
            if decision.action == "give_up":
                cls: type[StreamError] = {
                    "rejected": RequestRejected,
                    "attempts": AttemptsExhausted,
                    "unreachable": UpstreamUnreachable,
                }.get(decision.error, DeadlineExceeded)
                if cls is RequestRejected:
                    message = f"{route.model} refused the request ({fail.message}); not retried"
                elif cls is UpstreamUnreachable:
                    message = (
                        f"{decision.why}. Check that the server is running and reachable from "
                        "here, and that base_url (and provider) are right."
                    )
                else:
                    message = f"gave up after {plural(attempt, 'attempt')}: {decision.why}"
                raise ans.error(cls, message, fail)
            if ans.chars:
                ans.resumes += 1
            if decision.action == "switch":
                ans.pos = decision.model_index
                fleet.fell_back(index, ans.index)
                yield FallbackEvent(
                    message=fallback_message(
                        route.model, ans.model, "unreachable" if fail.connect else fail.kind
                    ),
                    attempt=attempt + 1,
                    from_model=route.model,
                    to_model=ans.model,
                    reason=fail.kind,
                    tokens_so_far=tokens,
                )
            elif ans.chars:
                yield ResumeEvent(
                    message=resume_message(fail, delay=decision.delay, tokens=tokens),
                    attempt=attempt + 1,
                    delay=decision.delay,
                    reason=fail.kind,
                    model=route.model,
                    strategy=ans.strategy(),
                    tokens_so_far=tokens,
                    chars_so_far=ans.chars,
                )
            else:
                yield RetryEvent(
                    message=retry_message(
                        fail, delay=decision.delay, attempt=attempt + 1, cap=opts.max_attempts
                    ),
                    attempt=attempt + 1,
                    delay=decision.delay,
                    reason=fail.kind,
                    model=route.model,
                    status_code=fail.status_code,
                )
            if decision.delay > 0:
                await anyio.sleep(decision.delay)
    except (StreamError, GeneratorExit):
        raise
    except Exception as exc:
        # A bug, not a failure of the upstream; still, nothing is lost and only a StreamError
        # leaves the library.
        raise ans.error(
            StreamError,
            f"unexpected error inside streamres ({type(exc).__name__}: {exc}); the partial "
            "answer is kept. Please report this.",
            None,
        ) from exc
    finally:
        with anyio.CancelScope(shield=True):
            if lingering is not None:
                await _close(*lingering)
            if own_client and client is not None:
                await client.aclose()
