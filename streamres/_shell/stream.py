"""The I/O shell: ``stream_resilient()``.

This module performs what the answer's state machine (``_answer.machine.Answer``) asks, and decides
nothing: it opens HTTP streams, reads their bytes, sleeps, waits for concurrency slots
(``_limits``), loads token encodings off the event loop, and hands the machine each outcome as
a fact with the time. See ``_answer.states`` for the theory of operation.

The deadline and the stall timer bound every wait: the header wait with one cancel scope per
attempt, each read with the stream's :class:`~streamres._shell.timer.ReadTimer` (one timer whose
deadline moves, never a cancel scope across a ``yield`` of this async generator).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import socket
import ssl
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, assert_never

import anyio
import httpx

from streamres._answer.actions import Action, Read
from streamres._answer.machine import (
    ERROR_BODY_LIMIT,
    READ,
    Acquire,
    Answer,
    Count,
    Fail,
    Finish,
    Load,
    Memory,
    ReadBody,
    Reserve,
    Send,
    Wait,
)
from streamres._answer.options import Options, check_options, single_call_routes
from streamres._core.backoff import Backoff
from streamres._core.bounds import ReadLimits
from streamres._core.classify import Failure, failure
from streamres._core.errors import InvalidRequest, StreamError
from streamres._core.events import Event
from streamres._core.inflate import ACCEPT_ENCODING
from streamres._core.pace import Outcome
from streamres._core.policy import connect_allowance
from streamres._core.redact import redact_url
from streamres._core.stall import FIRST_OUTPUT, HEADERS, QUICK_FIRST
from streamres._core.tokens import Counter, counter_for
from streamres._core.trickle import PaceFloor
from streamres._fleet.fleet import Fleet
from streamres._providers.wire import HttpRequest
from streamres._shell.connects import Connects, Turn
from streamres._shell.limits import Limits
from streamres._shell.log import log, mask_http_logs
from streamres._shell.shared import SharedState
from streamres._shell.timer import TIMEOUT, ReadTimer, clock
from streamres._shell.tracing import AnswerTrace, Tracing, traced

__all__ = ["ResilientStream", "stream_resilient"]


Provider = Literal["openai", "anthropic", "openai-responses"]

#: Longest wait for another process's probe before asking again (its outcome usually wakes
#: this one first).
PROBE_RECHECK = 5.0
#: Seconds a server is given to take a stop of a generation nobody will read.
STOP_WAIT = 2.0
#: What this process remembers about servers (prefill refused; answered before).
_MEMORY = Memory()

#: The pool a ``Client`` streams through: no cap on connections (a stream holds its connection
#: for the whole answer, so a cap is a queue, and httpx's default of 100 made 2,000 streams
#: wait in httpcore's pool — whose cost grows with the square of the waiters — until their
#: connects timed out); the concurrency limits that matter are the routes' and accounts'.
STREAMING_POOL = httpx.Limits(max_connections=None, max_keepalive_connections=256)

#: Connection pools a ``Client`` spreads its streams over. httpcore's pool does work in the
#: number of its connections for every request it takes or gives back (and more for each idle
#: one), so one pool for thousands of concurrent streams costs the square of them: 300 streams
#: spent half their CPU there, and a proxy at 5,000 streams on one pool spent 58 % of its CPU
#: in it. A stream takes the pool with the fewest streams in it (the first of those): one
#: stream at a time always finds the first pool and its kept-alive connection, and thousands
#: are spread evenly — 5,000 over 64 pools are 78 connections each.
POOLS = 64


class Pools:
    """A ``Client``'s connection pools and how many streams each carries now."""

    def __init__(
        self,
        clients: list[httpx.AsyncClient],
        transports: list[httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        self.clients = clients
        #: Each pool's transport, which its requests go to directly (:func:`_open`); ``None``:
        #: they go through the client.
        self.transports = transports
        self.streams = [0] * len(clients)

    @classmethod
    def made(cls, verify: ssl.SSLContext, count: int = POOLS) -> Pools:
        """``count`` pools of :data:`STREAMING_POOL`. Their requests go to the transport itself,
        unless the environment names a proxy (``HTTPS_PROXY``, …), which the client mounts
        and picks per URL."""
        if urllib.request.getproxies():
            clients = [
                httpx.AsyncClient(verify=verify, timeout=None, limits=STREAMING_POOL)
                for _ in range(count)
            ]
            return cls(clients)
        transports: list[httpx.AsyncBaseTransport] = [
            httpx.AsyncHTTPTransport(verify=verify, limits=STREAMING_POOL) for _ in range(count)
        ]
        return cls([httpx.AsyncClient(transport=t, timeout=None) for t in transports], transports)

    def take(self) -> int:
        """The pool for a new stream (its index): the least busy, the first of those."""
        streams = self.streams
        i = streams.index(min(streams))
        streams[i] += 1
        return i

    def give(self, i: int) -> None:
        self.streams[i] -= 1


# Extra request headers whose values are credentials (masked like the API key).
_SECRET_HEADER = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|signature")

_ssl_context: ssl.SSLContext | None = None


async def _shared_ssl_context() -> ssl.SSLContext:
    """One SSL context per process: building one costs ~40 ms (loading the CA bundle)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = await anyio.to_thread.run_sync(ssl.create_default_context)
    return _ssl_context


#: Token encodings loaded in this process, by model (loaded on first need, off the loop).
_counters: dict[str, tuple[str, Counter]] = {}


def _load_counter_now(model: str) -> tuple[str, Counter]:
    """For counts made when first read (``Usage``): loads where it is called, once."""
    got = _counters.get(model)
    if got is None:
        got = _counters[model] = counter_for(model)
    return got


async def load_counter(model: str) -> tuple[str, Counter]:
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
    header_timeout: float = HEADERS,
    quick_first_token_timeout: float = QUICK_FIRST,
    max_tokens: int | None = None,
    client: httpx.AsyncClient | None = None,
    continuation: Literal["auto", "prefill", "prefix", "partial", "instruct"] = "auto",
    continue_instruction: str | None = None,
    replay: bool = True,
    pace_floor: PaceFloor | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    fallback_after: int = 2,
    headers: Mapping[str, str] | None = None,
    rng: random.Random | None = None,
    read_limits: ReadLimits | None = None,
    tracing: Any = None,
    capture_content: bool = False,
    metrics: Any = None,
    continue_from: str = "",
    **more: Any,
) -> ResilientStream:
    """Stream one answer, surviving capacity errors, drops, stalls and truncations.

    Returns an async iterator of events (see :mod:`streamres` for the event types) that is
    also an async context manager: ``async with`` closes the HTTP response at once if the
    caller stops early. Extra keyword arguments (``temperature=``…) go into the request body.
    ``model`` may be a sequence of names: a fallback chain on the same server. For many
    models, endpoints and shared limits, use :class:`streamres.Client`. ``continue_from``:
    text of this answer the caller already has (an answer log's, after its process or
    connection went): the model is asked for the rest, joined and de-duplicated as any resume;
    the events carry only what is new, and the done event's text is the whole answer.
    ``pace_floor``: move on from a stream that still produces but far below its model's pace
    (opt-in, with a fallback model; see :class:`PaceFloor`). ``replay=False``: never re-attach
    to a stream the server kept generating (llama.cpp's server); each request carries no
    ``X-Conversation-Id``, and a break is continued.

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
    routes = single_call_routes(model, provider, base_url, api_key, continuation, replay)
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise InvalidRequest(
            f"client must be an httpx.AsyncClient (or None), not {client!r:.60}", reason="invalid"
        )
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
        quick_first_token_timeout=quick_first_token_timeout,
        continue_instruction=continue_instruction,
        pace_floor=pace_floor,
        header_timeout=header_timeout,
        max_tokens=max_tokens,
        max_attempts=max_attempts,
        backoff=backoff,
        fallback_after=fallback_after,
        headers=headers,
        more=more,
        rng=rng,
        read_limits=read_limits,
        continue_from=continue_from,
    )
    tracer = Tracing(tracing, capture_content=capture_content, metrics=metrics)
    if not tracer.enabled:
        return ResilientStream(_run(opts, client, None))
    trace = tracer.answer(opts.messages, routes[0], more, max_tokens)
    opts = dataclasses.replace(opts, headers={**opts.headers, **trace.headers()})
    return ResilientStream(traced(_run(opts, client, None), trace), trace)


class ResilientStream:
    """The events of one answer: an async iterator and an async context manager."""

    __slots__ = ("_gen", "_trace")

    def __init__(self, gen: AsyncIterator[Event], trace: AnswerTrace | None = None) -> None:
        self._gen = gen
        self._trace = trace

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """An attribute of the caller's on the answer's span, when the answer is traced (until
        its done event has been read: the span ends with the answer) — as the proxy adds the
        time it spent on the answer."""
        if self._trace is not None:
            self._trace.span.set_attribute(key, value)

    def __aiter__(self) -> ResilientStream:
        return self

    def __anext__(self) -> Awaitable[Event]:
        return self._gen.__anext__()  # no coroutine frame of its own on the per-token path

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
            "connection",
            f"Cannot reach {redact_url(url)} — {_connect_cause(exc)}",
            connect=True,
            error_type="connect_timeout" if isinstance(exc, httpx.ConnectTimeout) else None,
        )
    return failure("connection", f"connection lost mid-response ({str(exc) or type(exc).__name__})")


#: Upstream URLs parsed (httpx parses a URL in Python: a third of building a request), by
#: their text; a client's routes make a handful.
_URLS: dict[str, httpx.URL] = {}


def _url(text: str) -> httpx.URL:
    url = _URLS.get(text)
    if url is None:
        if len(_URLS) >= 256:
            _URLS.clear()
        url = _URLS[text] = httpx.URL(text)
    return url


def _http_request(client: httpx.AsyncClient, req: HttpRequest, connect: float) -> httpx.Request:
    """``req`` as an httpx request: the client's default headers under the request's own
    (names matched in any case), the body as JSON, no timeout but ``connect``. Built here
    rather than by ``client.build_request``, which merges a base URL, query parameters and the
    client's cookie jar that a ``Client``'s requests never have (a fifth of the proxy's work
    before the request went out), and would send the cookies one upstream response set with
    every later request, whichever caller made it."""
    own = {name.lower() for name in req.headers}
    headers = [(k, v) for k, v in client.headers.items() if k not in own]
    if "accept-encoding" not in own:
        headers = [(k, v) for k, v in headers if k != "accept-encoding"]
        headers.append(("accept-encoding", ACCEPT_ENCODING))
    headers.extend(req.headers.items())
    content = None
    if req.method == "POST":
        # As httpx writes a ``json=`` body.
        content = json.dumps(
            req.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode("utf-8")
        if "content-type" not in own:
            headers.append(("content-type", "application/json"))
    timeout = httpx.Timeout(None, connect=connect).as_dict()
    return httpx.Request(
        req.method, _url(req.url), headers=headers, content=content, extensions={"timeout": timeout}
    )


#: httpcore trace events that mark the end of the wait for a pooled connection.
_SERVED = ("connect_tcp.started", "send_request_headers.started")


def _server(url: httpx.URL) -> str:
    """The server a connection goes to (its connect pace's key)."""
    return f"{url.scheme}://{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


async def _open(transport: httpx.AsyncBaseTransport, request: httpx.Request) -> httpx.Response:
    """``request`` sent by its transport, as ``AsyncClient.send`` sends it without following
    redirects, less the client's layers that a ``Client``'s requests never use: auth, event
    hooks and the cookie jar (whose keeping of what a response set was a tenth of the library's
    work per answer, for cookies nobody sends)."""
    response = await transport.handle_async_request(request)
    response.request = request
    return response


async def _send(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    t_end: float,
    stall: float,
    connects: Connects | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[httpx.Response | None, Failure | None, float]:
    """Send ``request`` and wait for the response headers: (response, failure, queued seconds).

    Four waits, four bounds. Queued for a pooled connection (other streams hold them all), or
    for room in the server's connect window (``connects``: the pace it accepts new ones at):
    only the deadline, since that says nothing about the model. Connecting: httpx's connect
    timeout. Request sent, waiting for headers: the stall timer. httpcore's trace hook says
    when each phase begins; redirects are never followed (a key must not go to another origin).
    """
    started = anyio.current_time()
    served: list[float] = []
    response: httpx.Response | None = None
    turn: list[Turn] = []  # the connect's room in its server's window, while it connects
    server = _server(request.url) if connects is not None else ""

    def connected(outcome: Outcome) -> None:
        if connects is not None and turn:
            connects.end(server, turn.pop(), outcome)

    with anyio.CancelScope(deadline=t_end) as scope:

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            if connects is not None and name.endswith("connect_tcp.started"):
                turn.append(await connects.start(server))
            elif name.endswith("connect_tcp.complete"):
                connected("connected")
            elif name.endswith("connect_tcp.failed"):
                cancelled = isinstance(info.get("exception"), anyio.get_cancelled_exc_class())
                connected("unknown" if cancelled else "failed")  # refused or timed out
            if not served and name.endswith(_SERVED):
                served.append(anyio.current_time())
            if name.endswith("send_request_headers.started"):
                scope.deadline = min(t_end, anyio.current_time() + stall)

        request.extensions["trace"] = trace
        try:
            if transport is not None:
                response = await _open(transport, request)
            else:
                response = await client.send(request, stream=True, follow_redirects=False)
        except httpx.TransportError as exc:
            failed = _transport_failure(exc, str(request.url))
            return None, failed, (served[0] if served else started) - started
        except httpx.HTTPError as exc:
            why = str(exc) or type(exc).__name__
            return None, failure("connection", f"the request failed ({why})"), 0.0
        finally:
            connected("unknown")  # a connect still in progress (cancelled): its room back
    t = anyio.current_time()
    queued = (served[0] if served else t) - started
    if response is not None:
        return response, None, queued
    if t >= t_end:
        return None, failure("deadline", "no response headers before the deadline"), queued
    silent = failure("stall", f"no response headers within {stall:g} s of sending the request")
    return None, dataclasses.replace(silent, error_type="no_headers"), queued


async def _read_body(raw: AsyncIterator[bytes], seconds: float) -> bytes:
    """The start of a body that is not an event stream (an error, a page), bounded in size
    and time: enough to classify it."""
    body = b""
    with anyio.move_on_after(seconds):
        try:
            async for part in raw:
                body += part
                if len(body) > ERROR_BODY_LIMIT:
                    break
        except httpx.HTTPError:
            pass
    return body


async def _drain(chunks: AsyncIterator[bytes], seconds: float) -> None:
    """Read what follows the terminal event (usually just the end of the chunked body), so
    the connection can go back to the pool instead of being torn down."""
    with anyio.move_on_after(seconds):
        try:
            async for _ in chunks:
                pass
        except httpx.HTTPError:
            pass


class _Shell:
    """Performs one answer's actions; owns its HTTP client (if it made one) and response."""

    def __init__(
        self,
        answer: Answer,
        client: httpx.AsyncClient | None,
        limits: Limits | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.answer = answer
        self.client = client
        #: The client's transport, when requests go to it directly (:meth:`Pools.made`).
        self.transport = transport
        self.own_client = client is None
        self.limits = limits
        self.now = clock()
        self.timer = ReadTimer()
        self.response: httpx.Response | None = None
        self.body: AsyncIterator[bytes] | None = None
        self.url = ""

    async def perform(
        self, act: Wait | Acquire | Load | Count | Reserve | Send | ReadBody
    ) -> Action:
        """Do one action that is neither ``READ`` nor an ending; return the machine's next."""
        answer, now = self.answer, self.now
        match act:
            case Wait(until=until, probing=probing):
                if probing and self.limits is not None:
                    # Another stream's probe is deciding: its outcome wakes this one.
                    await self.limits.changed(max(0.0, until - now()))
                else:
                    await anyio.sleep(max(0.0, until - now()))
                return answer.woke(now())
            case Acquire(route=route, until=until, priority=priority):
                assert self.limits is not None
                asked = now()
                ok = await self.limits.acquire(route, max(0.0, until - asked), priority)
                return answer.acquired(ok, now(), queued=now() - asked)
            case Load(model=model):
                name, count = await load_counter(model)
                return answer.loaded(name, count, now())
            case Count(ledger=ledger):
                await anyio.to_thread.run_sync(ledger.settle)
                return answer.counted(now())
            case Reserve():
                assert isinstance(self.limits, SharedState)
                return answer.reserved(await self.limits.reserve_retry(), now())
            case Send():
                return await self.send(act)
            case ReadBody(until=until):
                assert self.body is not None
                body = await _read_body(self.body, max(0.0, until - now()))
                await self.close()
                return answer.body(body, now(), wall=time.time())
            case _:
                assert_never(act)

    def late(self) -> float:
        """How late this process's event loop has been running (0 without a ``Client``)."""
        lag = self.limits.lag if self.limits is not None else None
        return lag.late(anyio.current_time()) if lag is not None else 0.0

    async def send(self, act: Send) -> Action:
        answer, now = self.answer, self.now
        req = act.request
        if act.probe_route is not None and isinstance(self.limits, SharedState):
            wait = await self.limits.claim_probe(act.probe_route)
            if wait is not None:  # another process is probing this model
                return answer.probe_taken(now(), until=now() + min(wait, PROBE_RECHECK))
        if self.client is None:
            self.client = httpx.AsyncClient(
                verify=await _shared_ssl_context(), timeout=None, limits=STREAMING_POOL
            )
        try:
            # The connect timer gets what the loop's own lateness may cost it (policy rule 9).
            allowance = connect_allowance(self.late())
            request = _http_request(self.client, req, act.connect_timeout + allowance)
        except (httpx.InvalidURL, httpx.HTTPError, TypeError, ValueError) as exc:
            why = f"cannot build the request to {redact_url(req.url)}: {exc}"
            raise answer.unbuildable(why) from exc
        connects = self.limits.connects if self.limits is not None else None
        response, fail, queued = await _send(
            self.client,
            request,
            t_end=act.until,
            stall=act.stall,
            connects=connects,
            transport=self.transport,
        )
        if response is None:
            assert fail is not None
            return answer.send_failed(fail, now(), queued=queued, late=self.late())
        self.response, self.url = response, req.url
        # The raw stream itself, not ``aiter_raw()``: one async generator fewer per read (it
        # only counts bytes and splits nothing when no chunk size is asked for).
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        self.body = stream.__aiter__()
        return answer.started(response.status_code, response.headers, now(), queued=queued)

    async def read(self) -> Action:
        """One read of the event stream (the per-token path)."""
        answer = self.answer
        assert self.body is not None
        try:
            chunk = await self.timer.read(self.body, answer.read_deadline)
        except httpx.HTTPError as exc:
            return answer.read_failed(_transport_failure(exc, self.url), self.now())
        if chunk is None:
            return answer.eof(self.now())
        if chunk is TIMEOUT:
            return answer.timed_out(self.now(), late=self.late())
        return answer.data(chunk, self.now())  # type: ignore[arg-type]

    async def drain(self, act: Finish) -> None:
        if act.drain and self.body is not None:
            await _drain(self.body, max(0.0, act.until - self.now()))

    async def close(self) -> None:
        """Close the attempt's response (shielded: it must happen even when cancelled)."""
        body, response = self.body, self.response
        self.body = self.response = None
        if body is None and response is None:
            return
        with anyio.CancelScope(shield=True):
            if body is not None:
                await body.aclose()  # type: ignore[attr-defined]
            if response is not None:
                await response.aclose()

    async def stop(self, requests: list[HttpRequest]) -> None:
        """Stop generations nobody will read (llama.cpp's ``DELETE /v1/stream``): shielded,
        each bounded to ``STOP_WAIT`` seconds, its answer unread — a server that does not
        answer keeps the generation, which ends by itself."""
        if not requests or self.client is None:
            return
        with anyio.CancelScope(shield=True):
            for req in requests:
                with anyio.move_on_after(STOP_WAIT):
                    try:
                        await self.client.request(req.method, req.url, headers=req.headers)
                    except httpx.HTTPError as exc:
                        log.debug(
                            "streamres.stop_failed",
                            url=redact_url(req.url),
                            error=type(exc).__name__,
                        )

    async def shut(self) -> None:
        self.timer.close()
        await self.close()
        if self.own_client and self.client is not None:
            with anyio.CancelScope(shield=True):
                await self.client.aclose()


async def _run(
    opts: Options, http: httpx.AsyncClient | Pools | None, limits: Limits | None
) -> AsyncIterator[Event]:
    """Drive one answer's machine: yield its events, perform its actions (through ``http``,
    or the least busy of its pools)."""
    now = clock()
    answer = Answer(
        opts,
        now=now(),
        slots=limits,
        memory=_MEMORY,
        encodings=_counters.get,
        load_now=_load_counter_now,
        secret_headers=lambda name: bool(_SECRET_HEADER.search(name)),
        shared_budget=isinstance(limits, SharedState),
        log=log,
        answer_id=uuid.uuid4().hex,
    )
    mask_http_logs(answer.secrets)
    pools: Pools | None = None
    pool, client, transport = 0, None, None
    if isinstance(http, Pools):
        pools, pool = http, http.take()
        client = http.clients[pool]
        transport = http.transports[pool] if http.transports is not None else None
    else:
        client = http
    shell = _Shell(answer, client, limits, transport)
    fleet = opts.fleet
    shared = limits if isinstance(limits, SharedState) else None
    try:
        act = answer.start_answer(shell.now())
        while True:
            # What other processes should learn, sent before the events go out: news come
            # from a step that ends an attempt or takes a retry ticket, whose next action is
            # never READ (the per-token path does not look).
            if shared is not None and act is not READ and fleet.news:
                shared.tell(fleet.take_news())
            if answer.events:
                events, answer.events = answer.events, []
                for ev in events:
                    yield ev
            if act is READ:  # the per-token path: one identity check
                act = await shell.read()
                continue
            match act:
                case Finish():
                    await shell.drain(act)  # after the done event is out: the connection is reused
                    return
                case Fail(error=error):
                    raise error
                case Read():
                    act = await shell.read()
                case _:
                    if shell.response is not None and not isinstance(act, ReadBody):
                        await shell.close()  # the attempt is over
                    await shell.stop(answer.take_stops())
                    act = await shell.perform(act)
    except (StreamError, GeneratorExit):
        raise
    except Exception as exc:
        raise answer.crashed(exc) from exc
    finally:
        answer.abandon()
        if shared is not None and fleet.news:
            shared.tell(fleet.take_news())
        try:
            await shell.close()
            await shell.stop(answer.take_stops())
            await shell.shut()
        finally:
            if pools is not None:
                pools.give(pool)
