"""The embedded upstream server: real HTTP/1.1 on 127.0.0.1 (h11 over anyio sockets).

It speaks ``POST /v1/chat/completions`` and ``POST /v1/messages`` as streams, as OpenAI and
Anthropic write them, answers each conversation deterministically (``_answers``) and plays a
fault plan (``_faults``) per server, per model or per request (header ``x-upstream-fault``).
Out of process (``streamres serve``), ``POST /_control/faults`` with
``{"faults": "429,reset@40", "model": optional}`` queues faults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.from_thread
import h11

from ._answers import (
    AfterTools,
    InstructBehaviour,
    PrefillBehaviour,
    ToolsOnContinue,
    answer_for,
    plan_reply,
    split_tokens,
)
from ._bodies import (
    SEND_BATCH,
    Pace,
    Reset,
    bomb,
    clean_events,
    next_event,
    play,
    render_clean,
    send_simple,
    start_events,
    stream_body,
)
from ._faults import Fault, FaultPlan
from ._render import AnthropicRender, OpenAIRender, Render, ResponsesRender
from ._requests import check_tool_shapes, input_messages, malformed

__all__ = ["ModelSpec", "RecordedRequest", "Upstream"]

#: What llama.cpp's server says of itself on every response.
_LLAMA = [("server", "llama.cpp")]

_MAX_BODY = 8 * 1024 * 1024


@dataclass
class ModelSpec:
    """How one model of the upstream behaves (anything left ``None`` follows the server)."""

    faults: FaultPlan | None = None
    prefill: PrefillBehaviour | None = None
    instruct: InstructBehaviour | None = None
    #: Streams this model serves at once; more get 429 (seed 2.3's quota).
    max_in_flight: int | None = None
    token_delay: float | None = None


@dataclass
class RecordedRequest:
    """A request the upstream received (for tests: what did the client really send?)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    model: str
    fault: str
    #: Refusal status, or 200.
    status: int = 200
    at: float = 0.0
    #: Tokens streamed before the response ended.
    tokens: int = 0

    def streamed(self, tokens: int) -> None:
        """``tokens`` have been streamed so far."""
        self.tokens = tokens


#: An error answered instead of a stream: status, error type, message, extra headers.
_Refusal = tuple[int, str | None, str | None, list[tuple[str, str]]]


def _render_for(
    provider: Literal["openai", "anthropic", "responses"],
    model: str,
    headers: dict[str, str],
    body: dict[str, Any],
) -> Render:
    """How ``provider`` writes this request's stream."""
    if provider == "openai":
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if headers.get("x-upstream-usage") == "none":  # a server that never reports usage
            usage = False
        return OpenAIRender(model, include_usage=usage)
    if provider == "anthropic":
        return AnthropicRender(model)
    return ResponsesRender(model, background=bool(body.get("background")))


@dataclass
class _Counters:
    in_flight: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    #: Streams begun since the start, and the serial numbers of those being served.
    begun: int = 0
    serving: set[int] = field(default_factory=set)


class Upstream:
    """A deterministic fake LLM server for tests, demos and benchmarks.

    >>> async def main():
    ...     async with Upstream(faults="529:retry-after=0.1,reset@20") as up:
    ...         ...  # point stream_resilient() at up.openai_url or up.anthropic_url
    """

    def __init__(
        self,
        *,
        port: int = 0,
        faults: FaultPlan | str | None = None,
        models: Mapping[str, ModelSpec] | None = None,
        prefill: PrefillBehaviour = "continue",
        instruct: InstructBehaviour = "overlap",
        tools_on_continue: ToolsOnContinue = "repeat",
        after_tools: AfterTools = "answer",
        overlap_words: int = 3,
        words: int = 90,
        token_delay: float = 0.0,
        ping_interval: float = 0.5,
        stall_seconds: float = 300.0,
        max_in_flight: int | None = None,
        quota_retry_after: float | None = None,
        framing: Literal["batched", "event"] = "batched",
        stamp: bool = False,
        replay: bool = False,
    ) -> None:
        self.port = port
        #: Speak as llama.cpp's server: name itself (``server: llama.cpp``) and keep each chat
        #: completion sent with ``X-Conversation-Id`` whole, whatever happens to its connection,
        #: for ``GET /v1/stream?conv_id=<id>&from=<byte>`` (and ``DELETE`` to stop it).
        self.replay = replay
        #: "event": each token its own flushed write even at full speed (as real servers send).
        self.framing = framing
        #: Benchmarks: each text delta is the monotonic time it was written ("%.6f "), so a
        #: client can measure each token's latency (this machine's clock is shared).
        self.stamp = stamp
        self.faults = faults if isinstance(faults, FaultPlan) else FaultPlan(faults or "")
        self.models: dict[str, ModelSpec] = dict(models or {})
        self.prefill: PrefillBehaviour = prefill
        self.instruct: InstructBehaviour = instruct
        #: Tools on an instruct continuation: the last round again, or the model's plan.
        self.tools_on_continue: ToolsOnContinue = tools_on_continue
        #: After a round's results: text only, or (an agent's checks) the first round again.
        self.after_tools: AfterTools = after_tools
        self.overlap_words = overlap_words
        self.words = words
        self.token_delay = token_delay
        self.ping_interval = ping_interval
        self.stall_seconds = stall_seconds
        self.max_in_flight = max_in_flight
        #: Retry-After sent with the 429 of a full quota (``None``: no header).
        self.quota_retry_after = quota_retry_after
        self.requests: list[RecordedRequest] = []
        #: TCP connections open right now, and accepted since the start.
        self.open_connections = 0
        self.connections_accepted = 0
        self._counters = _Counters()
        self._idle: anyio.Event | None = None
        #: Set as a stream ends, for whoever waits on streams (made when first waited on).
        self._stream_ended: anyio.Event | None = None
        self._bodies: dict[tuple[Any, ...], tuple[bytes, int]] = {}
        #: Background responses of /v1/responses, by id: every event, for replays.
        self._stored: dict[str, list[tuple[int, bytes, bool]]] = {}
        #: With ``replay``: each conversation's whole body (llama.cpp's stream sessions).
        self._sessions: dict[str, bytes] = {}
        #: Conversations stopped by ``DELETE /v1/stream`` (tests: was the server told?).
        self.stopped: list[str] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None

    # -- addresses -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """Base URL for ``provider="openai"`` (like ``https://api.openai.com/v1``)."""
        return self.url + "/v1"

    @property
    def anthropic_url(self) -> str:
        """Base URL for ``provider="anthropic"`` (like ``https://api.anthropic.com``)."""
        return self.url

    def answer(self, messages: list[dict[str, Any]], *, words: int | None = None) -> str:
        """The full answer this upstream gives to ``messages`` (OpenAI-style); ``words`` as a
        request's ``x-upstream-words`` header sets it."""
        return answer_for(messages, words=self.words if words is None else words)

    async def wait_idle(self) -> None:
        """Return once no client connection is open (tests: nothing leaked)."""
        while self.open_connections:
            self._idle = anyio.Event()
            await self._idle.wait()

    def in_flight(self, model: str | None = None) -> int:
        """Streams being served now (for one model, or in total with ``None``)."""
        return self._counters.in_flight.get(model or "*", 0)

    def peak_in_flight(self, model: str | None = None) -> int:
        """Most streams served at once (for one model, or in total with ``None``)."""
        return self._counters.peak.get(model or "*", 0)

    def reset_peak(self) -> None:
        """Count :meth:`peak_in_flight` again from now (from what is being served now)."""
        c = self._counters
        c.peak = dict(c.in_flight)

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Upstream:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        self._listener = listener
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(listener.serve, self._handle)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._tg is None or self._listener is None:
            return
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        await self._listener.aclose()

    @classmethod
    @contextlib.contextmanager
    def in_thread(cls, **kwargs: Any) -> Iterator[Upstream]:
        """Run an upstream on its own event loop in a background thread (for sync code)."""
        with anyio.from_thread.start_blocking_portal() as portal:
            upstream = cls(**kwargs)
            with portal.wrap_async_context_manager(upstream):
                yield upstream

    async def serve_forever(self) -> None:
        async with self:
            await anyio.sleep_forever()

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        self.open_connections += 1
        self.connections_accepted += 1
        with contextlib.suppress(OSError, anyio.TypedAttributeLookupError):
            # Each write leaves at once, as a real server's flushed event does.
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                event = await next_event(conn, stream)
                if not isinstance(event, h11.Request):
                    return
                body = b""
                while True:
                    part = await next_event(conn, stream)
                    if isinstance(part, h11.Data):
                        body += part.data
                        if len(body) > _MAX_BODY:
                            return
                    elif isinstance(part, h11.EndOfMessage):
                        break
                    else:
                        return
                try:
                    await self._respond(conn, stream, event, body)
                except Exception as exc:  # a bug on a request: that request fails, not the server
                    if conn.our_state is h11.SEND_RESPONSE:
                        message = json.dumps(
                            {"error": {"message": f"internal error: {type(exc).__name__}"}}
                        )
                        await send_simple(conn, stream, 500, message.encode())
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except Reset:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            anyio.EndOfStream,
            h11.ProtocolError,
            ConnectionError,
        ):
            pass
        finally:
            self.open_connections -= 1
            if not self.open_connections and self._idle is not None:
                self._idle.set()
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _respond(
        self, conn: h11.Connection, stream: anyio.abc.SocketStream, req: h11.Request, raw: bytes
    ) -> None:
        path = req.target.decode("latin-1").split("?")[0]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers}
        if req.method == b"GET" and path in ("/", "/health"):
            await send_simple(conn, stream, 200, b'{"status":"ok"}')
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await send_simple(conn, stream, 400, b'{"error":{"message":"invalid JSON"}}')
            return
        if path == "/_control/faults":
            spec = self.models.setdefault(body["model"], ModelSpec()) if body.get("model") else None
            plan = self.faults if spec is None else (spec.faults or FaultPlan())
            plan.push(str(body.get("faults", "")))
            if spec is not None:
                spec.faults = plan
            await send_simple(conn, stream, 200, b'{"ok":true}')
            return
        provider: Literal["openai", "anthropic", "responses"]
        if path == "/v1/stream" and self.replay:
            query = dict(
                p.partition("=")[::2]
                for p in req.target.decode("latin-1").partition("?")[2].split("&")
            )
            await self._stream_session(conn, stream, req.method, path, headers, query)
            return
        if req.method == b"GET" and "/responses/" in path:
            query = dict(
                p.partition("=")[::2]
                for p in req.target.decode("latin-1").partition("?")[2].split("&")
            )
            await self._replay(conn, stream, path, headers, path.rsplit("/", 1)[1], query)
            return
        if path.endswith(("/messages/count_tokens", "/responses/input_tokens")):
            # The APIs' token counts: the request's words and marks, as this model splits them.
            model = str(body.get("model", ""))
            self.requests.append(RecordedRequest(path, headers, body, model, ""))
            texts = input_messages(body.get("input")) if "input" in body else body.get("messages")
            words = json.dumps([texts, body.get("system"), body.get("tools")], ensure_ascii=False)
            count: dict[str, Any] = {"input_tokens": len(split_tokens(words))}
            if path.endswith("/input_tokens"):
                count = {"object": "response.input_tokens", **count}
            await send_simple(conn, stream, 200, json.dumps(count).encode())
            return
        if path.endswith("/chat/completions"):
            provider = "openai"
        elif path.endswith("/messages"):
            provider = "anthropic"
        elif path.endswith("/responses"):
            provider = "responses"
        else:
            await send_simple(conn, stream, 404, b'{"error":{"message":"not found"}}')
            return
        wrong = malformed(body)
        if wrong is not None:
            message = json.dumps({"error": {"message": wrong, "type": "invalid_request_error"}})
            await send_simple(conn, stream, 400, message.encode())
            return
        await self._chat(conn, stream, provider, path, headers, body)

    async def _chat(
        self,
        conn: h11.Connection,
        stream: anyio.abc.SocketStream,
        provider: Literal["openai", "anthropic", "responses"],
        path: str,
        headers: dict[str, str],
        body: dict[str, Any],
    ) -> None:
        model = str(body.get("model", ""))
        spec = self.models.get(model, ModelSpec())
        override = headers.get("x-upstream-fault")
        plan = FaultPlan(override) if override else (spec.faults or self.faults)
        fault = plan.next()
        record = RecordedRequest(path, headers, body, model, str(fault), at=time.monotonic())
        self.requests.append(record)
        render = _render_for(provider, model, headers, body)
        messages = list(body.get("messages") or [])
        if provider == "responses":
            messages = input_messages(body.get("input"))
            body = {k: v for k, v in body.items() if k != "reasoning"}
        if provider == "anthropic" and body.get("system"):
            messages.insert(0, {"role": "system", "content": body["system"]})
        refusal = self._refusal(provider, model, spec, fault, body, messages)
        if refusal is not None:
            status, error_type, message, extra = refusal
            record.status = status
            error = render.error_body(status, error_type, message)
            await send_simple(conn, stream, status, error, extra)
            return

        reply = plan_reply(
            messages,
            provider="anthropic" if provider == "anthropic" else "openai",
            body=body,
            prefill=spec.prefill or self.prefill,
            instruct=spec.instruct or self.instruct,
            overlap_words=self.overlap_words,
            words=int(headers.get("x-upstream-words", self.words)),
            tools_on_continue=self.tools_on_continue,
            after_tools=self.after_tools,
        )
        if reply.rejection is not None:
            record.status = 400
            error = render.error_body(400, *reply.rejection)
            await send_simple(conn, stream, 400, error)
            return

        max_tokens = body.get(
            "max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens"))
        )
        input_tokens = sum(len(str(m.get("content", ""))) for m in messages) // 4 + 1
        delay = spec.token_delay if spec.token_delay is not None else self.token_delay
        if "x-upstream-delay" in headers:  # seconds between tokens, each its own write
            delay = float(headers["x-upstream-delay"])
        #: "event": each token its own write, at once (as a server relaying a fast model).
        each = headers.get("x-upstream-framing", self.framing) == "event"
        serial = self._enter(model)
        try:
            if fault.kind == "bomb":
                await start_events(conn, stream, [("content-encoding", "gzip")])
                await stream.send(conn.send(h11.Data(data=bomb())))
                await stream.send(conn.send(h11.EndOfMessage()))
                return
            conversation = headers.get("x-conversation-id")
            if self.replay and conversation and provider == "openai" and fault.kind != "empty":
                # llama.cpp: the generation runs to its end into the session, whatever
                # happens to this connection.
                events, record.tokens = clean_events(render, reply, max_tokens, input_tokens)
                self._sessions[conversation] = b"".join(data for _, data, _ in events)
                await start_events(conn, stream, _LLAMA)
                pace = dataclasses.replace(self._pace(), pings=False)
                await play(conn, stream, events, fault, delay, render, pace)
                return
            await start_events(conn, stream, _LLAMA if self.replay else None)
            if fault.kind == "empty":
                await stream.send(conn.send(h11.EndOfMessage()))
                return
            if isinstance(render, ResponsesRender) and render.background:
                # A background response is generated whole, whatever happens to this stream,
                # and kept for re-attaching.
                _, record.tokens = render_clean(render, reply, max_tokens, input_tokens)
                self._stored[render.id] = list(render.log)
                await play(conn, stream, render.log, fault, delay, render, self._pace())
                return
            if fault.kind == "ok" and delay <= 0 and not each and not self.stamp:
                # Fault-free and as fast as possible (benchmarks): render once, then only send.
                key = (provider, model, render.include_usage, reply, max_tokens)
                cached = self._bodies.get(key)
                if cached is None:
                    cached = self._bodies[key] = render_clean(
                        render, reply, max_tokens, input_tokens
                    )
                    while len(self._bodies) > 8:
                        self._bodies.pop(next(iter(self._bodies)))
                payload, record.tokens = cached
                for at in range(0, len(payload), SEND_BATCH):
                    chunk = payload[at : at + SEND_BATCH]
                    await stream.send(conn.send(h11.Data(data=chunk)))
                await stream.send(conn.send(h11.EndOfMessage()))
                return
            await stream_body(
                conn,
                stream,
                render,
                reply,
                fault,
                max_tokens,
                input_tokens,
                delay,
                self._pace(),
                record.streamed,
                each,
            )
        finally:
            self._leave(model, serial)

    def _refusal(
        self,
        provider: str,
        model: str,
        spec: ModelSpec,
        fault: Fault,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
    ) -> _Refusal | None:
        """Why this request is answered with an error instead of a stream, if it is: a bad
        request, the model's concurrency quota, or a status fault."""
        if not messages or (provider == "anthropic" and "max_tokens" not in body):
            return 400, None, "messages and (for /v1/messages) max_tokens are required", []
        shape = check_tool_shapes(provider, body)
        if shape is not None:
            return 400, "invalid_request_error", shape, []
        limit = spec.max_in_flight if spec.max_in_flight is not None else self.max_in_flight
        if limit is not None and self._counters.in_flight.get(model, 0) >= limit:
            hint = self.quota_retry_after
            hints = [("retry-after", f"{hint:g}")] if hint is not None else []
            return 429, "rate_limit_error", "Too many concurrent requests for this model", hints
        if fault.kind not in ("status", "at-capacity"):
            return None
        extra: list[tuple[str, str]] = []
        if fault.retry_after_ms is not None:
            extra.append(("retry-after-ms", f"{fault.retry_after_ms:g}"))
        if fault.retry_after is not None:
            extra.append(("retry-after", f"{fault.retry_after:g}"))
        if fault.retry_after_date is not None:
            date = email.utils.formatdate(time.time() + fault.retry_after_date, usegmt=True)
            extra.append(("retry-after", date))
        if fault.kind == "at-capacity":
            message = "Selected model is at capacity. Please try a different model."
            return 503, "server_is_overloaded", message, extra
        return fault.status, fault.error_type, fault.message, extra

    async def _replay(
        self,
        conn: h11.Connection,
        stream: anyio.abc.SocketStream,
        path: str,
        headers: dict[str, str],
        response_id: str,
        query: dict[str, str],
    ) -> None:
        """``GET /v1/responses/{id}?stream=true&starting_after=N``: the events after N."""
        override = headers.get("x-upstream-fault")
        fault = (FaultPlan(override) if override else self.faults).next()
        record = RecordedRequest(path, headers, dict(query), "", str(fault), at=time.monotonic())
        self.requests.append(record)
        render = ResponsesRender("")
        events = self._stored.get(response_id)
        status = fault.status if fault.kind == "status" else 200
        if events is None or status != 200:
            record.status = status if events is not None else 404
            message = None if events is not None else f"Response with id '{response_id}' not found."
            await send_simple(
                conn, stream, record.status, render.error_body(record.status, None, message)
            )
            return
        after = int(query.get("starting_after", "-1") or -1)
        await start_events(conn, stream)
        later = [e for e in events if e[0] > after]
        await play(conn, stream, later, fault, 0.0, render, self._pace())

    async def _stream_session(
        self,
        conn: h11.Connection,
        stream: anyio.abc.SocketStream,
        method: bytes,
        path: str,
        headers: dict[str, str],
        query: dict[str, str],
    ) -> None:
        """llama.cpp's ``GET /v1/stream?conv_id=<id>&from=<byte>`` (the body from that byte)
        and ``DELETE /v1/stream?conv_id=<id>`` (stop it: 204, known or not)."""
        conversation = query.get("conv_id", "")
        record = RecordedRequest(path, headers, dict(query), "", "ok", at=time.monotonic())
        self.requests.append(record)
        if method == b"DELETE":
            self.stopped.append(conversation)
            self._sessions.pop(conversation, None)
            record.status = 204
            await stream.send(
                conn.send(h11.Response(status_code=204, headers=[("server", "llama.cpp")]))
                + conn.send(h11.EndOfMessage())
            )
            return
        override = headers.get("x-upstream-fault")
        fault = (FaultPlan(override) if override else self.faults).next()
        record.fault = str(fault)
        body = self._sessions.get(conversation)
        if body is None or fault.kind == "status":
            record.status = fault.status if fault.kind == "status" else 404
            message = "Stream not found or expired" if body is None else "Service unavailable"
            error = json.dumps({"error": {"code": record.status, "message": message}}).encode()
            await send_simple(conn, stream, record.status, error, list(_LLAMA))
            return
        start = int(query.get("from", "0") or 0)
        await start_events(conn, stream, _LLAMA)
        await stream.send(conn.send(h11.Data(data=body[start:])) + conn.send(h11.EndOfMessage()))

    def _pace(self) -> Pace:
        return Pace(self.stall_seconds, self.ping_interval, self.stamp)

    def _enter(self, model: str) -> int:
        c = self._counters
        for key in (model, "*"):
            c.in_flight[key] = c.in_flight.get(key, 0) + 1
            c.peak[key] = max(c.peak.get(key, 0), c.in_flight[key])
        c.begun += 1
        c.serving.add(c.begun)
        return c.begun

    def _leave(self, model: str, serial: int) -> None:
        for key in (model, "*"):
            self._counters.in_flight[key] -= 1
        self._counters.serving.discard(serial)
        if self._stream_ended is not None:
            self._stream_ended.set()
            self._stream_ended = None

    async def _a_stream_ended(self) -> None:
        self._stream_ended = self._stream_ended or anyio.Event()
        await self._stream_ended.wait()

    async def wait_streams_begun_done(self) -> None:
        """Return once every stream being served now has ended; those begun meanwhile are not
        waited for (tests: what was let through before a change has run its course)."""
        now = set(self._counters.serving)
        while now & self._counters.serving:
            await self._a_stream_ended()

    async def wait_streams_done(self) -> None:
        """Return once no answer is being streamed (tests: a client's close reached here)."""
        while self.in_flight():
            await self._a_stream_ended()
