"""The life of one answer, as a state machine. Pure: no I/O; time and randomness passed in.

:class:`Answer` applies the table of ``states`` (whose docstring is the theory of operation):
each fact method checks that its fact may come in the answer's state, runs the step the table
names, and returns the next action. The steps are here; what they hold lives beside them — the
attempt in progress (``attempt``), what reached the caller and its count (``delivery``), the
next request (``request``), the choice of a model (``choice``), one read's decoding
(``reading``), what a failed attempt tells the caller (``telling``).

Why this module is about a thousand lines: it is the steps of one table, and each step reads
and sets the answer's own fields (its position in the chain, its attempts, its last failure,
its state); split further, each call would carry ten of them. What the steps hold and compute
is in the modules above; what is left here is the order of things.

An instruct continuation that ends normally having added nothing — a restart no longer than
what was delivered, a bare preamble — is not a finished answer: ``account`` turns it into an
``ended_at_seam`` failure, asked again in the quoting wording and then of the next model
(:data:`SEAM_TRIES`), after which the answer ends as it stands with ``join="ended_at_seam"``.
A response whose headers show a server that continues a final assistant message (``server:
llama.cpp``) is remembered, so ``auto`` resumes it by prefill.

Whatever way the shell leaves (an error, the caller closing the stream), it calls
:meth:`Answer.abandon`, which gives back what the attempt in progress holds: a breaker's
half-open probe, an in-flight count, a concurrency slot, a budget ticket.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from streamres._answer import choice, reading, request, telling
from streamres._answer.actions import (
    READ,
    Acquire,
    Action,
    Count,
    Fail,
    Finish,
    Load,
    ReadBody,
    Reserve,
    Send,
    Wait,
)
from streamres._answer.attempt import AttemptState
from streamres._answer.delivery import JOINS, Delivery
from streamres._answer.memory import Encodings, Memory, Slots
from streamres._answer.options import Options
from streamres._answer.states import Fact, State, Step, step_for
from streamres._core.backoff import after_hint
from streamres._core.classify import (
    Failure,
    classify_not_a_stream,
    classify_response,
    failure,
    is_event_stream,
)
from streamres._core.continuation import Strategy, continues_prefill
from streamres._core.errors import (
    DeadlineExceeded,
    InvalidRequest,
    StreamError,
)
from streamres._core.events import (
    Attempt,
    DoneEvent,
    Event,
    FallbackEvent,
    RetryEvent,
    TextEvent,
    ToolCallEvent,
)
from streamres._core.inflate import InflateError, Inflater
from streamres._core.logs import SILENT, Log
from streamres._core.policy import (
    connect_allowance,
    connect_timeout,
    decide,
    reinterpret,
    this_side_busy,
)
from streamres._core.redact import Redactor, redact_url, url_secrets
from streamres._core.sse import SSEDecoder
from streamres._core.stall import StallTimer, first_output_limit
from streamres._core.tokens import ON_LOOP, Counter, TokenLedger
from streamres._core.wording import (
    busy_message,
    fallback_message,
)
from streamres._fleet.routes import Route
from streamres._providers import responses as _responses
from streamres._providers.wire import StreamDecoder

__all__ = [
    "READ",
    "SEAM_TRIES",
    "Acquire",
    "Action",
    "Answer",
    "Count",
    "Fail",
    "Finish",
    "Load",
    "Memory",
    "ReadBody",
    "Reserve",
    "Send",
    "Slots",
    "Wait",
]

#: How many times an instruct continuation that ended at the seam, adding nothing, is asked
#: again (in the other wording, or of the next model) before the answer ends as it stands.
SEAM_TRIES = 2

#: Bytes of a body that is not an event stream kept to classify it.
ERROR_BODY_LIMIT = 64 * 1024
#: The longest the shell reads a complete body's end, for connection reuse.
DRAIN_SECONDS = 1.0


class Answer:
    """One answer's decisions. See ``states`` for the protocol."""

    def __init__(
        self,
        opts: Options,
        *,
        now: float,
        slots: Slots | None = None,
        memory: Memory | None = None,
        encodings: Encodings = lambda model: None,
        load_now: Callable[[str], tuple[str, Counter]] | None = None,
        secret_headers: Callable[[str], bool] = lambda name: False,
        shared_budget: bool = False,
        log: Log = SILENT,
    ) -> None:
        self.opts = opts
        #: Where what happened is told (the shell's logger; by default, nowhere).
        self.log = log
        self.fleet = opts.fleet
        #: The retry budget is shared between processes: the shell asks it (``Reserve``).
        self.shared_budget = shared_budget
        self.slots = slots
        self.memory = memory if memory is not None else Memory()
        self.encodings = encodings
        #: Encodings loaded for this answer at its request (``Load``), by model.
        self._loaded: dict[str, tuple[str, Counter]] = {}
        self._loading = ""
        #: Loads an encoding where it is called: for counts owed, made when first read.
        self.load_now = load_now
        #: Events for the caller, in order; the shell takes them after each fact.
        self.events: list[Event] = []
        #: When the read in progress must end (the deadline, the stall timer).
        self.read_deadline = 0.0
        #: What reached the caller, and its count.
        self.d = Delivery(opts.read_limits.answer, opts.max_tokens)
        if opts.continue_from:  # the caller has it: delivered already, never sent again
            self.d.add(opts.continue_from)
            self.d.server_tokens = None
        self.history: list[Attempt] = []
        self.failures = [0] * len(opts.chain)
        #: The chain has another model to go to (the header and first-output bounds apply).
        self.has_fallback = len(set(opts.chain)) > 1
        #: Chain positions whose model refused this answer's request for its length.
        self.too_long = [False] * len(opts.chain)
        self.pos = 0
        self.attempts = 0
        self.resumes = 0
        #: Instruct continuations that ended at the seam and were asked again.
        self.seam_tries = 0
        #: The id the server gave the response that finished the answer (``DoneEvent``).
        self.response_id = ""
        #: A background Responses API response to re-attach to: (route, id, last sequence).
        self.replay: tuple[int, str, int] | None = None
        self.start = now
        self.t_end = now + opts.deadline
        self.stall = StallTimer(fixed=opts.stall_timeout, first=opts.first_token_timeout)
        self.last: Failure | None = None  # the last attempt's failure
        self.at: AttemptState | None = None
        #: Where the answer waits for the shell (``states.TABLE``: which facts it takes).
        self.state = State.IDLE
        self._status: tuple[int, Mapping[str, str]] = (0, {})
        self._ended_at = 0.0
        self._lingering = False
        #: This wait for a model that will take the request was told to the caller.
        self._told_busy = False
        #: The finish reason and refusal of a done event waiting for a count.
        self._ending = ("stop", "")
        #: A whole answer's slot, given back once its body's end is read (see ``abandon``).
        self._slot_after_drain: Route | None = None
        secrets: list[str | None] = [v for k, v in opts.headers.items() if secret_headers(k)]
        for i in opts.chain:
            r = self.fleet.routes[i]
            secrets += [r.api_key, *url_secrets(r.base_url or "")]
        #: Every secret this answer sends, masked in every message, history entry and log.
        self.secrets = frozenset(s for s in secrets if s)
        self.redactor = Redactor(secrets)

    # -- what the answer is now --------------------------------------------------------------

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
        """The answer delivered so far."""
        return self.d.text

    @property
    def parts(self) -> list[str]:
        """The delivered text, in the pieces it came in (joined when read)."""
        return self.d.parts

    @property
    def chars(self) -> int:
        return self.d.chars

    # -- facts: the shell's reports ----------------------------------------------------------

    def _resume(self, fact: Fact, now: float) -> Action:
        """Run the step the table names for ``fact`` in this state."""
        return _RESUME[step_for(self.state, fact)](self, now)

    def start_answer(self, now: float) -> Action:
        """The caller started iterating."""
        return self._resume("start", now)

    def woke(self, now: float) -> Action:
        """A ``Wait`` ended."""
        return self._resume("woke", now)

    def loaded(self, encoding: str, count: Counter, now: float) -> Action:
        """The encoding asked for with ``Load`` is ready."""
        step = step_for(self.state, "loaded")
        self._loaded[self._loading] = (encoding, count)
        if self.d.count is None:
            self.d.encoding, self.d.count = encoding, count
        return _RESUME[step](self, now)

    def counted(self, now: float) -> Action:
        """The ``Count`` is done."""
        return self._resume("counted", now)

    def reserved(self, turn: float, now: float) -> Action:
        """The shared retry budget's answer to ``Reserve``: the ticket is this attempt's, and
        its turn comes ``turn`` seconds from now."""
        step_for(self.state, "reserved")
        return self._ticket(turn, now)

    def acquired(self, ok: bool, now: float, *, queued: float) -> Action:
        """The ``Acquire`` ended: a slot was taken (``ok``), or the time ran out."""
        step_for(self.state, "acquired")
        at = self._attempt()
        self.fleet.queued(at.index, queued)
        if not ok:
            return self._fail(
                DeadlineExceeded,
                f"no free slot on {at.route.model} (max_in_flight) before the deadline",
            )
        at.slot = True
        return self._request(now)

    def send_failed(self, fail: Failure, now: float, *, queued: float, late: float = 0.0) -> Action:
        """No response headers: the connection, the deadline or the stall timer failed.
        ``late``: how late this process's event loop has been running (seconds), as the shell
        measured it — a connect that timed out meanwhile may be this side's (policy rule 9)."""
        step_for(self.state, "send_failed")
        at = self._attempt()
        self.fleet.queued(at.index, queued)
        timeout = connect_timeout(at.reached)
        if fail.error_type == "connect_timeout" and this_side_busy(timeout, late):
            fail = failure(
                "client_busy",
                f"no connection to {redact_url(at.route.base_url or '')} within "
                f"{timeout + connect_allowance(late):.1f} s while this process's event loop "
                f"ran {late:.1f} s late: this side was too busy to see the server answer, so "
                "the server is not blamed",
            )
        return self._over(fail, now)

    def started(
        self, status: int, headers: Mapping[str, str], now: float, *, queued: float
    ) -> Action:
        """The response's headers came."""
        step_for(self.state, "started")
        at = self._attempt()
        self.fleet.queued(at.index, queued)
        self.memory.reached.add(at.route.base_url)
        if continues_prefill(headers):
            self.memory.continues.add(at.route.base_url)
        elif status == 200:
            # Another server answers at this URL now (a restart, a port used again): what the
            # last one did no longer says what this one does.
            self.memory.continues.discard(at.route.base_url)
        try:
            at.inflater = Inflater(
                headers.get("content-encoding"), limit=self.opts.read_limits.inflate
            )
        except InflateError as exc:
            return self._over(failure("malformed", str(exc)), now)
        if status >= 300 or not is_event_stream(headers):
            self._status = (status, dict(headers))
            self.state = State.BODY
            return ReadBody(until=min(self.t_end, now + self.stall.limit()))
        self.stall.start(now)  # the stall timer starts with the headers
        self.read_deadline = min(self.t_end, self.stall.deadline())
        self.state = State.READING
        return READ

    def body(self, data: bytes, now: float, *, wall: float) -> Action:
        """The start of a body that is not an event stream (``wall``: the wall-clock time,
        for Retry-After dates)."""
        step_for(self.state, "body")
        at = self._attempt()
        assert at.inflater is not None
        assert at.request is not None
        with contextlib.suppress(InflateError):  # unreadable: classified as it came
            data = at.inflater.feed(data)[:ERROR_BODY_LIMIT]
        text = data.decode("utf-8", "replace")
        status, headers = self._status
        url = redact_url(at.request.url)
        if status >= 400:
            fail = classify_response(status, headers, text, now=wall, url=url)
        else:
            fail = classify_not_a_stream(status, headers, text, url=url, now=wall)
        return self._over(fail, now)

    def data(self, chunk: bytes, now: float) -> Action:
        """Bytes of the event stream came. The per-token path: kept short (the table is asked
        only when the state is not the one it allows)."""
        if self.state is not State.READING:
            step_for(self.state, "data")
        at = self.at
        assert at is not None
        assert at.sse is not None
        assert at.decoder is not None
        assert at.inflater is not None
        sse, decoder = at.sse, at.decoder
        try:
            events = sse.feed(chunk if at.inflater.identity else at.inflater.feed(chunk))
        except InflateError as exc:
            return self._over(failure("malformed", str(exc)), now)
        return self._decode(at, sse, decoder, events, now)

    def eof(self, now: float) -> Action:
        """The body ended."""
        step_for(self.state, "eof")
        at = self._attempt()
        assert at.sse is not None
        assert at.decoder is not None
        assert at.inflater is not None
        at.eof = True
        try:
            at.inflater.close()
        except InflateError as exc:
            return self._over(failure("malformed", str(exc)), now)
        return self._decode(at, at.sse, at.decoder, at.sse.close(), now)

    def timed_out(self, now: float, *, late: float = 0.0) -> Action:
        """The read timer fired (``read_deadline`` passed). ``late``: how late this process's
        event loop has been running, as the shell measured it — a silence while it ran at
        least half the limit late may be this side's (policy rule 9): waited out again, not
        resumed (a new request would only add to the load that made it late)."""
        step_for(self.state, "timed_out")
        if now >= self.t_end:
            return self._over(failure("deadline", "the deadline passed mid-stream"), now)
        if this_side_busy(self.stall.limit(), late):
            self.stall.wait_more(now)
            self.read_deadline = min(self.t_end, self.stall.deadline())
            self.log.debug("streamres.stall_waited", late=round(late, 3))
            return READ
        silence = failure("stall", f"no output for {self.stall.limit():.3g} s")
        if self.at is not None and self.at.first_content is None:
            # Nothing yet: the model is slow to start for its history (``first_output``).
            silence = dataclasses.replace(silence, error_type="first_output")
        return self._over(silence, now)

    def read_failed(self, fail: Failure, now: float) -> Action:
        """A read raised (the connection broke)."""
        step_for(self.state, "read_failed")
        return self._over(fail, now)

    def probe_taken(self, now: float, *, until: float) -> Action:
        """Another process is probing this half-open model: this attempt is not made; the model
        is refused here until ``until`` (or until that probe's outcome arrives)."""
        step_for(self.state, "probe_taken")
        at = self._attempt()
        self.fleet.not_sent(at.index, resume=bool(at.chars_before))
        at.books = "recorded"
        self.fleet.apply(at.index, "open", until)
        self.abandon()
        self.attempts -= 1
        return self._choose(now)

    # -- taken in any state ------------------------------------------------------------------

    def abandon(self) -> None:
        """The shell leaves (the answer ended, or before it did): give back what the attempt
        holds — and a whole answer's slot, held while its body's end was read."""
        route, self._slot_after_drain = self._slot_after_drain, None
        if route is not None and self.slots is not None:
            self.slots.release(route)
            self.slots.notify()
        at, self.at = self.at, None
        if at is None:
            return
        if at.books == "acquired":
            self.fleet.release(at.index)
        elif at.books == "started":  # cancelled, or an error raised mid-attempt
            self.fleet.abandoned(at.index)
        if at.ticket:
            self.fleet.budget.refund()
        if self.slots is not None:
            if at.slot:
                self.slots.release(at.route)
            self.slots.notify()

    def unbuildable(self, message: str) -> StreamError:
        """The shell could not build the request (a bad URL or header): the caller's to fix."""
        return self._error(InvalidRequest, message, None)

    def crashed(self, exc: BaseException) -> StreamError:
        """A bug (in streamres or an extension), not a failure of the upstream: nothing is
        lost, and only a :class:`StreamError` leaves the library."""
        return self._error(
            StreamError,
            f"unexpected error inside streamres ({type(exc).__name__}: {exc}); the partial "
            "answer is kept. Please report this.",
            None,
        )

    # -- steps: from choosing a model to sending --------------------------------------------

    def _breaker_moved(self, route: Route, state: str | None) -> None:
        if state is not None:
            self.log.info(f"streamres.breaker_{state}", model=route.key)

    def _attempt(self) -> AttemptState:
        assert self.at is not None, "no attempt in progress"
        return self.at

    def _needs(self, state: State) -> Load | Count | None:
        """Before a count of the delivered tokens: ``Load`` when the encoding is not here,
        ``Count`` when more text waits to be counted than is counted on the event loop (the
        answer waits in ``state``, whose step runs again)."""
        d = self.d
        if d.count is None:
            got = self._encoding(self.model)
            if got is None:
                return self._load(self.model, state)
            d.encoding, d.count = got
        if d.ledger is None:
            d.ledger = TokenLedger(d.count)
            d.ledger.add(self.text)
        if d.ledger.pending > ON_LOOP:
            self.state = state
            return Count(d.ledger)
        return None

    def _encoding(self, model: str) -> tuple[str, Counter] | None:
        return self._loaded.get(model) or self.encodings(model)

    def _load(self, model: str, state: State) -> Load:
        self.state, self._loading = state, model
        return Load(model)

    def _deliver(self, text: str) -> None:
        if text := self.d.add(text):
            self.events.append(TextEvent(text))

    def _choose(self, now: float) -> Action:
        """Where the next attempt goes: a model whose circuit lets it through."""
        if self.chars and (load := self._needs(State.CHOOSING)):
            return load  # a fallback event says how many tokens were delivered
        if now >= self.t_end and self.last is not None:
            # A wait ran past the deadline (a busy loop wakes late): time, not the models.
            return self._fail(
                DeadlineExceeded, f"the deadline passed; the last attempt: {self.last.message}"
            )
        chain = self.opts.chain
        pos, ready_at = choice.next_available(
            self.fleet, chain, self.pos, self.t_end, now, self._breaker_moved
        )
        if pos is None:
            probing = self.slots is not None and choice.probing(self.fleet, chain)
            if ready_at >= self.t_end and not probing:
                return self._fail(DeadlineExceeded, choice.unavailable(self.fleet, chain, now))
            wait = max(0.0, min(ready_at, self.t_end) - now)
            capacity = self.last is None or self.last.kind in ("capacity", "rate_limit")
            if not self._told_busy:  # woken early and still busy: said once is enough
                self._told_busy = True
                self.events.append(
                    RetryEvent(
                        message=busy_message(wait, probing=probing, capacity=capacity),
                        attempt=self.attempts + 1,
                        delay=wait,
                        reason="circuit_open",
                        model=self.model,
                    )
                )
            self.state = State.BUSY
            # With a client's slots, the wait ends as soon as anything changes — a breaker
            # closing here or in another process, a probe's outcome, a slot freeing — and the
            # models are asked again, rather than sleeping to the earliest scheduled time.
            return Wait(now + wait, probing=self.slots is not None)
        self._told_busy = False
        if pos != self.pos:
            old = self.index
            self.pos = pos
            self.fleet.fell_back(old, self.index)
            self.events.append(
                FallbackEvent(
                    message=fallback_message(
                        self.fleet.routes[old].model, self.model, "circuit_open"
                    ),
                    attempt=self.attempts + 1,
                    from_model=self.fleet.routes[old].model,
                    to_model=self.model,
                    reason="circuit_open",
                    tokens_so_far=self.d.tokens() if self.chars else 0,
                )
            )
        self.attempts += 1
        self.at = AttemptState(self.attempts, self.index, self.route)
        return self._turn(now)

    def _woke_from_busy(self, now: float) -> Action:
        if now >= self.t_end:
            return self._fail(
                DeadlineExceeded, choice.unavailable(self.fleet, self.opts.chain, now)
            )
        return self._choose(now)

    def _turn(self, now: float) -> Action:
        """Wait out a shared cool-down (another stream got Retry-After); take a ticket from the
        retry budget. The budget is a queue: a retry reserves the next token and sleeps once
        until it is there, rather than waking to compete for it. A budget shared between
        processes is asked by the shell (``Reserve``, then ``reserved``)."""
        at = self._attempt()
        if at.number == 1:
            self.fleet.budget.deposit(now)
            return self._ticket(0.0, now)
        if self.last is not None and self.last.kind == "client_busy":
            return self._ticket(0.0, now)  # a retry of this side's failure: not the budget's
        if self.shared_budget:
            at.ticket = True
            self.state = State.RESERVING
            return Reserve()
        at.ticket = True
        return self._ticket(self.fleet.budget.reserve(now), now)

    def _ticket(self, turn: float, now: float) -> Action:
        at = self._attempt()
        wait = self.fleet.cooldown_left(at.index, now)
        if wait > 0:
            wait = after_hint(wait, self.opts.rng.random())
        if turn > 0:
            self.log.info("streamres.retry_budget_spent", model=at.route.key, wait=turn)
        wait = max(wait, turn)
        if wait > 0:
            if now + wait >= self.t_end:
                return self._fail(
                    DeadlineExceeded,
                    f"{at.route.model} is cooling down or the retry budget is spent; "
                    "the next request would come after the deadline",
                )
            self.state = State.TURN
            return Wait(now + wait)
        return self._slot(now)

    def _slot(self, now: float) -> Action:
        """A slot under the route's and the account's concurrency limits."""
        at = self._attempt()
        at.ticket = False  # the turn came: the ticket is used
        if self.slots is not None:
            self.state = State.SLOT
            return Acquire(at.route, self.t_end, self.opts.priority)
        return self._request(now)

    def _request(self, now: float) -> Action:
        """Build the next request (a continuation once text was delivered)."""
        if self.chars and (load := self._needs(State.REQUEST)):
            return load
        at = self._attempt()
        opts, route, d = self.opts, at.route, self.d
        assert route.base_url is not None
        budget = request.budget(opts, route)
        dedup = None
        if self.replay is not None and self._replaying():
            # The server kept generating: re-attach and get exactly what was missed.
            _, response_id, after = self.replay
            req = request.replay(opts, route, response_id, after)
        else:
            messages, extra = opts.messages, opts.extra_body
            if self.chars:
                if budget is not None:
                    budget -= d.tokens() if d.server_tokens is None else d.server_tokens
                how = self._strategy()
                assert how != "replay"
                if how == "instruct" and self._encoding(route.model) is None:
                    return self._load(route.model, State.REQUEST)
                cont = request.continuation(
                    opts,
                    route,
                    self.text,
                    how=how,
                    thinking=d.signed_thinking,
                    wording=self.seam_tries,
                    hold=self.seam_tries == 0
                    and (route.base_url, route.model) not in self.memory.no_hold,
                )
                messages, extra, dedup = cont.messages, cont.extra_body, cont.dedup
            if budget is not None and budget <= 0:
                self.abandon()  # no request: the attempt gives back its probe and slot
                return self._done("length", "", now)
            try:
                req = request.build(opts, route, messages, extra, budget)
            except (TypeError, ValueError) as exc:
                return self._fail(InvalidRequest, f"cannot build the request: {exc}", last=None)
        at.decoder, at.dedup, at.request = request.decoder_for(route, opts), dedup, req
        at.sse = SSEDecoder(max_line=opts.read_limits.line, max_event=opts.read_limits.event)
        at.started = now
        self.stall.first = opts.first_token_timeout
        if self.has_fallback and not (opts.hedged and at.index == opts.chain[0]):
            # A fallback at hand: this model's own pace decides (unless a hedge covers it).
            samples = self.fleet.ttft_samples(at.index)  # with shared state, the fleet's too
            self.stall.first = first_output_limit(samples, opts.first_token_timeout)
        self.stall.start(now)
        at.chars_before = self.chars
        at.tokens_before = d.ledger.tokens if d.ledger is not None else 0
        self.fleet.started(at.index, now, resume=bool(self.chars))
        at.books = "started"
        self.log.debug(
            "streamres.attempt_started",
            model=route.key,
            attempt=at.number,
            url=redact_url(req.url),
        )
        at.reached = route.base_url in self.memory.reached
        self.state = State.SENDING
        return Send(
            req,
            connect_timeout=connect_timeout(at.reached),
            stall=self._header_wait(route),
            until=self.t_end,
            probe_route=route if self.fleet.probing(at.index) else None,
        )

    # -- steps: reading ----------------------------------------------------------------------

    def _decode(
        self,
        at: AttemptState,
        sse: SSEDecoder,
        decoder: StreamDecoder,
        events: list[tuple[str, bytes]],
        now: float,
    ) -> Action:
        """One read's SSE events through the provider's decoder, the de-duplicator and the
        stall timer, into events for the caller."""
        pieces, ending, fail = reading.decode(sse, decoder, events, eof=at.eof)
        if decoder.side or decoder.generating:
            reading.side(at, self.d, decoder, self.stall, self.events, now)
        dedup = at.dedup
        if not pieces and dedup is not None and not dedup.resolved:
            text = dedup.poll(now=now)  # a hold that ran out
            if text:
                self._deliver(text)
        if pieces:
            at.pieces += len(pieces)
            self.stall.output(now)
            if at.first_content is None:
                at.first_content = now
            text = pieces[0] if len(pieces) == 1 else "".join(pieces)
            if dedup is not None and not dedup.resolved:
                text = dedup.feed(text, now=now)
                if dedup.missed:
                    at.lingering = False
                    return self._over(self._missed(at), now)
            if text:
                self._deliver(text)
        if at.calls:
            self.d.tool_calls = at.calls
            for call in at.calls:
                self.events.append(ToolCallEvent(call.id, call.name, call.arguments))
            at.calls = ()
        if ending:
            at.lingering = fail is None and not at.eof
            return self._over(fail, now)
        if self.d.cut:
            return self._cut_off(at, now)
        if now >= self.t_end:  # reads that never wait never meet the read timer
            return self._over(failure("deadline", "the deadline passed mid-stream"), now)
        self.read_deadline = min(self.t_end, self.stall.deadline())
        return READ

    def _cut_off(self, at: AttemptState, now: float) -> Action:
        """The answer reached a bound (``ReadLimits.answer``, ``max_tokens``): it ends here,
        complete with ``finish_reason="length"``; the rest of the stream is not read."""
        at.lingering = False
        bound = (
            f"max_tokens={self.opts.max_tokens}"
            if self.d.cut == "max_tokens"
            else f"ReadLimits.answer={self.opts.read_limits.answer}"
        )
        self.log.warning(
            "streamres.answer_cut",
            model=at.route.key,
            chars=self.chars,
            bound=bound,
            hint="the server kept sending past the answer's bound; it ends as length",
        )
        return self._over(None, now)

    # -- steps: the outcome ------------------------------------------------------------------

    def _over(self, fail: Failure | None, now: float) -> Action:
        """The attempt ended (``fail``: how, ``None`` for complete): record the outcome."""
        at = self._attempt()
        decoder = at.decoder
        assert decoder is not None
        replayed = self._replaying()
        if isinstance(decoder, _responses.ResponsesDecoder):
            response_id = decoder.response_id or (
                self.replay[1] if replayed and self.replay else None
            )
            background = decoder.background or bool(self.opts.extra_body.get("background"))
            if decoder.response_failed:
                self.replay = None  # a failed response replays its failure: start anew
            elif response_id and background and decoder.sequence is not None:
                self.replay = (at.index, response_id, decoder.sequence)
        if fail is not None:
            fail = reinterpret(
                fail,
                prefill_continuation=at.dedup is not None and at.dedup.mode == "prefill",
                replaying=replayed,
            )
            # Servers echo keys in error bodies: no secret goes further than here.
            fail = dataclasses.replace(fail, message=self.redactor.redact(fail.message))
            if fail.kind == "replay_unavailable":
                self.replay = None
        at.fail = fail
        dedup = at.dedup
        if dedup is not None and fail is None and not dedup.resolved:
            text = dedup.finish(now=now)
            if text:
                self._deliver(text)
            if dedup.missed:
                fail = at.fail = self._missed(at)
        if self.chars - at.chars_before and not self.d.signed_thinking:
            # The signed blocks that led to the first text shown: sent back on resume.
            self.d.signed_thinking = list(decoder.signed_thinking)
        fleet, index, route = self.fleet, at.index, at.route
        weight = fleet.states[index].weight.current
        seconds = now - at.started
        ttft = at.first_content - at.started if at.first_content is not None else None
        if fail is None:
            self._breaker_moved(route, fleet.succeeded(index, now, ttft=ttft, latency=seconds))
        else:
            transition = fleet.failed(
                index, now, fail.kind, ttft=ttft, retry_after=fail.retry_after
            )
            self._breaker_moved(route, transition)
            if fail.retry_after is not None:
                self.log.info(
                    "streamres.cooldown_started",
                    model=route.key,
                    seconds=round(fail.retry_after, 3),
                )
        at.books = "recorded"
        if fleet.states[index].weight.current != weight:
            self.log.debug(
                "streamres.weight_changed",
                model=route.key,
                weight=round(fleet.states[index].weight.current, 4),
            )
        if self.slots is not None:
            if at.slot and at.lingering:
                # The answer is whole but the server is still sending the body's end: the
                # request is in flight (for a provider's quota too) until the shell has read
                # it; the slot goes back then (``abandon``).
                self._slot_after_drain = route
            elif at.slot:
                self.slots.release(route)
            at.slot = False
            self.slots.notify()  # an outcome is recorded: streams waiting on a probe wake
        self._ended_at = now
        return self._account(now)

    def _account(self, now: float) -> Action:
        """Count the attempt's tokens (reported, else the ledger's estimate) and record it."""
        at, d = self._attempt(), self.d
        decoder, dedup, fail = at.decoder, at.dedup, at.fail
        assert decoder is not None
        added = self.chars - at.chars_before
        dropped = ""
        if dedup is not None:
            held = dedup.abandon() if not dedup.resolved else ""
            dropped = dedup.stats.dropped + held
        single = at.number == 1 and fail is None and decoder.output_tokens is not None
        if (added and not single) or dropped:
            if self._can_owe(at, fail, dropped):
                d.owed = True
            elif load := self._needs(State.ACCOUNT):
                return load
        if dedup is not None:
            d.wasted += dropped
            d.deduplicated += len(dedup.stats.dropped)
        wasted_tokens = d.count_text(dropped)
        if single:
            assert decoder.output_tokens is not None
            delivered = decoder.output_tokens
        elif d.owed:
            delivered = 0  # counted when first read
        else:
            delivered = (d.tokens() - at.tokens_before) if added else 0
        self.fleet.tokens(at.index, delivered=delivered, wasted=wasted_tokens)
        estimate = delivered + wasted_tokens if added or dropped else None
        reported = decoder.output_tokens
        estimated = reported is None and estimate is not None
        out = reported if reported is not None else estimate
        if d.owed:  # the server reported none; the answer's usage counts it when read
            out, estimated = None, False
        if decoder.input_tokens is not None:
            d.input_tokens = (d.input_tokens or 0) + decoder.input_tokens
        if out is not None:
            d.output_tokens = (d.output_tokens or 0) + out
        d.estimated = d.estimated or estimated
        fields: dict[str, Any] = {
            "chars": added,
            "seconds": self._ended_at - at.started,
            "input_tokens": decoder.input_tokens,
            "output_tokens": out,
            "estimated": estimated,
        }
        if dedup is not None:
            fields.update(
                repeated_chars=len(dedup.stats.dropped),
                held_chars=dedup.stats.held_chars,
                hold_seconds=dedup.stats.hold_seconds,
            )
        if dedup is not None:
            d.joined(dedup, added, at.route, self.memory)
        d.count_server_tokens(
            dedup, continues=at.route.base_url in self.memory.continues, pieces=at.pieces
        )
        if fail is None and not d.cut and self._ended_at_seam(at, added):
            if self.seam_tries < SEAM_TRIES:
                self.seam_tries += 1
                fail = at.fail = failure(
                    "ended_at_seam",
                    "the continuation stopped at the seam without adding to the answer",
                )
            else:
                d.join = JOINS.index("ended_at_seam")
        self.at = None
        if fail is None:
            self.response_id = decoder.response_id or ""  # the response that finished it
            self.history.append(Attempt(at.number, at.route.model, "ok", **fields))
            self.failures[self.pos] = 0
            refusal = "".join(decoder.refusal)
            finish = "length" if d.cut else decoder.finish_reason or "stop"
            finish = "refusal" if refusal else finish
            self._lingering = at.lingering
            return self._done(finish, refusal, now)
        self.history.append(
            Attempt(at.number, at.route.model, fail.kind, fail.message, fail.status_code, **fields)
        )
        self.last = fail
        if fail.kind == "prefill_rejected":
            assert at.route.base_url is not None
            self.memory.prefill_refused.add((at.route.base_url, at.route.model))
        if fail.kind == "ended_at_seam":
            # The model is well, it would not continue: the first time, ask it again (in the
            # other wording); the second, the policy moves to the next model.
            self.failures[self.pos] = self.seam_tries
        elif fail.kind == "client_busy":
            pass  # this side's failure, not the model's: its count stays
        elif fail.kind == "context_length":
            self.too_long[self.pos] = True  # never this model again, for this answer
        else:
            self.failures[self.pos] = 1 if added else self.failures[self.pos] + 1
        return self._decide(at, fail, now)

    def _decide(self, at: AttemptState, fail: Failure, now: float) -> Action:
        """After a failure: retry, resume, switch or give up (the policy decides)."""
        opts = self.opts
        decision = decide(
            fail,
            attempt=at.number,
            max_attempts=opts.max_attempts,
            model_index=self.pos,
            failures=self.failures,
            time_left=self.t_end - now,
            backoff=opts.backoff,
            rand=opts.rng.random(),
            fallback_after=opts.fallback_after,
            reached=at.reached,
            too_long=self.too_long,
            windows=[self.fleet.routes[i].context_window for i in opts.chain],
        )
        tokens = self.d.tokens() if self.chars else 0
        route = at.route
        self.log.info(
            telling.LOG_EVENT[decision.action, bool(self.chars)],
            model=route.key,
            attempt=at.number,
            reason=fail.kind,
            status_code=fail.status_code,
            error=fail.message,
            chars=self.chars,
            delay=round(decision.delay, 3),
        )
        if decision.action == "give_up":
            return self._fail(*telling.giving_up(decision, fail, route.model, at.number))
        if self.chars:
            self.resumes += 1
        strategy = self._strategy() if self.chars else ""
        if decision.action == "switch":
            self.pos = decision.model_index
            self.fleet.fell_back(at.index, self.index)
        self.events.append(
            telling.after_failure(
                decision,
                fail,
                attempt=at.number,
                model=route.model,
                to_model=self.model,
                chars=self.chars,
                tokens=tokens,
                strategy=strategy,
                max_attempts=opts.max_attempts,
            )
        )
        if decision.delay > 0:
            self.state = State.BACKOFF
            return Wait(now + decision.delay)
        return self._choose(now)

    def _done(self, finish_reason: str, refusal: str, now: float) -> Action:
        """The done event: the whole answer, its usage and history."""
        self._ending = (finish_reason, refusal)
        return self._close(now)

    def _close(self, now: float) -> Action:
        d = self.d
        finish_reason, refusal = self._ending
        single = self.resumes == 0 and not d.estimated and d.ledger is None
        counted = not (single and d.output_tokens is not None) or d.wasted
        if counted and not d.owed and (load := self._needs(State.CLOSING)):
            return load
        if d.owed:
            assert self.load_now is not None
            usage = d.usage_owed(self.load_now, self.model)
            self.fleet.tokens_later(self.index, usage)
        else:
            usage = d.usage(single=single)
        elapsed = now - self.start
        self.log.info(
            "streamres.done",
            model=self.model,
            attempts=len(self.history),
            resumes=self.resumes,
            chars=self.chars,
            finish_reason=finish_reason,
            seconds=round(elapsed, 3),
        )
        self.at = None
        self.events.append(
            DoneEvent(
                text=self.text,
                finish_reason=finish_reason,
                model=self.model,
                attempts=len(self.history),
                resumes=self.resumes,
                usage=usage,
                history=tuple(self.history),
                deduplicated_chars=d.deduplicated,
                elapsed=elapsed,
                tool_calls=d.tool_calls,
                thinking="".join(d.thinking),
                refusal=refusal,
                join=JOINS[d.join],  # type: ignore[arg-type]
                response_id=self.response_id,
            )
        )
        self.state = State.DONE
        return Finish(drain=self._lingering, until=min(self.t_end, now + DRAIN_SECONDS))

    # -- helpers -----------------------------------------------------------------------------

    def _can_owe(self, at: AttemptState, fail: Failure | None, dropped: str) -> bool:
        """May this attempt's counts wait until someone reads them? Only for an answer that
        is one complete attempt whose server reported no output count, while no encoding is
        loaded yet: nothing on the answer's way needs a count, so none is made (loading the
        encoding costs more than a short answer)."""
        return (
            at.number == 1
            and fail is None
            and not dropped
            and self.load_now is not None
            and self.d.count is None
            and self._encoding(self.model) is None
        )

    def _fail(
        self, cls: type[StreamError], message: str, *, last: Failure | Literal[0] | None = 0
    ) -> Fail:
        if self.at is not None and self.at.books != "recorded":
            self.abandon()
        self.state = State.FAILED
        return Fail(self._error(cls, message, self.last if last == 0 else last))

    def _error(self, cls: type[StreamError], message: str, last: Failure | None) -> StreamError:
        self.log.warning("streamres.failed", model=self.model, reason=last.kind if last else None)
        return cls(
            self.redactor.redact(message),
            partial_text=self.text,
            history=tuple(self.history),
            model=self.model,
            status_code=last.status_code if last else None,
            reason=last.kind if last else None,
        )

    def _missed(self, at: AttemptState) -> Failure:
        """The instruct continuation wrote none of what its request held back: nothing of it
        is joined; it is asked again at once with the whole answer so far, in the other
        wording (the model is well: the failure is never charged to it). The model is
        remembered: it does not continue what it is shown, so its requests are sent whole
        from now on (one extra request per model and process, at most)."""
        self.memory.no_hold.add((at.route.base_url, at.route.model))
        self.seam_tries += 1
        return failure(
            "ended_at_seam", "the continuation did not pick the answer up where it stopped"
        )

    def _ended_at_seam(self, at: AttemptState, added: int) -> bool:
        """An instruct continuation that finished normally having added nothing of substance:
        a restart no longer than what was delivered, a bare preamble, an empty turn. Not a
        finished answer, even when the delivered text ends a sentence — measured on a real
        instruct model, that is mostly a restart that stopped after the sentences it had
        already given (a prefill continuation that adds nothing is the model saying it is
        done, and is believed)."""
        dedup, decoder = at.dedup, at.decoder
        if dedup is None or dedup.mode != "instruct" or decoder is None or self.d.tool_calls:
            return False
        if decoder.finish_reason not in (None, "stop", "end_turn"):
            return False  # "length": the budget ended it, which the done event says
        new = self.text[len(self.text) - added :] if added else ""
        return not new.strip()

    def _header_wait(self, route: Route) -> float:
        """How long this attempt waits for response headers: with another model to go to,
        the route's (or the answer's) header bound — a server that accepts and sends nothing
        is left for the next model then (policy rule 6); alone, the first-output wait."""
        wait = self.stall.limit()
        if self.has_fallback:
            wait = min(wait, route.header_timeout or self.opts.header_timeout)
        return wait

    def _replaying(self) -> bool:
        return self.replay is not None and self.replay[0] == self.index

    def _strategy(self) -> Strategy | Literal["replay"]:
        if self._replaying():
            return "replay"
        return request.strategy(self.route, self.memory, self.opts.extra_body)


#: The steps a fact resumes (``states.TABLE`` names them).
_RESUME: dict[Step, Callable[[Answer, float], Action]] = {
    "choose": Answer._choose,
    "woke_from_busy": Answer._woke_from_busy,
    "slot": Answer._slot,
    "request": Answer._request,
    "account": Answer._account,
    "done": Answer._close,
}
