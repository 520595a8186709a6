"""The proxy as a plain ASGI application over one ``streamres.Client``.

Endpoints, each in its API's own wire format, streaming and not:

    POST /v1/chat/completions   OpenAI Chat Completions
    POST /v1/messages           Anthropic Messages
    POST /v1/responses          OpenAI Responses
    GET  /v1/answers/{id}/events   an answer's events again: after ``Last-Event-ID`` (or
                                ``?after=N``; none: from the start), then live ones
    GET  /v1/answers/{id}       where an answer stands (JSON)
    POST /v1/answers/{id}/stop  stop an answer on purpose (its partial ends it)
    GET  /v1/responses/{id}     a Responses API answer (``?stream=true&starting_after=N``)
    POST /v1/responses/{id}/cancel   the Responses API's cancel
    DELETE /v1/responses/{id}   delete a stored response
    GET  /v1/responses/{id}/input_items   a stored response's input items
    GET  /v1/models             the model names a client may ask for
    GET  /metrics               Prometheus
    GET  /health                JSON: every model's health and why
    GET  /health/stream         the same, as server-sent events once a second
    GET  /                      the health board (a page that follows /health/stream)
    GET  /chat                  a chat page that picks its answer up after a reload or a drop

A streamed answer's response head is sent with its first content, so an answer that fails
before any text can still be answered with a real status (503 and Retry-After for capacity,
504 for the deadline) in the client's error format. After that, a failure is an in-band error
event, after the partial answer.

A streamed answer outlives its connection (``held``): its events carry ids, the response names
it (``x-streamres-answer``, and the id each API's body carries), and a client that comes back
reads it on from where it was. A client that goes leaves its answer running for ``[answers]
hold`` seconds; then the upstream is closed and the partial kept, to be continued if the client
comes back within ``keep``. Answers that are not streamed (and not ``background``) are produced
inside their request, as before: a client that goes closes the upstream at once. Responses API
answers are stored when they end, to be continued (``previous_response_id``), read and deleted
(:mod:`streamres.proxy.answers.conversations`, :mod:`streamres.proxy.answers.stored`).
"""

from __future__ import annotations

import collections
import inspect
import json
import time
from typing import Any

import anyio

import streamres
from streamres._shell.apps import (
    BACKGROUND,
    KNOWN_ARGUMENTS,
    NORMAL,
    log,
    otel_installed,
    parse_priority,
)
from streamres.proxy.answers.answer import Full, Held, added_ms, within
from streamres.proxy.answers.conversations import Conversations
from streamres.proxy.answers.held import Answers
from streamres.proxy.answers.stored import ResponseStore
from streamres.proxy.config import Config
from streamres.proxy.faces.fates import HOSTED, left_out
from streamres.proxy.faces.inbound import API, BadRequest, Call, parse
from streamres.proxy.faces.outbound import PREFIXES, Writer, without_urls
from streamres.proxy.faces.refusal import Refused
from streamres.proxy.server import asgi, counting
from streamres.proxy.server.admission import Admission, ClientState, Slot, not_private
from streamres.proxy.server.asgi import Receive, Scope, Send
from streamres.proxy.server.board import BOARD_HTML
from streamres.proxy.server.chat_page import CHAT_HTML
from streamres.proxy.server.pages import Pages

__all__ = ["Proxy"]


_APIS: dict[str, API] = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
}

#: Token counts of a request before it is sent, in the two APIs that have them.
_COUNTS: dict[str, API] = {
    "/v1/messages/count_tokens": "anthropic",
    "/v1/responses/input_tokens": "responses",
}

#: ``Client.stream``'s own arguments: a request body's fields go to it as extra body fields, so
#: a field by one of these names would set the argument instead (a longer deadline, headers to
#: the upstream, another client key's cache): refused.
_OWN_ARGUMENTS = frozenset(
    name
    for name, p in inspect.signature(streamres.Client.stream).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
) | frozenset(KNOWN_ARGUMENTS)

#: The pages for operators: behind the operator key once client keys are configured.
_OPERATOR_PAGES = frozenset({"/", "/health", "/health/stream", "/metrics"})

#: Requests the proxy remembers (``Proxy.requests``): a long-running proxy's history is bounded.
REQUESTS_KEPT = 10_000


def _caller_trace(headers: dict[str, str]) -> Any:
    """The caller's trace context (W3C ``traceparent``), when it sent one and OpenTelemetry is
    installed; else ``None``."""
    if "traceparent" not in headers or not otel_installed():
        return None
    from opentelemetry import propagate

    return propagate.extract(headers)


def _priority(headers: dict[str, str], state: ClientState | None) -> int:
    """The request's lane: its client key's, or lower if ``x-streamres-priority`` asks (a
    header never lifts a request above its key's lane) — and, within the lane, behind the
    requests of keys with fewer answers in flight (one a step, at most nine: never into the
    next lane down), so a key that holds a route's slots does not take the next one while
    another key waits."""
    ceiling = state.key.priority if state is not None else NORMAL
    asked = headers.get("x-streamres-priority")
    wanted = ceiling
    if asked is not None:
        try:
            wanted = parse_priority(asked)
        except ValueError as exc:
            raise Refused(400, f"x-streamres-priority: {exc}") from None
        wanted = wanted if state is None else min(wanted, ceiling)
    if state is None:
        return wanted
    return max(-100, wanted - min(max(0, state.in_flight - 1), 9))


class Proxy:
    """ASGI app: ``Proxy(client, config)`` (the client entered by whoever runs the server)."""

    def __init__(self, client: streamres.Client, config: Config) -> None:
        self.client = client
        self.config = config
        #: Client keys and their limits (none: a private proxy).
        self.admission = Admission(client, config)
        self.clients = self.admission.clients
        #: [path, model, status] of the last ``REQUESTS_KEPT`` answer requests, in the order
        #: they came (the status is 0 until it is sent).
        self.requests: collections.deque[list[Any]] = collections.deque(maxlen=REQUESTS_KEPT)
        #: The operator's pages (models, health, metrics).
        self.pages = Pages(client, config, lambda: (len(self.answers), self.answers.held_bytes))
        #: Requests being served now (``[server] connections`` bounds them).
        self.serving = 0
        #: Streamed answers, held for readers that go and come back (``held``).
        self.answers = Answers(client, config.answers)
        #: Stored Responses API responses (``previous_response_id``, ``GET``, ``DELETE``).
        store = ResponseStore(config.responses, lambda: client._shared_state)
        self.conversations = Conversations(store, self.answers)
        self.answers.on_end = self.conversations.ended
        self.answers.on_answered = self.answered
        self.answers.on_loss = store.rewrite

    def answered(self, call: Call, added: float) -> None:
        """An answer ended: what the proxy added to it, in the log and the metrics."""
        self.pages.added.observe(added)
        added_ms = round(added, 3)
        log.info("streamres.proxy_answered", api=call.api, model=call.model, added_ms=added_ms)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served on its own: answers live as long as it
            async with self.answers.run():
                await asgi.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.serving >= self.config.server.connections:  # the excess only: 503, come back
            path = scope["path"]
            api: API = "anthropic" if path.startswith("/v1/messages") else "openai"
            message = f"the proxy serves {self.serving} requests at once, its limit: try again"
            await asgi.error(send, api, 503, message, 1.0)
            return
        self.serving += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self.serving -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = None if self.clients else not_private(scope, self.config.server)
        if refused is not None:
            await asgi.json_response(
                send, 403, {"error": {"message": refused, "type": "forbidden"}}
            )
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path in _APIS:
            await self._answer(_APIS[path], scope, receive, send)
        elif method == "POST" and path in _COUNTS:
            await self._count(_COUNTS[path], scope, receive, send)
        elif path.startswith(("/v1/answers/", "/v1/responses/")):
            await self._again(scope, receive, send)
        elif method == "GET" and path == "/v1/models":
            await asgi.json_response(send, 200, self.pages.models())
        elif method == "GET" and path in _OPERATOR_PAGES and not self.pages.operator(scope):
            message = (
                "the proxy's health and metrics need the operator key: Authorization: Bearer "
                "KEY (a browser asks for it as a password)"
                if self.config.operator_key
                else "with client keys configured, health and metrics need an operator key: "
                'set [operator] key_env = "…" (or public_health = true) in routes.toml'
            )
            challenge = [(b"www-authenticate", b'Basic realm="streamres operator"')]
            body = json.dumps({"error": {"message": message}}).encode()
            await asgi.respond(send, 401, body, "application/json", challenge)
        elif method == "GET" and path == "/health":
            await asgi.json_response(send, 200, self.pages.health())
        elif method == "GET" and path == "/health/stream":
            await self.pages.health_stream(receive, send)
        elif method == "GET" and path == "/metrics":
            await self.pages.prometheus(send)
        elif method in ("GET", "HEAD") and path == "/":
            page = BOARD_HTML.encode() if method == "GET" else b""
            await asgi.respond(send, 200, page, "text/html; charset=utf-8")
        elif method == "GET" and path == "/chat":
            await asgi.respond(send, 200, CHAT_HTML.encode(), "text/html; charset=utf-8")
        else:
            await asgi.json_response(send, 404, {"error": {"message": f"no {method} {path} here"}})

    # -- answers -------------------------------------------------------------------------

    async def _answer(self, api: API, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        state: ClientState | None = None
        began = time.perf_counter()
        served: list[Any] = [scope["path"], "", 0]
        self.requests.append(served)
        try:
            state, slot = await self.admission.admit(headers)
        except Refused as exc:
            served[2] = exc.status
            await asgi.error(send, api, exc.status, str(exc), exc.retry_after)
            return
        try:  # from here on, however the request ends, its key's in-flight count goes back
            # (a held answer takes it: it goes back when the answer stops running)
            try:
                call = parse(api, await asgi.body(receive, self.config.server))
                chain = self.config.models.get(call.model)
                if chain is None:
                    raise Refused(
                        404,
                        f"the model {call.model!r} does not exist here; "
                        f"GET /v1/models lists {sorted(self.config.models)}",
                    )
                priority = _priority(headers, state)
                owner = state.key.name if state is not None else None
                await self.conversations.follow_on(call, owner)
                own = sorted(_OWN_ARGUMENTS & call.params.keys())
                if own:
                    # Not fields of the API: names of the library's own arguments (a deadline,
                    # headers, a cache scope, a lane), which are the operator's, never a
                    # client's to set through the body.
                    raise Refused(
                        400, f"{own[0]!r} is not a field of this API; the proxy sets it itself"
                    )
                self._left_out(call, chain)
            except (Refused, BadRequest) as exc:
                refused = exc if isinstance(exc, Refused) else Refused(400, str(exc))
                served[2] = refused.status
                await asgi.error(
                    send, api, refused.status, str(exc), refused.retry_after, refused.code
                )
                return
            served[1] = call.model
            status_events = headers.get("x-streamres-status") == "events"
            first = next((r.model for r in self.client.routes if r.key == chain[0]), None)
            writer = Writer(call, model=first, status_events=status_events)
            # Answers are shared (cache, single-flight) within a client key, never across
            # unless the operator says so.
            tenant = state.key.name if state and not self.config.cache_shared else None
            parent = _caller_trace(headers)
            await self._run(
                call,
                chain,
                writer,
                receive,
                send,
                served,
                tenant,
                priority,
                parent,
                owner,
                slot,
                began,
            )
        finally:
            await slot.give_back()

    async def _count(self, api: API, scope: Scope, receive: Receive, send: Send) -> None:
        """A request's input tokens: asked of the first route of its model's chain when that
        route's API counts them, else (or when it fails) counted here, an estimate
        (``x-streamres-count``: ``upstream`` or ``estimate``)."""
        pieces = (self.config, self.admission, self.client.routes, self.conversations)
        await counting.serve(api, scope, receive, send, *pieces)

    def _left_out(self, call: Call, chain: list[str]) -> None:
        """Say what of the request a route of its chain leaves out (the log), or refuse a
        hosted tool one cannot run when the operator asks for that (``[tools] hosted``)."""
        routes = [r for key in dict.fromkeys(chain) for r in self.client.routes if r.key == key]
        left = left_out(call, routes)
        if not left:
            return
        if self.config.hosted_tools == "refuse":
            for key, name, why in left:
                if name.startswith(HOSTED):
                    raise Refused(
                        400,
                        f"{name.removeprefix(HOSTED)} is a hosted tool route {key!r} cannot run "
                        f"({why}); ask a model whose routes run it, or leave the tool out",
                    )
        log.info(
            "streamres.proxy_left_out",
            model=call.model,
            left=[f"{key}: {name}" for key, name, _ in left],
            why=sorted({why for _, _, why in left}),
        )

    async def _run(
        self,
        call: Call,
        chain: list[str],
        writer: Writer,
        receive: Receive,
        send: Send,
        served: list[Any],
        tenant: str | None,
        priority: int,
        parent: Any = None,
        owner: str | None = None,
        slot: Slot | None = None,
        began: float | None = None,
    ) -> None:
        """Stream (or collect) the answer; ``served[2]``: the HTTP status sent; ``tenant``: the
        client key whose answers it may share; ``priority``: its lane for slots; ``parent``:
        the caller's trace context (its ``traceparent``), which the answer's span continues;
        ``owner``: the client key's name, the only one that may read the answer again."""
        kwargs: dict[str, Any] = dict(call.params)
        # Work nobody watches yields: a background answer never takes a route's last slot.
        kwargs["priority"] = min(priority, BACKGROUND) if call.background else priority
        if call.max_tokens is not None:
            kwargs["max_tokens"] = call.max_tokens
        if call.stream or call.background:
            deadline_at = anyio.current_time() + self.config.deadline
            held = Held(writer, call, owner, chain, kwargs, tenant, deadline_at, parent)
            held.began = began
            if slot is not None:
                held.slot = slot.hand_over()  # counted until the answer stops running
            try:
                self.answers.start(held)
            except Full as exc:
                if held.slot is not None:
                    await held.slot.give_back()
                served[2] = exc.status
                await asgi.error(send, call.api, exc.status, str(exc), 5.0)
                return
            if not call.stream and self.answers.tasks is None:
                # Served without the proxy's task group (no ASGI lifespan): nothing would run
                # the answer once this request ended, so it runs in it.
                await self.answers.produce_here(held)
            if not call.stream:  # background: the answer runs; it is read later
                served[2] = 200
                await asgi.json_response(send, 200, held.snapshot())
                return
            if self.answers.tasks is not None:
                # Its producer first, until its request is out: the reader gets ready while
                # the upstream thinks, not before the request goes.
                await anyio.lowlevel.checkpoint()
            await self._read(held, -1, receive, send, served)
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(asgi.watch_disconnect, receive, tg.cancel_scope)
            try:
                await self._relay(
                    call, chain, kwargs, writer, send, served, tenant, parent, owner, began
                )
            except anyio.get_cancelled_exc_class():
                if not tg.cancel_scope.cancel_called:  # the server stops: the client is here
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                        await self._stopping(call, writer, send, served)
                raise
            finally:
                tg.cancel_scope.cancel()

    async def _read(
        self,
        held: Held,
        after: int,
        receive: Receive,
        send: Send,
        served: list[Any],
        at_end: int = 200,
    ) -> None:
        """Send ``held``'s events after number ``after``, then each new one, to its end: the
        response head with the first of them (so an answer that fails before any text is
        still answered with a real status; a client of status events gets it at once, and a
        failure in-band). A reader that already has the whole answer gets
        a clean empty end, with status ``at_end`` (204 tells a browser's ``EventSource`` not
        to come again). The client going ends the reading, not the answer (``held``)."""
        head = [(b"x-streamres-answer", held.id.encode())]
        answers = self.answers
        async with anyio.create_task_group() as tg:
            tg.start_soon(asgi.watch_disconnect, receive, tg.cancel_scope)
            with answers.reading(held):
                if not held.producing and not held.log.ended and answers.tasks is None:
                    tg.start_soon(answers.produce_here, held)  # no task group: made here
                if held.writer.status_events and not served[2]:
                    # A client of status events is told of waits in-band: its head (with
                    # the answer's id) at once, so a reload during a wait finds the answer.
                    served[2] = 200
                    await asgi.start(send, 200, "text/event-stream", head)
                try:
                    ended = False
                    async for data, last in answers.follow(held, after):
                        if not served[2]:
                            served[2] = 200
                            await asgi.start(send, 200, "text/event-stream", head)
                        await asgi.piece(send, data, more=not last)  # the last one ends it
                        ended = last
                    if served[2]:
                        if not ended:
                            await asgi.piece(send, b"", more=False)
                    elif held.started and after >= 0:  # read to its end already
                        served[2] = at_end
                        kind = "text/event-stream" if at_end == 200 else "text/plain"
                        await asgi.respond(send, at_end, b"", kind, head)
                    else:  # it failed before any text
                        exc = held.log.error or streamres.StreamError("the answer failed")
                        status, retry = _status_of(exc)
                        served[2] = status
                        await asgi.error(send, held.call.api, status, str(exc), retry)
                except anyio.get_cancelled_exc_class():
                    if not tg.cancel_scope.cancel_called:  # the server stops: the client is here
                        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                            await self._stopping(held.call, held.writer, send, served)
                    raise
                finally:
                    tg.cancel_scope.cancel()

    async def _again(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An answer asked for again: read on, where it stands, stopped (``held``)."""
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = _query(scope)
        responses = path.startswith("/v1/responses/")
        rest = path.removeprefix("/v1/responses/" if responses else "/v1/answers/")
        answer_id, _, action = rest.partition("/")
        api: API = "responses" if responses else _api_of(answer_id)
        verbs = (
            {
                ("GET", ""): "read",
                ("POST", "cancel"): "stop",
                ("DELETE", ""): "delete",
                ("GET", "input_items"): "items",
            }
            if responses
            else {("GET", "events"): "events", ("GET", ""): "state", ("POST", "stop"): "stop"}
        )
        verb = verbs.get((method, action))
        if verb is None:
            await asgi.json_response(send, 404, {"error": {"message": f"no {method} {path} here"}})
            return
        try:
            owner = self.admission.reader(headers)
            kept = (
                await self.conversations.serve(verb, answer_id, owner, query) if responses else None
            )
        except Refused as exc:
            await asgi.error(send, api, exc.status, exc.message, exc.retry_after)
            return
        if kept is not None:
            await asgi.json_response(send, *kept)
            return
        try:
            held = await self._look_up(answer_id, owner)
        except Refused as exc:
            await asgi.error(send, api, exc.status, exc.message, exc.retry_after)
            return
        if (
            held is None
            or (responses and held.call.api != "responses")
            or verb in ("items", "delete")
        ):
            message = (
                "no such answer here: it never was, it is another key's, or it ended over "
                f"{self.config.answers.keep:g} s ago and was forgotten"
            )
            await asgi.error(send, api, 404, message, None, "answer_not_found")
            return
        await self.answers.refresh(held)  # parked here: another process may have gone on
        if verb == "stop":
            await self.answers.stop(held)
            if responses:
                await asgi.json_response(send, 200, held.snapshot())
            else:
                await asgi.json_response(send, 200, _state(held))
            return
        if verb == "state" or (verb == "read" and query.get("stream") != "true"):
            await asgi.json_response(send, 200, held.snapshot() if responses else _state(held))
            return
        try:
            if held.readers >= self.config.answers.max_readers:
                raise Refused(
                    429,
                    f"this answer has {held.readers} readers already "
                    f"(at most {self.config.answers.max_readers} at once)",
                    1.0,
                )
            name, after = _after(
                query.get("starting_after") if responses else None,
                headers.get("last-event-id") or query.get("after"),
            )
            if after > held.last_number and held.shadow:
                # Read from another process's log, which may be a batch behind what that
                # process sent: a moment for it to come.
                with anyio.move_on_after(2.0):
                    while after > held.last_number and not held.log.ended:
                        await held.log.changed(len(held.log.events))
            if after > held.last_number:
                raise Refused(
                    400,
                    f"{name} {after} is past this answer's last event ({held.last_number}): "
                    "its numbers come from the answer's own events",
                )
            if held.parked and not held.log.ended and held.slot is None and self.clients:
                # Read again, it runs again: one of its key's answers in flight.
                held.slot = await self.admission.slot(self.admission.client_of(headers))
        except Refused as exc:
            await asgi.error(send, api, exc.status, exc.message, exc.retry_after)
            return
        served = [scope["path"], held.call.model, 0]
        # A browser's EventSource sends Last-Event-ID, and comes again after a 200 that ends.
        at_end = 204 if "last-event-id" in headers and not responses else 200
        await self._read(held, after, receive, send, served, at_end)

    async def _look_up(self, answer_id: str, owner: str | None) -> Held | None:
        """The answer, here or in shared state. While shared state cannot say whether it
        exists (away, or back and being written again), the request waits for it — up to
        ``[answers] resume_wait`` seconds, asking again with a growing pause — and only past
        that is it a 503 with Retry-After."""
        shared = self.answers.shared
        waited_until = anyio.current_time() + self.config.answers.resume_wait
        pause = 0.1
        while True:
            held = self.answers.find(answer_id, owner) or await self.answers.find_shared(
                answer_id, owner
            )
            if held is not None or shared is None or not await shared.unsure():
                return held
            left = waited_until - anyio.current_time()
            if left <= 0:
                raise Refused(
                    503,
                    "this answer cannot be looked up now: shared state is away, or has just "
                    "come back and the proxies holding answers are writing them again — try "
                    "again",
                    2.0,
                )
            await anyio.sleep(min(pause, left))
            pause = min(2 * pause, 1.0)

    async def _stopping(self, call: Call, writer: Writer, send: Send, served: list[Any]) -> None:
        """The proxy is stopping and this answer's grace ran out: say so, after the partial
        answer (an error event), or as a 503 when nothing was sent yet."""
        message = (
            "the proxy is shutting down and this answer did not finish within its grace "
            "period; the partial answer ends here — ask again"
        )
        if served[2] == 200 and call.stream:
            error = streamres.StreamError(message, reason="shutdown")
            await asgi.piece(send, writer.failed(error))
            await asgi.piece(send, b"", more=False)
        elif served[2] == 0:
            served[2] = 503
            await asgi.error(send, call.api, 503, message, 5.0)

    async def _relay(
        self,
        call: Call,
        chain: list[str],
        kwargs: dict[str, Any],
        writer: Writer,
        send: Send,
        served: list[Any],
        tenant: str | None,
        parent: Any = None,
        owner: str | None = None,
        began: float | None = None,
    ) -> None:
        started = False
        pending: list[bytes] = []
        waited = 0.0  # the library's deliberate waits (backoff before a retry or a resume)

        async def out(data: bytes) -> None:
            nonlocal started
            if not started:
                started = True
                served[2] = 200
                await asgi.start(send, 200, "text/event-stream")
                data = writer.start() + b"".join(pending) + data
            await asgi.piece(send, data)

        try:
            with within(parent):  # the answer's span, if traced, is the caller's child
                answer = self.client.stream(
                    call.messages, model=chain, cache_scope=tenant, **kwargs
                )
            async with answer as events:
                async for ev in events:
                    if not call.stream:
                        if ev.type == "done":
                            body = writer.body(ev)
                            if call.api == "responses":
                                await self.conversations.kept(call, json.loads(body), owner)
                            served[2] = 200
                            extra = []
                            if began is not None:
                                added = added_ms(time.perf_counter() - began, ev, waited)
                                extra.append((b"x-streamres-overhead-ms", b"%.2f" % added))
                                answer.set_attribute("streamres.proxy.added_ms", added)
                                self.answered(call, added)
                            await asgi.respond(send, 200, body, "application/json", extra)
                            return
                        if ev.type in ("retry", "resume"):
                            waited += ev.delay
                        continue
                    if ev.type == "text":
                        await out(writer.text(ev.text))
                    elif ev.type == "thinking":
                        await out(writer.thinking(ev.text))
                    elif ev.type == "tool_call":
                        await out(writer.tool_call(ev))
                    elif ev.type == "done":
                        await out(writer.done(ev))
                        await asgi.piece(send, b"", more=False)
                        return
                    elif started:
                        await out(writer.status(ev))
                    else:
                        pending.append(writer.status(ev))
        except streamres.StreamError as error:
            exc = without_urls(error, self.client.routes)
            if started:
                await out(writer.failed(exc))
                await asgi.piece(send, b"", more=False)
                return
            status, retry = _status_of(exc)
            served[2] = status
            await asgi.error(send, call.api, status, str(exc), retry)


def _api_of(answer_id: str) -> API:
    """The API an answer's id was made in (its prefix)."""
    for api, prefix in PREFIXES.items():
        if answer_id.startswith(prefix):
            return api  # type: ignore[return-value]
    return "openai"


def _query(scope: Scope) -> dict[str, str]:
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    return dict(parse_qsl(raw, keep_blank_values=True))


def _after(starting_after: str | None, last_event_id: str | None) -> tuple[str, int]:
    """The number of the last event the reader has (-1: none), and what named it."""
    given = starting_after if starting_after is not None else last_event_id
    name = "starting_after" if starting_after is not None else "Last-Event-ID"
    if given is None or given == "":
        return name, -1
    if not given.isascii() or not given.isdigit() or len(given) > 12:
        raise Refused(400, f"{name} must be an event number this answer sent, not {given[:40]!r}")
    return name, int(given)


def _state(held: Held) -> dict[str, Any]:
    """Where an answer stands, for ``GET /v1/answers/{id}``."""
    return {
        "id": held.id,
        "object": "streamres.answer",
        "model": held.writer.model,
        "status": held.status,
        "parked": held.parked,
        "last_event_id": held.last_number,
        "text": held.log.text,
    }


def _status_of(exc: streamres.StreamError) -> tuple[int, float | None]:
    """The HTTP status for an answer that failed before any text, and a Retry-After."""
    if isinstance(exc, streamres.InvalidRequest):
        return 400, None  # the request itself is wrong: retrying cannot help, so no 503
    if isinstance(exc, streamres.RequestRejected):
        code = exc.status_code
        if code is not None and 400 <= code < 500:
            return code, None
        if code is None or code < 400:
            # Refused in a body that came with a 200 (some servers send their errors so): a
            # refusal all the same, never a success; the caller's request is what it refused.
            return 400, None
    if isinstance(exc, streamres.DeadlineExceeded):
        return 504, None
    if isinstance(exc, streamres.UpstreamUnreachable):
        # A wrong URL or port, or a server not up: when to ask again (its circuit's wait).
        return 502, exc.retry_after if exc.retry_after is not None else 5.0
    if exc.reason == "rate_limit":
        return 429, 5.0
    if exc.reason in _UPSTREAM_FAULTS:
        return 502, None  # the upstream broke its answers (not full): a gateway's error
    return 503, 5.0  # capacity: every model full; come back later


#: Failures that are the upstream misbehaving rather than full: a 502 when they end an answer.
_UPSTREAM_FAULTS = frozenset(
    {"transient", "connection", "stall", "truncated", "malformed", "ended_at_seam", "slow"}
)
