"""The I/O shell: ``stream_resilient()``.

This is the only module that opens HTTP streams, sleeps and reads clocks. Every decision is
delegated to the pure core: SSE decoding (``_sse``), provider events (``_openai``,
``_anthropic``), classification (``_classify``), what to do next (``_policy``), continuation
requests (``_continuation``), overlap removal (``_dedup``) and the token ledger (``_tokens``).

The deadline is an absolute time fixed at the first call; every await (connect, each read,
each backoff) is bounded by it with a cancel scope around *that await only*: a cancel scope
must never span a ``yield`` of an async generator. Reads are also bounded by the stall timer,
which only content resets (keep-alive comments and pings do not).
"""

from __future__ import annotations

import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import anyio
import httpx
import structlog

from . import _anthropic, _openai
from ._backoff import Backoff
from ._classify import Failure, classify_response, failure
from ._continuation import Strategy, build_continuation, choose
from ._dedup import Deduplicator
from ._errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    InvalidRequest,
    RequestRejected,
    StreamError,
)
from ._events import (
    Attempt,
    DoneEvent,
    Event,
    FallbackEvent,
    ResumeEvent,
    RetryEvent,
    TextEvent,
    Usage,
)
from ._policy import decide
from ._sse import SSEDecoder
from ._tokens import TokenLedger, counter_for
from ._wire import HttpRequest, StreamDecoder
from ._wording import fallback_message, resume_message, retry_message

__all__ = ["ResilientStream", "stream_resilient"]

log = structlog.get_logger("streamres")

Provider = Literal["openai", "anthropic"]

_PROVIDERS: dict[str, tuple[Callable[..., HttpRequest], type[StreamDecoder]]] = {
    "openai": (_openai.build_request, _openai.OpenAIDecoder),
    "anthropic": (_anthropic.build_request, _anthropic.AnthropicDecoder),
}
_DEFAULT_URLS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_RESERVED = frozenset({"model", "messages", "stream", "max_tokens", "max_completion_tokens"})
_ERROR_BODY_LIMIT = 64 * 1024
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


@dataclass(frozen=True, slots=True)
class _Plan:
    """Validated arguments of one ``stream_resilient()`` call."""

    messages: list[dict[str, Any]]
    models: tuple[str, ...]
    provider: Provider
    base_url: str
    api_key: str | None
    deadline: float
    stall_timeout: float
    max_tokens: int | None
    continuation: str
    max_attempts: int | None
    backoff: Backoff
    fallback_after: int
    headers: dict[str, str]
    extra_body: dict[str, Any]
    rng: random.Random = field(default_factory=random.Random)


def _validate(
    messages: Any,
    model: Any,
    provider: Any,
    base_url: Any,
    api_key: Any,
    deadline: Any,
    stall_timeout: Any,
    max_tokens: Any,
    continuation: Any,
    max_attempts: Any,
    backoff: Backoff | None,
    fallback_after: Any,
    headers: Mapping[str, str] | None,
    more: dict[str, Any],
    rng: random.Random | None,
) -> _Plan:
    def bad(what: str) -> InvalidRequest:
        return InvalidRequest(what, reason="invalid")

    if provider not in _PROVIDERS:
        raise bad(f"provider must be 'openai' or 'anthropic', not {provider!r}")
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise bad("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise bad(f"messages[{i}] must be a dict with 'role' and 'content'; got {m!r:.80}")
        if m["role"] not in _ROLES:
            raise bad(f"messages[{i}] has role {m['role']!r}; expected one of {sorted(_ROLES)}")
        if not isinstance(m["content"], (str, list)):
            raise bad(f"messages[{i}]['content'] must be a string or a list of content parts")
        checked.append(dict(m))
    models = (model,) if isinstance(model, str) else tuple(model or ())
    if not models or not all(isinstance(x, str) and x for x in models):
        raise bad("model must be a model name or a non-empty sequence of model names")
    env_url, official, env_key = _DEFAULT_URLS[provider]
    url = base_url or os.environ.get(env_url) or official
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise bad(f"base_url must be an http:// or https:// URL, not {url!r}")
    key = api_key if api_key is not None else os.environ.get(env_key)
    if not key and url == official:
        raise bad(f"no API key for {official}: pass api_key=... or set {env_key}")
    for name, value, low in (("deadline", deadline, 0), ("stall_timeout", stall_timeout, 0)):
        if not isinstance(value, (int, float)) or not value > low:
            raise bad(f"{name} must be a positive number of seconds, not {value!r}")
    for name, value in (("max_tokens", max_tokens), ("max_attempts", max_attempts)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise bad(f"{name} must be None or a positive integer, not {value!r}")
    if continuation not in ("auto", "prefill", "prefix", "instruct"):
        raise bad("continuation must be 'auto', 'prefill', 'prefix' or 'instruct'")
    if not isinstance(fallback_after, int) or fallback_after < 1:
        raise bad(f"fallback_after must be a positive integer, not {fallback_after!r}")
    reserved = _RESERVED & more.keys()
    if reserved:
        raise bad(f"{sorted(reserved)} are set by streamres; use model=/max_tokens= instead")
    return _Plan(
        messages=checked,
        models=models,
        provider=provider,
        base_url=url,
        api_key=key,
        deadline=float(deadline),
        stall_timeout=float(stall_timeout),
        max_tokens=max_tokens,
        continuation=continuation,
        max_attempts=max_attempts,
        backoff=backoff or Backoff(),
        fallback_after=fallback_after,
        headers=dict(headers or {}),
        extra_body=more,
        rng=rng or random.Random(),
    )


def stream_resilient(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str | Sequence[str],
    base_url: str | None = None,
    api_key: str | None = None,
    provider: Provider = "openai",
    deadline: float = 120.0,
    stall_timeout: float = 30.0,
    max_tokens: int | None = None,
    client: httpx.AsyncClient | None = None,
    continuation: Literal["auto", "prefill", "prefix", "instruct"] = "auto",
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    fallback_after: int = 2,
    headers: Mapping[str, str] | None = None,
    rng: random.Random | None = None,
    **more: Any,
) -> ResilientStream:
    """Stream one answer, surviving capacity errors, drops, stalls and truncations.

    Returns an async iterator of events (see :mod:`streamres` for the event types) that is
    also an async context manager: ``async with`` closes the HTTP response at once if the
    caller stops early. Extra keyword arguments (``temperature=``…) go into the request body.

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
    plan = _validate(
        messages,
        model,
        provider,
        base_url,
        api_key,
        deadline,
        stall_timeout,
        max_tokens,
        continuation,
        max_attempts,
        backoff,
        fallback_after,
        headers,
        more,
        rng,
    )
    return ResilientStream(_run(plan, client))


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
    """State of one answer across attempts (delivered text, usage, history)."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.parts: list[str] = []
        self.chars = 0
        self.ledger: TokenLedger | None = None
        self.encoding = ""
        self.history: list[Attempt] = []
        self.failures = [0] * len(plan.models)
        self.model_index = 0
        self.resumes = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.wasted = ""
        self.deduplicated = 0
        self.start = anyio.current_time()
        self.t_end = self.start + plan.deadline

    @property
    def model(self) -> str:
        return self.plan.models[self.model_index]

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

    def deliver(self, text: str) -> None:
        self.parts.append(text)
        self.chars += len(text)
        if self.ledger is not None:
            self.ledger.add(text)

    def add_usage(self, decoder: StreamDecoder) -> None:
        if decoder.input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + decoder.input_tokens
        if decoder.output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + decoder.output_tokens

    def error(self, cls: type[StreamError], message: str, last: Failure | None) -> StreamError:
        return cls(
            message,
            partial_text=self.text,
            attempts=tuple(self.history),
            model=self.model,
            status_code=last.status_code if last else None,
            reason=last.kind if last else None,
        )

    def strategy(self) -> Strategy:
        plan = self.plan
        if (plan.base_url, self.model) in _prefill_refused:
            return "instruct"
        return choose(plan.provider, plan.base_url, plan.continuation)

    async def request(self) -> tuple[HttpRequest, Deduplicator | None, int | None]:
        """The next request, its de-duplicator, and the token budget left (None: no cap)."""
        plan = self.plan
        build, _ = _PROVIDERS[plan.provider]
        budget = plan.max_tokens
        if budget is None and plan.provider == "anthropic":
            # The API requires max_tokens; the default bounds the whole answer, as it would
            # bound one uninterrupted stream.
            budget = _anthropic.DEFAULT_MAX_TOKENS
        messages, extra, dedup = plan.messages, plan.extra_body, None
        if self.chars:
            if budget is not None:
                budget -= await self.tokens()
            strategy = self.strategy()
            cont = build_continuation(
                plan.messages, self.text, strategy=strategy, provider=plan.provider
            )
            messages, extra = cont.messages, {**plan.extra_body, **cont.extra_body}
            dedup = Deduplicator(
                self.text,
                mode="instruct" if strategy == "instruct" else "prefill",
                stripped=cont.stripped,
            )
        req = build(
            base_url=plan.base_url,
            api_key=plan.api_key,
            model=self.model,
            messages=messages,
            max_tokens=budget,
            extra_body=extra,
            extra_headers=plan.headers,
        )
        return req, dedup, budget

    async def done(self, finish_reason: str) -> DoneEvent:
        if self.resumes == 0 and self.output_tokens is not None and self.ledger is None:
            delivered = self.output_tokens  # the server's own count of this single attempt
        else:
            delivered = await self.tokens()
        wasted = 0
        if self.wasted:
            _, count = await _counter(self.model)
            wasted = count(self.wasted)
        usage = Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            delivered_tokens=delivered,
            wasted_tokens=wasted,
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
        )


def _transport_failure(exc: Exception) -> Failure:
    if isinstance(exc, httpx.DecodingError):
        return failure("malformed", f"the response body could not be decoded: {exc}")
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return failure("connection", f"cannot connect ({exc or name})")
    return failure("connection", f"connection lost mid-response ({exc or name})")


async def _drain(chunks: AsyncIterator[bytes], seconds: float) -> None:
    """Read what follows the terminal event (usually just the end of the chunked body), so
    the connection can go back to the pool instead of being torn down."""
    with anyio.move_on_after(seconds):
        try:
            async for _ in chunks:
                pass
        except httpx.TransportError:
            pass


async def _run(plan: _Plan, client: httpx.AsyncClient | None) -> AsyncIterator[Event]:
    ans = _Answer(plan)
    own_client = client is None
    now = anyio.current_time
    try:
        if client is None:
            client = httpx.AsyncClient(verify=await _shared_ssl_context(), timeout=None)
        attempt = 0
        while True:
            attempt += 1
            req, dedup, budget = await ans.request()
            if budget is not None and budget <= 0:
                yield await ans.done("length")
                return
            model = ans.model
            _, decoder_cls = _PROVIDERS[plan.provider]
            decoder = decoder_cls()
            sse = SSEDecoder()
            started = now()
            chars_before = ans.chars
            fail: Failure | None = None
            log.debug("streamres.attempt_started", model=model, attempt=attempt, url=req.url)
            try:
                request = client.build_request(
                    "POST",
                    req.url,
                    headers=req.headers,
                    json=req.body,
                    timeout=httpx.Timeout(None, connect=min(plan.stall_timeout, 10.0)),
                )
            except (httpx.InvalidURL, httpx.HTTPError, TypeError, ValueError) as exc:
                raise ans.error(
                    InvalidRequest, f"cannot build the request to {req.url}: {exc}", None
                ) from exc
            response: httpx.Response | None = None
            body_iter: AsyncIterator[bytes] | None = None
            try:
                with anyio.move_on_after(min(ans.t_end, started + plan.stall_timeout) - now()):
                    response = await client.send(request, stream=True)
            except httpx.TransportError as exc:
                fail = _transport_failure(exc)
            except httpx.HTTPError as exc:
                raise ans.error(InvalidRequest, f"cannot send the request: {exc}", None) from exc
            if response is None and fail is None:
                fail = (
                    failure("stall", "no response headers before the deadline")
                    if now() >= ans.t_end
                    else failure("stall", f"no response within {plan.stall_timeout:g} s")
                )
            if response is not None:
                try:
                    if response.status_code >= 400:
                        body = b""
                        with anyio.move_on_after(min(ans.t_end - now(), plan.stall_timeout)):
                            async for part in response.aiter_bytes():
                                body += part
                                if len(body) > _ERROR_BODY_LIMIT:
                                    break
                        fail = classify_response(
                            response.status_code,
                            response.headers,
                            body.decode("utf-8", "replace"),
                            now=time.time(),
                        )
                    else:
                        body_iter = response.aiter_bytes()
                        chunks = body_iter.__aiter__()
                        last_content = started
                        while fail is None:
                            limit = min(ans.t_end, last_content + plan.stall_timeout)
                            release = dedup.release_at if dedup is not None else None
                            if release is not None:
                                limit = min(limit, release)
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
                                    fail = failure("stall", "the deadline passed mid-stream")
                                    break
                                if dedup is not None and release is not None and t >= release:
                                    text = dedup.poll(now=t)
                                    if text:
                                        ans.deliver(text)
                                        yield TextEvent(text)
                                    continue
                                fail = failure("stall", f"no output for {plan.stall_timeout:g} s")
                                break
                            events = sse.close() if eof else sse.feed(chunk or b"")
                            pieces: list[str] = []
                            for name, data in events:
                                piece = decoder.feed(name, data)
                                if piece:
                                    pieces.append(piece)
                                if decoder.error is not None or decoder.terminal:
                                    break
                            if pieces:
                                t = now()
                                last_content = t
                                text = pieces[0] if len(pieces) == 1 else "".join(pieces)
                                if dedup is not None and not dedup.resolved:
                                    text = dedup.feed(text, now=t)
                                if text:
                                    ans.deliver(text)
                                    yield TextEvent(text)
                            if decoder.error is not None or decoder.terminal or eof:
                                fail = decoder.end_failure()
                                if not eof:
                                    await _drain(chunks, min(ans.t_end - now(), 1.0))
                                break
                except httpx.TransportError as exc:
                    fail = _transport_failure(exc)
                finally:
                    with anyio.CancelScope(shield=True):
                        if body_iter is not None:
                            await body_iter.aclose()  # type: ignore[attr-defined]
                        await response.aclose()
            ans.add_usage(decoder)
            seconds = now() - started
            if fail is None:
                if dedup is not None and not dedup.resolved:
                    text = dedup.finish(now=now())
                    if text:
                        ans.deliver(text)
                        yield TextEvent(text)
                if dedup is not None:
                    ans.wasted += dedup.stats.dropped
                    ans.deduplicated += len(dedup.stats.dropped)
                ans.history.append(
                    Attempt(attempt, model, "ok", chars=ans.chars - chars_before, seconds=seconds)
                )
                ans.failures[ans.model_index] = 0
                yield await ans.done(decoder.finish_reason or "stop")
                return

            # -- the attempt failed: record it, then retry, resume, switch or give up --------
            if dedup is not None:
                ans.wasted += dedup.stats.dropped + (dedup.abandon() if not dedup.resolved else "")
                ans.deduplicated += len(dedup.stats.dropped)
            progressed = ans.chars > chars_before
            ans.history.append(
                Attempt(
                    attempt,
                    model,
                    fail.kind,
                    fail.message,
                    fail.status_code,
                    chars=ans.chars - chars_before,
                    seconds=seconds,
                )
            )
            if fail.kind == "prefill_rejected":
                _prefill_refused.add((plan.base_url, model))
            idx = ans.model_index
            ans.failures[idx] = 1 if progressed else ans.failures[idx] + 1
            decision = decide(
                fail,
                attempt=attempt,
                max_attempts=plan.max_attempts,
                model_index=idx,
                failures=ans.failures,
                time_left=ans.t_end - now(),
                backoff=plan.backoff,
                rand=plan.rng.random(),
                fallback_after=plan.fallback_after,
            )
            tokens = await ans.tokens() if ans.chars else 0
            log.info(
                _LOG_EVENT[decision.action, bool(ans.chars)],
                model=model,
                attempt=attempt,
                reason=fail.kind,
                status_code=fail.status_code,
                error=fail.message,
                chars=ans.chars,
                action=decision.action,
                delay=round(decision.delay, 3),
            )
            if decision.action == "give_up":
                cls: type[StreamError] = {
                    "rejected": RequestRejected,
                    "attempts": AttemptsExhausted,
                }.get(decision.error, DeadlineExceeded)
                if cls is RequestRejected:
                    message = f"{model} refused the request ({fail.message}); not retried"
                else:
                    message = f"gave up after {attempt} attempts: {decision.why}"
                log.warning("streamres.failed", model=model, reason=fail.kind, attempts=attempt)
                raise ans.error(cls, message, fail)
            if ans.chars:
                ans.resumes += 1
            if decision.action == "switch":
                ans.model_index = decision.model_index
                yield FallbackEvent(
                    message=fallback_message(model, ans.model),
                    attempt=attempt + 1,
                    from_model=model,
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
                    model=model,
                    strategy=ans.strategy(),
                    tokens_so_far=tokens,
                    chars_so_far=ans.chars,
                )
            else:
                yield RetryEvent(
                    message=retry_message(
                        fail, delay=decision.delay, attempt=attempt + 1, cap=plan.max_attempts
                    ),
                    attempt=attempt + 1,
                    delay=decision.delay,
                    reason=fail.kind,
                    model=model,
                    status_code=fail.status_code,
                )
            if decision.delay > 0:
                await anyio.sleep(decision.delay)
    finally:
        if own_client and client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()
