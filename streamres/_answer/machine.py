"""The life of one answer, as a state machine. Pure: no I/O; time and randomness passed in.

:class:`Answer` drives the table of ``states`` (whose docstring is the theory of operation):
each fact method moves the answer by the table (:meth:`Answer._go`, the one place its state
changes) and runs the step of the state it lands in; each step concludes an outcome, which
moves it on, until a state waits for the shell and its action is returned. The machine
orchestrates; what it works with owns its changes — the chain of models and each one's
failures (``chain``), the attempt in progress and its exchange (``attempt``), what reached
the caller and its books (``delivery``), the seam of a continuation (``seam``), a response to
re-attach to (``reattach``), what the process remembers of servers (``memory``), the next
request (``request``), the choice of a model (``choice``), one read's decoding (``reading``),
what a failure tells the caller (``telling``).

Whatever way the shell leaves (an error, the caller closing the stream), it calls
:meth:`Answer.abandon`, which gives back what the attempt in progress holds: a breaker's
half-open probe, an in-flight count, a concurrency slot, a budget ticket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Literal

from streamres._answer import choice, reading, request, telling, waits
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
from streamres._answer.chain import Chain
from streamres._answer.counting import Encodings, Loaded
from streamres._answer.delivery import Delivery
from streamres._answer.memory import Memory, Slots
from streamres._answer.options import Options
from streamres._answer.reading import ERROR_BODY_LIMIT
from streamres._answer.reattach import Reattach
from streamres._answer.seam import SEAM_TRIES, Seam
from streamres._answer.states import Event, ProtocolError, State, next_state
from streamres._answer.telling import Closing
from streamres._core.backoff import after_hint
from streamres._core.classify import (
    Failure,
    failure,
    is_event_stream,
)
from streamres._core.continuation import Strategy
from streamres._core.errors import (
    DeadlineExceeded,
    InvalidRequest,
    StreamError,
    UpstreamUnreachable,
)
from streamres._core.events import Attempt
from streamres._core.events import Event as CallerEvent
from streamres._core.inflate import InflateError
from streamres._core.logs import SILENT, Log
from streamres._core.policy import (
    blame_connect,
    connect_timeout,
    reinterpret,
)
from streamres._core.redact import Redactor, redact_url
from streamres._core.stall import StallTimer, request_kind
from streamres._core.tokens import Counter
from streamres._fleet.routes import Route
from streamres._providers.wire import HttpRequest

__all__ = [
    "ERROR_BODY_LIMIT",
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
        encodings: Loaded = lambda model: None,
        load_now: Callable[[str], tuple[str, Counter]] | None = None,
        secret_headers: Callable[[str], bool] = lambda name: False,
        shared_budget: bool = False,
        log: Log = SILENT,
        answer_id: str = "",
    ) -> None:
        self.opts = opts
        #: A random id the shell gives the answer: each Chat Completions attempt carries it
        #: (``X-Conversation-Id``, with its number) for a server that keeps its stream.
        self.answer_id = answer_id
        #: Where what happened is told (the shell's logger; by default, nowhere).
        self.log = log
        self.fleet = opts.fleet
        #: The retry budget is shared between processes: the shell asks it (``Reserve``).
        self.shared_budget = shared_budget
        self.slots = slots
        self.memory = memory if memory is not None else Memory()
        self.encodings = Encodings(encodings)
        #: Loads an encoding where it is called: for counts owed, made when first read.
        self.load_now = load_now
        #: Events for the caller, in order; the shell takes them after each fact.
        self.events: list[CallerEvent] = []
        #: When the read in progress must end (the deadline, the stall timer).
        self.read_deadline = 0.0
        #: What reached the caller, and its books.
        self.delivery = Delivery(opts.read_limits.answer, opts.max_tokens)
        if opts.continue_from:
            self.delivery.continued_from(opts.continue_from)
        self.history: list[Attempt] = []
        self.chain = Chain(self.fleet, opts.chain)
        self.resumes = 0
        self.seam = Seam()
        self.reattach = Reattach(background=bool(opts.extra_body.get("background")))
        self.start = now
        self.t_end = now + opts.deadline
        self.stall = StallTimer(fixed=opts.stall_timeout, first=opts.first_token_timeout)
        self.reader = reading.Reader(opts, self.delivery, self.stall, self.seam, self.memory, log)
        self.last: Failure | None = None  # the last attempt's failure
        self.attempt: AttemptState | None = None
        #: Where the answer is (``states.TABLE``); changed by :meth:`_go` alone.
        self.state = State.IDLE
        #: This wait for a model that will take the request was told to the caller.
        self._told_busy = False
        self._closing = Closing("stop")
        #: A whole answer's slot, given back once its body's end is read (see ``abandon``).
        self._slot_after_drain: Route | None = None
        #: Every secret this answer sends, masked in every message, history entry and log.
        self.secrets = frozenset(request.secrets(opts, secret_headers))
        self.redactor = Redactor(self.secrets)

    # -- what the answer is now --------------------------------------------------------------

    @property
    def route(self) -> Route:
        return self.chain.route

    @property
    def model(self) -> str:
        return self.chain.route.model

    @property
    def text(self) -> str:
        """The answer delivered so far."""
        return self.delivery.text

    @property
    def parts(self) -> list[str]:
        """The delivered text, in the pieces it came in (joined when read)."""
        return self.delivery.parts

    @property
    def chars(self) -> int:
        return self.delivery.chars

    def _go(self, event: Event) -> None:
        """Move the answer by the table: the one place its state changes."""
        self.state = next_state(self.state, event)

    # -- facts: the shell's reports ----------------------------------------------------------

    def start_answer(self, now: float) -> Action:
        """The caller started iterating."""
        self._go("start")
        return self._choose(now)

    def woke(self, now: float) -> Action:
        """A ``Wait`` ended."""
        self._go("woke")
        return self._resume(now)

    def loaded(self, encoding: str, count: Counter, now: float) -> Action:
        """The encoding asked for with ``Load`` is ready."""
        self._go("loaded")
        self.delivery.have_encoding(*self.encodings.arrived(encoding, count))
        return self._resume(now)

    def counted(self, now: float) -> Action:
        """The ``Count`` is done."""
        self._go("counted")
        return self._resume(now)

    def reserved(self, turn: float, now: float) -> Action:
        """The shared retry budget's answer to ``Reserve``: the ticket is this attempt's, and
        its turn comes ``turn`` seconds from now."""
        self._go("reserved")
        return self._ticket(turn, now)

    def acquired(self, ok: bool, now: float, *, queued: float) -> Action:
        """The ``Acquire`` ended: a slot was taken (``ok``), or the time ran out."""
        self._go("acquired")
        attempt = self._attempt()
        self.fleet.queued(attempt.index, queued)
        if not ok:
            return self._fail(
                DeadlineExceeded,
                f"no free slot on {attempt.route.model} (max_in_flight) before the deadline",
            )
        attempt.took_slot()
        return self._request(now)

    def send_failed(self, fail: Failure, now: float, *, queued: float, late: float = 0.0) -> Action:
        """No response headers: the connection, the deadline or the stall timer failed.
        ``late``: how late this process's event loop has been running (seconds), as the shell
        measured it — a connect that timed out meanwhile may be this side's (policy rule 9)."""
        self._go("send_failed")
        attempt = self._attempt()
        self.fleet.queued(attempt.index, queued)
        url = redact_url(attempt.route.base_url or "")
        return self._over(blame_connect(fail, reached=attempt.reached, late=late, url=url), now)

    def started(
        self, status: int, headers: Mapping[str, str], now: float, *, queued: float
    ) -> Action:
        """The response's headers came."""
        self._go("started")
        attempt = self._attempt()
        self.fleet.queued(attempt.index, queued)
        self.memory.answered(attempt.route, status, headers)
        try:
            attempt.head(status, headers, inflate_limit=self.opts.read_limits.inflate)
        except InflateError as exc:
            return self._ended(failure("malformed", str(exc)), now)
        if status >= 300 or not is_event_stream(headers):
            self._go("not_a_stream")
            return ReadBody(until=min(self.t_end, now + self.stall.limit()))
        self.stall.start(now)  # the stall timer starts with the headers
        self.read_deadline = min(self.t_end, self.stall.deadline())
        self._go("stream")
        return READ

    def body(self, data: bytes, now: float, *, wall: float) -> Action:
        """The start of a body that is not an event stream (``wall``: the wall-clock time,
        for Retry-After dates)."""
        self._go("body")
        return self._over(reading.classify_body(self._attempt().sent, data, wall=wall), now)

    def data(self, chunk: bytes, now: float) -> Action:
        """Bytes of the event stream came. The per-token path: kept short (READING → READING,
        checked by one comparison)."""
        if self.state is not State.READING:
            self._go("data")  # raises: no other state takes data
        attempt = self.attempt
        if attempt is None:
            raise ProtocolError("data came with no response being read")
        return self._read(self.reader.chunk(attempt, chunk, self.events, now), now)

    def eof(self, now: float) -> Action:
        """The body ended."""
        self._go("eof")
        return self._read(self.reader.eof(self._attempt(), self.events, now), now)

    def timed_out(self, now: float, *, late: float = 0.0) -> Action:
        """The read timer fired (``read_deadline`` passed). ``late``: how late this process's
        event loop has been running, as the shell measured it — a silence while it ran at
        least half the limit late may be this side's (policy rule 9): waited out again, not
        resumed (a new request would only add to the load that made it late)."""
        self._go("timed_out")
        if now >= self.t_end:
            return self._ended(failure("deadline", "the deadline passed mid-stream"), now)
        return self._read(self.reader.silence(self._attempt(), now, late=late), now)

    def read_failed(self, fail: Failure, now: float) -> Action:
        """A read raised (the connection broke)."""
        self._go("read_failed")
        return self._over(fail, now)

    def probe_taken(self, now: float, *, until: float) -> Action:
        """Another process is probing this half-open model: this attempt is not made; the model
        is refused here until ``until`` (or until that probe's outcome arrives)."""
        self._go("probe_taken")
        self._attempt().not_sent(self.fleet, until)
        self._give_back()
        return self._choose(now)

    # -- taken in any state ------------------------------------------------------------------

    def abandon(self) -> None:
        """The shell leaves (the answer ended, or before it did): give back what the attempt
        holds — and a whole answer's slot, held while its body's end was read."""
        route, self._slot_after_drain = self._slot_after_drain, None
        if route is not None and self.slots is not None:
            self.slots.release(route)
            self.slots.notify()
        attempt = self.attempt
        if attempt is not None and self.state in (State.SENDING, State.HEADERS, State.READING):
            exchange = attempt.sent
            keeps = self.memory.keeps_streams(attempt.route, exchange.headers)
            self.reattach.abandoned(exchange, attempt.index, keeps_streams=keeps)
        else:
            self.reattach.abandoned(None, 0, keeps_streams=False)
        self._give_back()

    def take_stops(self) -> list[HttpRequest]:
        """Requests that stop llama.cpp generations nobody will read (each given once): the
        shell sends them, bounded in time, their answers unread."""
        routes = self.fleet.routes
        return [
            request.stop_request(self.opts, routes[s.index], s) for s in self.reattach.take_stops()
        ]

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

    def _resume(self, now: float) -> Action:
        """Run the step of the state a wait, a load or a count moved the answer to."""
        step = _RESUMES.get(self.state)
        if step is None:
            raise ProtocolError(f"no step resumes in {self.state.value}")
        return step(self, now)

    def _choose(self, now: float) -> Action:
        """CHOOSE: where the next attempt goes — a model whose circuit lets it through."""
        if self.chars and (load := self._needs()):
            return load  # a fallback event says how many tokens were delivered
        if now >= self.t_end and self.last is not None:
            # A wait ran past the deadline (a busy loop wakes late): time, not the models.
            return self._fail(
                DeadlineExceeded, f"the deadline passed; the last attempt: {self.last.message}"
            )
        chain = self.chain
        pos, ready_at = choice.next_available(
            self.fleet, chain.indexes, chain.pos, self.t_end, now, self._breaker_moved
        )
        if pos is None:
            why = choice.unreachable(self.fleet, chain.indexes, self.memory)
            if why is not None:  # a wrong URL or port: told at once, every time
                wait = max(0.0, ready_at - now)
                return self._fail(UpstreamUnreachable, telling.unreachable(why, wait), wait=wait)
            probing = self.slots is not None and choice.probing(self.fleet, chain.indexes)
            if ready_at >= self.t_end and not probing:
                return self._fail(
                    DeadlineExceeded, choice.unavailable(self.fleet, chain.indexes, now)
                )
            wait = max(0.0, min(ready_at, self.t_end) - now)
            capacity = self.last is None or self.last.kind in ("capacity", "rate_limit")
            if not self._told_busy:  # woken early and still busy: said once is enough
                self._told_busy = True
                self.events.append(
                    telling.busy(
                        wait,
                        probing=probing,
                        capacity=capacity,
                        attempt=len(self.history) + 1,
                        model=self.model,
                    )
                )
            self._go("busy")
            # With a client's slots, the wait ends as soon as anything changes — a breaker
            # closing here or in another process, a probe's outcome, a slot freeing — and the
            # models are asked again, rather than sleeping to the earliest scheduled time.
            return Wait(now + wait, probing=self.slots is not None)
        self._told_busy = False
        if pos != chain.pos:
            left = chain.move_to(pos)
            tokens = self.delivery.tokens() if self.chars else 0
            self.events.append(
                telling.fallback(
                    left.model,
                    self.model,
                    "circuit_open",
                    "circuit_open",
                    attempt=len(self.history) + 1,
                    tokens=tokens,
                )
            )
        # Every attempt sent is in the history before the next is chosen: its number follows.
        self.attempt = AttemptState(len(self.history) + 1, chain.index, chain.route)
        self._go("chosen")
        return self._queue(now)

    def _rechoose(self, now: float) -> Action:
        """RECHOOSE: the wait for a model that will take the request ended."""
        if now >= self.t_end:
            return self._fail(
                DeadlineExceeded, choice.unavailable(self.fleet, self.chain.indexes, now)
            )
        self._go("go")
        return self._choose(now)

    def _queue(self, now: float) -> Action:
        """QUEUE: a ticket from the retry budget. The budget is a queue: a retry reserves the
        next token and sleeps once until it is there, rather than waking to compete for it. A
        budget shared between processes is asked by the shell (``Reserve``, then
        ``reserved``)."""
        attempt = self._attempt()
        turn = 0.0
        if attempt.number == 1:
            self.fleet.deposit(now)
        elif self.last is None or self.last.kind != "client_busy":
            # (A retry of this side's failure is not the budget's.)
            attempt.hold_ticket()
            if self.shared_budget:
                self._go("reserve")
                return Reserve()
            turn = self.fleet.reserve(now)
        self._go("go")
        return self._ticket(turn, now)

    def _ticket(self, turn: float, now: float) -> Action:
        """TICKET: wait out a shared cool-down (another stream got Retry-After) and the
        ticket's turn, ``turn`` seconds from now."""
        attempt = self._attempt()
        wait = self.fleet.cooldown_left(attempt.index, now)
        if wait > 0:
            wait = after_hint(wait, self.opts.rng.random())
        if turn > 0:
            self.log.info("streamres.retry_budget_spent", model=attempt.route.key, wait=turn)
        wait = max(wait, turn)
        if wait > 0:
            if now + wait >= self.t_end:
                return self._fail(
                    DeadlineExceeded,
                    f"{attempt.route.model} is cooling down or the retry budget is spent; "
                    "the next request would come after the deadline",
                )
            self._go("wait")
            return Wait(now + wait)
        self._go("go")
        return self._claim(now)

    def _claim(self, now: float) -> Action:
        """CLAIM: a slot under the route's and the account's concurrency limits."""
        attempt = self._attempt()
        attempt.claim()  # the turn came: the ticket is used
        if self.slots is not None:
            self._go("acquire")
            return Acquire(attempt.route, self.t_end, self.opts.priority)
        self._go("go")
        return self._request(now)

    def _request(self, now: float) -> Action:
        """REQUEST: build the next request (a continuation once text was delivered; CHOOSE
        made sure its tokens are counted)."""
        attempt = self._attempt()
        opts, route = self.opts, attempt.route
        self.reattach.going_to(attempt.index)
        replay = self.reattach.on(attempt.index)
        try:
            prepared = request.prepare(
                opts,
                route,
                replay=replay,
                delivery=self.delivery,
                memory=self.memory,
                seam=self.seam,
                encodings=self.encodings,
                conversation=(
                    f"{self.answer_id}-{attempt.number}" if self.answer_id and route.replay else ""
                ),
            )
        except (TypeError, ValueError) as exc:
            why = f"cannot build the request: {exc}"
            return self._fail(InvalidRequest, why, blame_last=False)
        if isinstance(prepared, Load):
            self._go("load")
            return prepared
        if prepared is None:  # the token budget is spent: no request
            self._give_back()  # the attempt gives back its probe and slot
            self._closing = Closing("length")
            self._go("spent")
            return self._close(now)
        req = prepared.request
        exchange = request.exchange(opts, route, req, prepared.dedup, replay)
        attempt.asked = request_kind(opts.extra_body, route.model, route.thinks)
        fallback = self.chain.has_fallback
        self.stall.first = waits.first_output(opts, self.fleet, attempt, fallback=fallback)
        self.reader.pace = waits.pace_watch(opts, self.fleet, attempt, fallback=fallback)
        self.stall.start(now)
        ledger = self.delivery.ledger
        attempt.send(
            exchange,
            now,
            chars=self.chars,
            tokens=ledger.tokens if ledger is not None else 0,
            reached=self.memory.has_reached(route),
        )
        self.fleet.started(attempt.index, now, resume=bool(self.chars))
        self.log.debug(
            "streamres.attempt_started",
            model=route.key,
            attempt=attempt.number,
            url=redact_url(req.url),
        )
        self._go("send")
        return Send(
            req,
            connect_timeout=connect_timeout(attempt.reached),
            stall=waits.header_wait(opts, route, self.stall.limit(), fallback=fallback),
            until=self.t_end,
            probe_route=route if self.fleet.probing(attempt.index) else None,
        )

    # -- reading -----------------------------------------------------------------------------

    def _read(self, ended: reading.Ended | None, now: float) -> Action:
        """After a read: the attempt ended with it, or the next read is due."""
        if ended is not None:
            return self._ended(ended.fail, now)
        if now >= self.t_end:  # reads that never wait never meet the read timer
            return self._ended(failure("deadline", "the deadline passed mid-stream"), now)
        self.read_deadline = min(self.t_end, self.stall.deadline())
        return READ

    def _ended(self, fail: Failure | None, now: float) -> Action:
        """The response read ended the attempt (``fail``: how; ``None``: complete)."""
        self._go("ended")
        return self._over(fail, now)

    # -- steps: the outcome ------------------------------------------------------------------

    def _over(self, fail: Failure | None, now: float) -> Action:
        """OVER: the attempt ended (``fail``: how, ``None`` for complete): its outcome goes to
        the fleet (breaker, weight, metrics) and its slot back."""
        attempt = self._attempt()
        exchange = attempt.sent
        dedup = exchange.dedup
        replayed = self.reattach.on(attempt.index) is not None
        if fail is not None:
            fail = reinterpret(
                fail,
                prefill_continuation=dedup is not None and dedup.mode == "prefill",
                replaying=replayed,
            )
            # Servers echo keys in error bodies: no secret goes further than here.
            fail = dataclasses.replace(fail, message=self.redactor.redact(fail.message))
        self.reattach.attempt_ended(
            exchange,
            attempt.index,
            fail,
            replayed=replayed,
            keeps_streams=self.memory.keeps_streams(attempt.route, exchange.headers),
            eof=attempt.eof,
        )
        fail = self.reader.finish(attempt, fail, self.events, now)
        self._slot_after_drain = attempt.report(self.fleet, self.slots, fail, now, self.log)
        attempt.end(fail, now)
        self._go("recorded")
        return self._account(now)

    def _account(self, now: float) -> Action:
        """ACCOUNT: count the attempt's tokens (reported, else the ledger's estimate), judge
        the seam, and record it in the history."""
        attempt, delivery = self._attempt(), self.delivery
        exchange = attempt.sent
        decoder, dedup, fail = exchange.decoder, exchange.dedup, attempt.fail
        added = self.chars - attempt.chars_before
        dropped = attempt.dropped()
        single = attempt.counted_by_server()
        if (added and not single) or dropped:
            if self._can_owe(attempt, dropped):
                delivery.owe()
            elif load := self._needs():
                return load
        tally = delivery.tally(
            added=added,
            dropped=dropped,
            dedup=dedup,
            single=single,
            reported=decoder.output_tokens,
            input_tokens=decoder.input_tokens,
            tokens_before=attempt.tokens_before,
        )
        self.fleet.tokens(attempt.index, delivered=tally.delivered, wasted=tally.wasted)
        if dedup is not None and delivery.joined(dedup, added):
            self.memory.refused_prefill(attempt.route)
        delivery.count_server_tokens(
            dedup, continues=self.memory.continues_at(attempt.route), pieces=attempt.pieces
        )
        finish = delivery.finish(decoder, repeats_dropped=self.seam.no_tools)
        if fail is None and not delivery.cut:
            new = self.text[len(self.text) - added :] if added else ""
            verdict = self.seam.judge(dedup, finish, new)
            if verdict == "ask_again":
                fail = Seam.ended()
            elif verdict == "as_it_stands":
                delivery.join_as("ended_at_seam")
        self.attempt = None
        self.history.append(
            attempt.record(
                fail,
                chars=added,
                input_tokens=decoder.input_tokens,
                output_tokens=tally.output,
                estimated=tally.estimated,
            )
        )
        if fail is None:
            self.chain.succeeded()
            refusal = "".join(decoder.refusal)
            self._closing = Closing(
                "refusal" if refusal else finish,
                refusal,
                drain=attempt.lingering,
                response_id=decoder.response_id or "",  # the response that finished it
            )
            self._go("finished")
            return self._close(now)
        self.last = fail
        if fail.kind == "prefill_rejected":
            self.memory.refused_prefill(attempt.route)
        if fail.connect and not attempt.reached:
            self.memory.could_not_reach(attempt.route, fail.message)
        self.chain.failed(fail.kind, added=bool(added), seam_tries=self.seam.tries)
        self._go("failed")
        return self._decide(attempt, fail, now)

    def _decide(self, attempt: AttemptState, fail: Failure, now: float) -> Action:
        """DECIDE: after a failure, retry, resume, switch or give up (the policy decides)."""
        chain, route = self.chain, attempt.route
        decision = chain.decide(
            fail,
            attempt=attempt.number,
            reached=attempt.reached,
            time_left=self.t_end - now,
            opts=self.opts,
            replay_at_hand=self.reattach.on(attempt.index) is not None,
        )
        telling.log_decision(
            self.log, decision, fail, route, attempt=attempt.number, chars=self.chars
        )
        tokens = self.delivery.tokens() if self.chars else 0
        if decision.action == "give_up":
            cls, why = telling.giving_up(decision, fail, route.model, attempt.number)
            return self._fail(cls, why, wait=choice.ready_in(self.fleet, chain.indexes, now))
        if self.chars:
            self.resumes += 1
        strategy = self._strategy() if self.chars else ""
        if decision.action == "switch":
            chain.move_to(decision.model_index)
        self.events.append(
            telling.after_failure(
                decision,
                fail,
                attempt=attempt.number,
                model=route.model,
                to_model=self.model,
                chars=self.chars,
                tokens=tokens,
                strategy=strategy,
                max_attempts=self.opts.max_attempts,
            )
        )
        if decision.delay > 0:
            self._go("backoff")
            return Wait(now + decision.delay)
        self._go("go")
        return self._choose(now)

    def _close(self, now: float) -> Action:
        """CLOSE: the done event — the whole answer, its usage and history."""
        delivery, closing = self.delivery, self._closing
        single = self.resumes == 0 and not delivery.estimated and delivery.ledger is None
        counted = not (single and delivery.output_tokens is not None) or delivery.wasted
        if counted and not delivery.owed and (load := self._needs()):
            return load
        if delivery.owed:
            assert self.load_now is not None
            usage = delivery.usage_owed(self.load_now, self.model)
            self.fleet.tokens_later(self.chain.index, usage)
        else:
            usage = delivery.usage(single=single)
        elapsed = now - self.start
        self.log.info(
            "streamres.done",
            model=self.model,
            attempts=len(self.history),
            resumes=self.resumes,
            chars=self.chars,
            finish_reason=closing.finish_reason,
            seconds=round(elapsed, 3),
        )
        self.attempt = None
        self.events.append(
            telling.done(delivery, closing, self.model, self.history, self.resumes, usage, elapsed)
        )
        self._go("finish")
        return Finish(drain=closing.drain, until=min(self.t_end, now + DRAIN_SECONDS))

    # -- helpers -----------------------------------------------------------------------------

    def _attempt(self) -> AttemptState:
        if self.attempt is None:
            raise ProtocolError(f"no attempt in progress while the answer is {self.state.value}")
        return self.attempt

    def _give_back(self) -> None:
        """The attempt in progress ends without an outcome: what it holds goes back."""
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            attempt.give_back(self.fleet, self.slots)

    def _breaker_moved(self, route: Route, state: str | None) -> None:
        if state is not None:
            self.log.info(f"streamres.breaker_{state}", model=route.key)

    def _needs(self) -> Load | Count | None:
        """Before a count of the delivered tokens, an encoding to load or a long text to
        count: the step waits in its loading state, and runs again."""
        load = self.encodings.needs(self.delivery, self.model)
        if load is not None:
            self._go("load")
        return load

    def _can_owe(self, attempt: AttemptState, dropped: str) -> bool:
        """May this attempt's counts wait until someone reads them? Only for an answer that
        is one complete attempt whose server reported no output count, while no encoding is
        loaded yet: nothing on the answer's way needs a count, so none is made (loading the
        encoding costs more than a short answer)."""
        return (
            attempt.number == 1
            and attempt.fail is None
            and not dropped
            and self.load_now is not None
            and self.delivery.count is None
            and self.encodings.get(self.model) is None
        )

    def _fail(
        self,
        cls: type[StreamError],
        message: str,
        *,
        blame_last: bool = True,
        wait: float | None = None,
    ) -> Fail:
        """The answer gives up with ``cls`` (the last attempt's failure in it, unless the
        error is the caller's: ``blame_last=False``; ``wait``: its ``retry_after``)."""
        if self.attempt is not None and self.attempt.books != "recorded":
            self._give_back()
        self._go("give_up")
        return Fail(self._error(cls, message, self.last if blame_last else None, wait))

    def _error(
        self, cls: type[StreamError], message: str, last: Failure | None, wait: float | None = None
    ) -> StreamError:
        self.log.warning("streamres.failed", model=self.model, reason=last.kind if last else None)
        words = self.redactor.redact(message)
        return telling.error(cls, words, last, self.text, self.history, self.model, wait)

    def _strategy(self) -> Strategy | Literal["replay"]:
        """How the next attempt resumes (for its resume event)."""
        if self.reattach.on(self.chain.index) is not None:
            return "replay"
        return self.memory.strategy(self.route, self.opts.extra_body)


#: The steps a wait, a load or a count resumes (the states those facts lead to).
_RESUMES: dict[State, Callable[[Answer, float], Action]] = {
    State.CHOOSE: Answer._choose,
    State.RECHOOSE: Answer._rechoose,
    State.CLAIM: Answer._claim,
    State.REQUEST: Answer._request,
    State.ACCOUNT: Answer._account,
    State.CLOSE: Answer._close,
}
