"""The life of one answer, as a state machine. Pure: no I/O; time and randomness passed in.

Theory of operation
-------------------
An answer is a series of attempts, each a request to one model, until one finishes or the
answer gives up. :class:`Answer` decides everything about that series and performs nothing: in
the manner of h11's ``Connection``, the shell feeds it *facts* — "the response started (status,
headers)", "these bytes came", "the body ended", "the read timer fired", "the wait is over" —
each as a method call with the time, and every call returns the next *action* for the shell:

    Wait(until, probing)   sleep until ``until`` (or until a half-open probe's outcome)
    Acquire(route, until)  take a concurrency slot on a route and its account
    Reserve()              take a ticket from a retry budget shared between processes
    Load(model)            load the token encoding for ``model`` (off the event loop)
    Count(ledger)          count a long answer's tokens (off the event loop); ``counted``
    Send(request, ...)     open the HTTP stream; report ``started`` or ``send_failed``
    ReadBody(until)        read the start of a body that is not an event stream; ``body``
    READ                   read the next bytes before ``read_deadline``; ``data``, ``eof``,
                           ``timed_out`` or ``read_failed``
    Finish(drain)          the answer is complete; ``drain``: read the body's end for reuse
    Fail(error)            raise ``error`` (a :class:`~streamres.StreamError`)

Events for the caller (text, retries, fallbacks, done…) pile up in :attr:`Answer.events`
between facts; the shell hands them on before performing the action.

One attempt goes through these states::

    choose ──► turn ──► slot ──► request ──► send ──┬─► read ──► over ──► account ──┬─► done
      ▲   (breaker)  (cool-down,  (limits)          └─► body ──►  ▲                   │
      │               budget)                                      │ (failure)        │
      └──────────────────────────── decide: retry, resume, switch ◄─┘     give up ◄───┘

``choose`` asks each model's breaker (the current model first) and waits, when none will take
a request, for the earliest that will; ``turn`` waits out a shared cool-down and takes a ticket
from the retry budget; ``over`` records the outcome with the fleet (breaker, weight, metrics)
and settles the books; ``account`` counts tokens; a failure goes to the policy
(:func:`~streamres._core.policy.decide`), the single pure function that says what happens after any
failure. Every step that needs a token count first makes sure the encoding is loaded: it
returns ``Load`` and runs again when the shell reports ``loaded``; a long answer's count is
made the same way, off the event loop (``Count``, then ``counted``).

An answer is bounded whatever the server sends: past ``ReadLimits.answer`` characters, or
past ``max_tokens`` counted in UTF-8 bytes as it streams (``bounds.token_bytes``), what fits
is delivered and the answer ends there, complete, with ``finish_reason="length"``; the rest of
the stream is not read.

A resumed attempt's text goes through the de-duplicator, which records how it was joined
(``JOINS``: prefill, de-duplicated, restart removed, diverged; the done event reports the most
doubtful). An instruct continuation that ends normally having added nothing — a restart no
longer than what was delivered, a bare preamble — is not a finished answer: ``account`` turns
it into an ``ended_at_seam`` failure, asked again in the quoting wording and then of the next
model (``SEAM_TRIES``), after which the answer ends as it stands with ``join="ended_at_seam"``.
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
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamres._core.backoff import after_hint
from streamres._core.bounds import token_bytes
from streamres._core.classify import (
    Failure,
    classify_not_a_stream,
    classify_response,
    failure,
    is_event_stream,
)
from streamres._core.continuation import (
    Strategy,
    build_continuation,
    choose,
    continues_prefill,
)
from streamres._core.dedup import Deduplicator
from streamres._core.errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    InvalidRequest,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from streamres._core.events import (
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
from streamres._core.inflate import InflateError, Inflater
from streamres._core.logs import SILENT, Log
from streamres._core.options import Options
from streamres._core.policy import (
    connect_allowance,
    connect_timeout,
    decide,
    reinterpret,
    this_side_busy,
)
from streamres._core.redact import Redactor, redact_url, url_secrets
from streamres._core.sse import SSEDecoder
from streamres._core.stall import StallTimer
from streamres._core.tokens import ON_LOOP, Counter, TokenLedger, count_long, token_starts
from streamres._core.wording import (
    busy_message,
    fallback_message,
    plural,
    resume_message,
    retry_message,
)
from streamres._fleet.routes import Route
from streamres._providers import anthropic as _anthropic
from streamres._providers import openai as _openai
from streamres._providers import responses as _responses
from streamres._providers.wire import DECODE_ERRORS, HttpRequest, StreamDecoder

__all__ = [
    "READ",
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

# -- actions: what the machine asks the shell to do -----------------------------------------


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until ``until``; with ``probing``, wake early when a model's state changes."""

    until: float
    probing: bool = False


@dataclass(frozen=True, slots=True)
class Acquire:
    """Wait (until ``until`` at most) for a concurrency slot on ``route``; report ``acquired``."""

    route: Route
    until: float
    #: The answer's lane (``_core/lanes``): higher priorities get a free slot first.
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Reserve:
    """Take a ticket from the retry budget shared between processes; report ``reserved``."""


@dataclass(frozen=True, slots=True)
class Load:
    """Load the token encoding for ``model`` off the event loop; report ``loaded``."""

    model: str


@dataclass(frozen=True, slots=True)
class Count:
    """Count the text ``ledger`` holds off the event loop (``ledger.settle()`` in a worker
    thread); report ``counted``. Asked for a long answer only (``tokens.ON_LOOP``)."""

    ledger: TokenLedger


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``request``; wait for its headers until ``until``, ``stall`` seconds once sent."""

    request: HttpRequest
    connect_timeout: float
    stall: float
    until: float
    #: This attempt is a half-open model's one probe: with shared state, the shell claims
    #: the probe for every process first (``probe_taken`` if another process has it).
    probe_route: Route | None = None


@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read the start of a body that is not an event stream, until ``until``; report ``body``."""

    until: float


class _Read:
    """Read the next bytes of the body before :attr:`Answer.read_deadline`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "READ"


READ = _Read()


@dataclass(frozen=True, slots=True)
class Finish:
    """The answer is complete. ``drain``: read the rest of the body (bounded) so the
    connection can be reused, after the done event is out."""

    drain: bool
    until: float


@dataclass(frozen=True, slots=True)
class Fail:
    """Raise ``error``: the answer gives up."""

    error: StreamError


Action = Wait | Acquire | Reserve | Load | Count | Send | ReadBody | _Read | Finish | Fail


# -- what the machine is given ---------------------------------------------------------------


class Slots(Protocol):
    """Concurrency limits shared by a client's streams (acquiring is the shell's ``Acquire``)."""

    def release(self, route: Route) -> None: ...

    def notify(self) -> None: ...


@dataclass
class Memory:
    """What a process remembers about servers across answers."""

    #: (base_url, model) pairs whose server refused an assistant prefill: instruct from now on.
    prefill_refused: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    #: Base URLs that have answered (any HTTP response): they get the patient policy.
    reached: set[str | None] = dataclasses.field(default_factory=set)
    #: Base URLs whose server showed it continues a final assistant message (``server:
    #: llama.cpp``): ``auto`` resumes them by prefill.
    continues: set[str | None] = dataclasses.field(default_factory=set)


#: How many times an instruct continuation that ended at the seam, adding nothing, is asked
#: again (in the other wording, or of the next model) before the answer ends as it stands.
SEAM_TRIES = 2

#: How each resume was joined, from the surest to the most doubtful: the done event reports
#: the most doubtful of the answer's resumes.
JOINS: tuple[str, ...] = (
    "none",
    "prefill",
    "deduplicated",
    "restart_removed",
    "diverged",
    "ended_at_seam",
)


#: The token encoding of a model if already loaded (never loads): ``(name, counter)``.
Encodings = Callable[[str], "tuple[str, Counter] | None"]

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
_GIVE_UP: dict[str, type[StreamError]] = {
    "rejected": RequestRejected,
    "attempts": AttemptsExhausted,
    "unreachable": UpstreamUnreachable,
}
#: Bytes of a body that is not an event stream kept to classify it.
ERROR_BODY_LIMIT = 64 * 1024
#: The longest the shell reads a complete body's end, for connection reuse.
DRAIN_SECONDS = 1.0


class _Attempt:
    """The state of the attempt in progress."""

    __slots__ = (
        "books",
        "calls",
        "chars_before",
        "decoder",
        "dedup",
        "eof",
        "fail",
        "first_content",
        "index",
        "inflater",
        "lingering",
        "number",
        "pieces",
        "reached",
        "request",
        "route",
        "slot",
        "sse",
        "started",
        "ticket",
        "tokens_before",
    )

    def __init__(self, number: int, index: int, route: Route) -> None:
        self.number = number
        self.index = index
        self.route = route
        # The breaker let this attempt through (in half-open: as the one probe). Until the
        # outcome is recorded, leaving by any path must give that back: "acquired" frees the
        # probe, "started" also takes the request off the in-flight count.
        self.books: Literal["acquired", "started", "recorded"] = "acquired"
        self.slot = False
        self.ticket = False  # a retry-budget ticket reserved, not yet used
        self.decoder: StreamDecoder | None = None
        self.dedup: Deduplicator | None = None
        self.sse: SSEDecoder | None = None
        self.inflater: Inflater | None = None
        self.request: HttpRequest | None = None
        self.fail: Failure | None = None
        self.started = 0.0
        self.first_content: float | None = None
        self.chars_before = 0
        self.tokens_before = 0
        #: Events that carried text: tokens, on a server that sends one per event.
        self.pieces = 0
        self.reached = False
        self.eof = False
        self.lingering = False
        self.calls: tuple[ToolCall, ...] = ()


class Answer:
    """One answer's decisions. See the module docstring for the protocol."""

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
        #: The one attempt's counts are owed (see :class:`~streamres.Usage`).
        self._owed = False
        #: Events for the caller, in order; the shell takes them after each fact.
        self.events: list[Event] = []
        #: When the read in progress must end (the deadline, the stall timer).
        self.read_deadline = 0.0
        self.parts: list[str] = []
        self.chars = 0
        #: Characters the answer may still deliver (``ReadLimits.answer``), and UTF-8 bytes
        #: (from ``max_tokens``, counted as it streams); which bound cut it, once one did.
        self.room = opts.read_limits.answer
        self.byte_room = token_bytes(opts.max_tokens)
        self.cut: Literal["", "characters", "max_tokens"] = ""
        self.ledger: TokenLedger | None = None
        self.encoding = ""
        self.count: Counter | None = None
        self.history: list[Attempt] = []
        self.failures = [0] * len(opts.chain)
        self.pos = 0
        self.attempts = 0
        self.resumes = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        #: Some attempt's output count is the ledger's estimate, not a server's report.
        self.estimated = False
        self.wasted = ""
        self.deduplicated = 0
        #: Instruct continuations that ended at the seam and were asked again.
        self.seam_tries = 0
        #: The most doubtful join so far (an index into ``JOINS``).
        self.join = 0
        #: The delivered answer's length in the *server's* tokens, while every attempt so far
        #: was on a server that sends one token per event (llama.cpp's) and joined exactly
        #: (prefill): the budget left after a resume is counted in these. ``None``: unknown,
        #: the ledger's encoding counts instead.
        self.server_tokens: int | None = 0
        self.thinking: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()
        #: Complete signed thinking blocks of the answer so far (sent back on resume).
        self.signed_thinking: list[dict[str, Any]] = []
        #: A background Responses API response to re-attach to: (route, id, last sequence).
        self.replay: tuple[int, str, int] | None = None
        self.start = now
        self.t_end = now + opts.deadline
        self.stall = StallTimer(fixed=opts.stall_timeout, first=opts.first_token_timeout)
        self.last: Failure | None = None  # the last attempt's failure
        self.at: _Attempt | None = None
        self._then: Callable[[float], Action] = self._choose
        self._status: tuple[int, Mapping[str, str]] = (0, {})
        self._ended_at = 0.0
        self._lingering = False
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
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    # -- facts: the shell's reports ----------------------------------------------------------

    def start_answer(self, now: float) -> Action:
        """The caller started iterating."""
        return self._choose(now)

    def woke(self, now: float) -> Action:
        """A ``Wait`` ended."""
        return self._then(now)

    def loaded(self, encoding: str, count: Counter, now: float) -> Action:
        """The encoding asked for with ``Load`` is ready."""
        self._loaded[self._loading] = (encoding, count)
        if self.count is None:
            self.encoding, self.count = encoding, count
        return self._then(now)

    def counted(self, now: float) -> Action:
        """The ``Count`` is done."""
        return self._then(now)

    def acquired(self, ok: bool, now: float, *, queued: float) -> Action:
        """The ``Acquire`` ended: a slot was taken (``ok``), or the time ran out."""
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
            return ReadBody(until=min(self.t_end, now + self.stall.limit()))
        self.stall.start(now)  # the stall timer starts with the headers
        self.read_deadline = min(self.t_end, self.stall.deadline())
        return READ

    def body(self, data: bytes, now: float, *, wall: float) -> Action:
        """The start of a body that is not an event stream (``wall``: the wall-clock time,
        for Retry-After dates)."""
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
        """Bytes of the event stream came. The per-token path: kept short."""
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
        if now >= self.t_end:
            return self._over(failure("deadline", "the deadline passed mid-stream"), now)
        if this_side_busy(self.stall.limit(), late):
            self.stall.wait_more(now)
            self.read_deadline = min(self.t_end, self.stall.deadline())
            self.log.debug("streamres.stall_waited", late=round(late, 3))
            return READ
        return self._over(failure("stall", f"no output for {self.stall.limit():.3g} s"), now)

    def read_failed(self, fail: Failure, now: float) -> Action:
        """A read raised (the connection broke)."""
        return self._over(fail, now)

    def probe_taken(self, now: float, *, until: float) -> Action:
        """Another process is probing this half-open model: this attempt is not made; the model
        is refused here until ``until`` (or until that probe's outcome arrives)."""
        at = self._attempt()
        self.fleet.not_sent(at.index, resume=bool(at.chars_before))
        at.books = "recorded"
        self.fleet.apply(at.index, "open", until)
        self.abandon()
        self.attempts -= 1
        return self._choose(now)

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

    # -- steps -------------------------------------------------------------------------------

    def _breaker_moved(self, route: Route, state: str | None) -> None:
        if state is not None:
            self.log.info(f"streamres.breaker_{state}", model=route.key)

    def _attempt(self) -> _Attempt:
        assert self.at is not None, "no attempt in progress"
        return self.at

    def _needs(self, step: Callable[[float], Action]) -> Load | Count | None:
        """Before a count of the delivered tokens: ``Load`` when the encoding is not here,
        ``Count`` when more text waits to be counted than is counted on the event loop (then
        ``step`` again)."""
        if self.count is None:
            got = self._encoding(self.model)
            if got is None:
                return self._load(self.model, step)
            self.encoding, self.count = got
        if self.ledger is None:
            self.ledger = TokenLedger(self.count)
            self.ledger.add(self.text)
        if self.ledger.pending > ON_LOOP:
            self._then = step
            return Count(self.ledger)
        return None

    def _encoding(self, model: str) -> tuple[str, Counter] | None:
        return self._loaded.get(model) or self.encodings(model)

    def _load(self, model: str, step: Callable[[float], Action]) -> Load:
        self._then, self._loading = step, model
        return Load(model)

    def _tokens(self) -> int:
        """Delivered tokens (the encoding is loaded: see :meth:`_needs`)."""
        if self.ledger is None:
            assert self.count is not None
            self.ledger = TokenLedger(self.count)
            self.ledger.add(self.text)
        return self.ledger.tokens

    def _count(self, text: str) -> int:
        if not text:
            return 0
        assert self.count is not None
        return count_long(self.count, text)

    def _fit(self, text: str) -> str:
        """What of ``text`` the answer's bounds let through (``ReadLimits.answer`` characters,
        ``max_tokens`` counted in UTF-8 bytes as it streams); past one, the answer is cut."""
        if self.cut:
            return ""
        if len(text) > self.room:
            text, self.cut = text[: self.room], "characters"
        if self.byte_room is not None:
            size = len(text) if text.isascii() else len(text.encode("utf-8"))
            if size > self.byte_room:
                text = text.encode("utf-8")[: self.byte_room].decode("utf-8", "ignore")
                size, self.cut = len(text.encode("utf-8")), "max_tokens"
            self.byte_room -= size
        self.room -= len(text)
        return text

    def _deliver(self, text: str) -> None:
        text = self._fit(text)
        if not text:
            return
        self.parts.append(text)
        self.chars += len(text)
        if self.ledger is not None:
            self.ledger.add(text)
        self.events.append(TextEvent(text))

    def _choose(self, now: float) -> Action:
        """Where the next attempt goes: a model whose circuit lets it through."""
        if self.chars and (load := self._needs(self._choose)):
            return load  # a fallback event says how many tokens were delivered
        if now >= self.t_end and self.last is not None:
            # A wait ran past the deadline (a busy loop wakes late): time, not the models.
            return self._fail(
                DeadlineExceeded, f"the deadline passed; the last attempt: {self.last.message}"
            )
        pos, ready_at = self._next_available(now)
        if pos is None:
            probing = self.slots is not None and self._probing()
            if ready_at >= self.t_end and not probing:
                return self._fail(DeadlineExceeded, self._unavailable(now))
            wait = max(0.0, min(ready_at, self.t_end) - now)
            capacity = self.last is None or self.last.kind in ("capacity", "rate_limit")
            self.events.append(
                RetryEvent(
                    message=busy_message(wait, probing=probing, capacity=capacity),
                    attempt=self.attempts + 1,
                    delay=wait,
                    reason="circuit_open",
                    model=self.model,
                )
            )
            self._then = self._woke_from_busy
            return Wait(now + wait, probing=probing)
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
                    tokens_so_far=self._tokens() if self.chars else 0,
                )
            )
        self.attempts += 1
        self.at = _Attempt(self.attempts, self.index, self.route)
        return self._turn(now)

    def _woke_from_busy(self, now: float) -> Action:
        if now >= self.t_end:
            return self._fail(DeadlineExceeded, self._unavailable(now))
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
            return Reserve()
        at.ticket = True
        return self._ticket(self.fleet.budget.reserve(now), now)

    def reserved(self, turn: float, now: float) -> Action:
        """The shared retry budget's answer to ``Reserve``: the ticket is this attempt's, and
        its turn comes ``turn`` seconds from now."""
        return self._ticket(turn, now)

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
            self._then = self._slot
            return Wait(now + wait)
        return self._slot(now)

    def _slot(self, now: float) -> Action:
        """A slot under the route's and the account's concurrency limits."""
        at = self._attempt()
        at.ticket = False  # the turn came: the ticket is used
        if self.slots is not None:
            return Acquire(at.route, self.t_end, self.opts.priority)
        return self._request(now)

    def _request(self, now: float) -> Action:
        """Build the next request (a continuation once text was delivered)."""
        if self.chars and (load := self._needs(self._request)):
            return load
        at = self._attempt()
        opts, route = self.opts, at.route
        assert route.base_url is not None
        build, decoder_cls = _PROVIDERS[route.provider]
        budget = opts.max_tokens
        if budget is None and route.provider == "anthropic":
            # The API requires max_tokens; the default bounds the whole answer, as it would
            # bound one uninterrupted stream.
            budget = _anthropic.DEFAULT_MAX_TOKENS
        messages, extra, dedup = opts.messages, opts.extra_body, None
        if self.replay is not None and self._replaying():
            # The server kept generating: re-attach and get exactly what was missed.
            _, response_id, after = self.replay
            req = _responses.replay_request(
                base_url=route.base_url,
                api_key=route.api_key,
                response_id=response_id,
                after=after,
                extra_headers=opts.headers,
            )
        else:
            if self.chars:
                if budget is not None:
                    budget -= self._tokens() if self.server_tokens is None else self.server_tokens
                strategy = self._strategy()
                assert strategy != "replay"
                cont = build_continuation(
                    opts.messages,
                    self.text,
                    strategy=strategy,
                    provider=route.provider,
                    thinking=self.signed_thinking,
                    wording=self.seam_tries,
                )
                messages, extra = cont.messages, {**opts.extra_body, **cont.extra_body}
                starts: list[int] = []
                if strategy == "instruct":
                    if self._encoding(route.model) is None:
                        return self._load(route.model, self._request)
                    # Token seams of the delivered text's end: where a model may restart (CJK).
                    starts = token_starts(route.model, self.text)
                dedup = Deduplicator(
                    self.text,
                    mode="instruct" if strategy == "instruct" else "prefill",
                    stripped=cont.stripped,
                    token_starts=starts,
                )
            if budget is not None and budget <= 0:
                self.abandon()  # no request: the attempt gives back its probe and slot
                return self._done("length", "", now)
            try:
                req = build(
                    base_url=route.base_url,
                    api_key=route.api_key,
                    model=route.model,
                    messages=messages,
                    max_tokens=budget,
                    extra_body=extra,
                    extra_headers=opts.headers,
                )
            except (TypeError, ValueError) as exc:
                return self._fail(InvalidRequest, f"cannot build the request: {exc}", last=None)
        decoder = decoder_cls()
        if isinstance(decoder, _responses.ResponsesDecoder):
            decoder.custom_tools = _responses.custom_tool_names(opts.extra_body)
        at.decoder, at.dedup, at.request = decoder, dedup, req
        at.sse = SSEDecoder(max_line=opts.read_limits.line, max_event=opts.read_limits.event)
        at.started = now
        self.stall.start(now)
        at.chars_before = self.chars
        at.tokens_before = self.ledger.tokens if self.ledger is not None else 0
        self.fleet.started(at.index, now, resume=bool(self.chars))
        at.books = "started"
        self.log.debug(
            "streamres.attempt_started",
            model=route.key,
            attempt=at.number,
            url=redact_url(req.url),
        )
        at.reached = route.base_url in self.memory.reached
        return Send(
            req,
            connect_timeout=connect_timeout(at.reached),
            stall=self.stall.limit(),
            until=self.t_end,
            probe_route=route if self.fleet.probing(at.index) else None,
        )

    def _decode(
        self,
        at: _Attempt,
        sse: SSEDecoder,
        decoder: StreamDecoder,
        events: list[tuple[str, bytes]],
        now: float,
    ) -> Action:
        """One read's SSE events through the provider's decoder, the de-duplicator and the
        stall timer, into events for the caller."""
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
        ending = decoder.error is not None or decoder.terminal or at.eof
        fail = None
        if ending:
            # Decided before the side channel is drained: whole tool calls may end a turn
            # that had no finish reason.
            fail = decoder.end_failure()
        if decoder.side or decoder.generating:
            self._side(at, decoder, now)
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
            if text:
                self._deliver(text)
        if at.calls:
            self.tool_calls = at.calls
            for call in at.calls:
                self.events.append(ToolCallEvent(call.id, call.name, call.arguments))
            at.calls = ()
        if ending:
            at.lingering = fail is None and not at.eof
            return self._over(fail, now)
        if self.cut:
            return self._cut_off(at, now)
        if now >= self.t_end:  # reads that never wait never meet the read timer
            return self._over(failure("deadline", "the deadline passed mid-stream"), now)
        self.read_deadline = min(self.t_end, self.stall.deadline())
        return READ

    def _cut_off(self, at: _Attempt, now: float) -> Action:
        """The answer reached a bound (``ReadLimits.answer``, ``max_tokens``): it ends here,
        complete with ``finish_reason="length"``; the rest of the stream is not read."""
        at.lingering = False
        bound = (
            f"max_tokens={self.opts.max_tokens}"
            if self.cut == "max_tokens"
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

    def _side(self, at: _Attempt, decoder: StreamDecoder, now: float) -> None:
        """Reasoning and tool calls: the model is working (the stall timer restarts).
        Reasoning comes before the text it leads to; tool calls end the turn, so they go
        after this read's text."""
        self.stall.output(now)
        decoder.generating = False
        for kind, value in decoder.side:
            if kind == "thinking":
                if value := self._fit(value):
                    self.thinking.append(value)
                    self.events.append(ThinkingEvent(value))
            else:
                at.calls = value
        decoder.side.clear()
        if decoder.calls and sum(c.size for c in decoder.calls.values()) > self.room:
            self.cut = "characters"  # tool-call arguments past the bound: no call is whole

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
        if self.chars - at.chars_before and not self.signed_thinking:
            # The signed blocks that led to the first text shown: sent back on resume.
            self.signed_thinking = list(decoder.signed_thinking)
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
        at = self._attempt()
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
                self._owed = True
            elif load := self._needs(self._account):
                return load
        if dedup is not None:
            self.wasted += dropped
            self.deduplicated += len(dedup.stats.dropped)
        wasted_tokens = self._count(dropped)
        if single:
            assert decoder.output_tokens is not None
            delivered = decoder.output_tokens
        elif self._owed:
            delivered = 0  # counted when first read
        else:
            delivered = (self._tokens() - at.tokens_before) if added else 0
        self.fleet.tokens(at.index, delivered=delivered, wasted=wasted_tokens)
        estimate = delivered + wasted_tokens if added or dropped else None
        reported = decoder.output_tokens
        estimated = reported is None and estimate is not None
        out = reported if reported is not None else estimate
        if self._owed:  # the server reported none; the answer's usage counts it when read
            out, estimated = None, False
        if decoder.input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + decoder.input_tokens
        if out is not None:
            self.output_tokens = (self.output_tokens or 0) + out
        self.estimated = self.estimated or estimated
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
            self._joined(at, dedup, added)
        self._count_server_tokens(at, dedup)
        if fail is None and not self.cut and self._ended_at_seam(at, added):
            if self.seam_tries < SEAM_TRIES:
                self.seam_tries += 1
                fail = at.fail = failure(
                    "ended_at_seam",
                    "the continuation stopped at the seam without adding to the answer",
                )
            else:
                self.join = JOINS.index("ended_at_seam")
        self.at = None
        if fail is None:
            self.history.append(Attempt(at.number, at.route.model, "ok", **fields))
            self.failures[self.pos] = 0
            refusal = "".join(decoder.refusal)
            finish = "length" if self.cut else decoder.finish_reason or "stop"
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
        else:
            self.failures[self.pos] = 1 if added else self.failures[self.pos] + 1
        return self._decide(at, fail, now)

    def _decide(self, at: _Attempt, fail: Failure, now: float) -> Action:
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
        )
        tokens = self._tokens() if self.chars else 0
        route = at.route
        self.log.info(
            _LOG_EVENT[decision.action, bool(self.chars)],
            model=route.key,
            attempt=at.number,
            reason=fail.kind,
            status_code=fail.status_code,
            error=fail.message,
            chars=self.chars,
            delay=round(decision.delay, 3),
        )
        if decision.action == "give_up":
            cls = _GIVE_UP.get(decision.error, DeadlineExceeded)
            if cls is RequestRejected:
                message = f"{route.model} refused the request ({fail.message}); not retried"
            elif cls is UpstreamUnreachable:
                message = (
                    f"{decision.why}. Check that the server is running and reachable from "
                    "here, and that base_url (and provider) are right."
                )
            else:
                message = f"gave up after {plural(at.number, 'attempt')}: {decision.why}"
            return self._fail(cls, message)
        if self.chars:
            self.resumes += 1
        if decision.action == "switch":
            self.pos = decision.model_index
            self.fleet.fell_back(at.index, self.index)
            self.events.append(
                FallbackEvent(
                    message=fallback_message(
                        route.model, self.model, "unreachable" if fail.connect else fail.kind
                    ),
                    attempt=at.number + 1,
                    from_model=route.model,
                    to_model=self.model,
                    reason=fail.kind,
                    tokens_so_far=tokens,
                )
            )
        elif self.chars:
            self.events.append(
                ResumeEvent(
                    message=resume_message(fail, delay=decision.delay, tokens=tokens),
                    attempt=at.number + 1,
                    delay=decision.delay,
                    reason=fail.kind,
                    model=route.model,
                    strategy=self._strategy(),
                    tokens_so_far=tokens,
                    chars_so_far=self.chars,
                )
            )
        else:
            self.events.append(
                RetryEvent(
                    message=retry_message(
                        fail, delay=decision.delay, attempt=at.number + 1, cap=opts.max_attempts
                    ),
                    attempt=at.number + 1,
                    delay=decision.delay,
                    reason=fail.kind,
                    model=route.model,
                    status_code=fail.status_code,
                )
            )
        if decision.delay > 0:
            self._then = self._choose
            return Wait(now + decision.delay)
        return self._choose(now)

    def _done(self, finish_reason: str, refusal: str, now: float) -> Action:
        """The done event: the whole answer, its usage and history."""
        single = self.resumes == 0 and not self.estimated and self.ledger is None
        counted = not (single and self.output_tokens is not None) or self.wasted
        if (
            counted
            and not self._owed
            and (load := self._needs(lambda t: self._done(finish_reason, refusal, t)))
        ):
            return load
        if self._owed:
            usage = self._usage_owed()
        else:
            if single and self.output_tokens is not None:
                delivered = self.output_tokens  # the server's own count of this single attempt
            else:
                delivered = self._tokens()
            output = self.output_tokens
            if self.estimated and output is not None:
                output = max(output, delivered)  # never fewer than what reached the caller
            usage = Usage(
                input_tokens=self.input_tokens,
                output_tokens=output,
                estimated=self.estimated,
                delivered_tokens=delivered,
                wasted_tokens=self._count(self.wasted),
                encoding=self.encoding or "reported",
            )
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
                deduplicated_chars=self.deduplicated,
                elapsed=elapsed,
                tool_calls=self.tool_calls,
                thinking="".join(self.thinking),
                refusal=refusal,
                join=JOINS[self.join],  # type: ignore[arg-type]
            )
        )
        return Finish(drain=self._lingering, until=min(self.t_end, now + DRAIN_SECONDS))

    # -- helpers -----------------------------------------------------------------------------

    def _can_owe(self, at: _Attempt, fail: Failure | None, dropped: str) -> bool:
        """May this attempt's counts wait until someone reads them? Only for an answer that
        is one complete attempt whose server reported no output count, while no encoding is
        loaded yet: nothing on the answer's way needs a count, so none is made (loading the
        encoding costs more than a short answer)."""
        return (
            at.number == 1
            and fail is None
            and not dropped
            and self.load_now is not None
            and self.count is None
            and self._encoding(self.model) is None
        )

    def _usage_owed(self) -> Usage:
        load_now, model, text = self.load_now, self.model, self.text
        assert load_now is not None

        def later() -> tuple[str, int]:
            encoding, count = load_now(model)
            return encoding, count_long(count, text) if text else 0

        usage = Usage(input_tokens=self.input_tokens, estimated=True, later=later)
        self.fleet.tokens_later(self.index, usage)
        return usage

    def _fail(
        self, cls: type[StreamError], message: str, *, last: Failure | Literal[0] | None = 0
    ) -> Fail:
        if self.at is not None and self.at.books != "recorded":
            self.abandon()
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

    def _joined(self, at: _Attempt, dedup: Deduplicator, added: int) -> None:
        """Record how this continuation was joined onto the delivered text."""
        stats = dedup.stats
        if dedup.mode == "prefill":
            kind = "prefill"
            if stats.restarted:
                # The server answered a prefill by starting over: it ignores the partial turn
                # (llama-cpp-python's server). Instruct from now on.
                assert at.route.base_url is not None
                self.memory.prefill_refused.add((at.route.base_url, at.route.model))
                kind = "restart_removed"
        elif stats.diverged:
            kind = "diverged"
        elif stats.restarted:
            kind = "restart_removed"
        else:
            kind = "deduplicated"
        if added:  # a continuation that added nothing joined nothing
            self.join = max(self.join, JOINS.index(kind))

    def _count_server_tokens(self, at: _Attempt, dedup: Deduplicator | None) -> None:
        """Keep the answer's length in the server's own tokens while it can be known: every
        attempt on a server that sends one token per event (llama.cpp's server, which names
        itself) and every resume a prefill that dropped nothing (so each event received was
        delivered)."""
        if self.server_tokens is None:
            return
        exact = dedup is None or (dedup.mode == "prefill" and not dedup.stats.dropped)
        if at.route.base_url in self.memory.continues and exact:
            self.server_tokens += at.pieces
        else:
            self.server_tokens = None

    def _ended_at_seam(self, at: _Attempt, added: int) -> bool:
        """An instruct continuation that finished normally having added nothing of substance:
        a restart no longer than what was delivered, a bare preamble, an empty turn. Not a
        finished answer, even when the delivered text ends a sentence — measured on a real
        instruct model, that is mostly a restart that stopped after the sentences it had
        already given (a prefill continuation that adds nothing is the model saying it is
        done, and is believed)."""
        dedup, decoder = at.dedup, at.decoder
        if dedup is None or dedup.mode != "instruct" or decoder is None or self.tool_calls:
            return False
        if decoder.finish_reason not in (None, "stop", "end_turn"):
            return False  # "length": the budget ended it, which the done event says
        new = self.text[len(self.text) - added :] if added else ""
        return not new.strip()

    def _replaying(self) -> bool:
        return self.replay is not None and self.replay[0] == self.index

    def _strategy(self) -> Strategy | Literal["replay"]:
        if self._replaying():
            return "replay"
        route = self.route
        assert route.base_url is not None
        if (route.base_url, route.model) in self.memory.prefill_refused:
            return "instruct"
        return choose(
            route.provider,
            route.base_url,
            route.continuation,
            self.opts.extra_body,
            server_continues=route.base_url in self.memory.continues,
        )

    def _next_available(self, now: float) -> tuple[int | None, float]:
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
            self._breaker_moved(self.fleet.routes[i], after if after != before else None)
            if allowed:
                return pos, now
        return None, min(self.fleet.available_at(i, now) for i in self.opts.chain)

    def _probing(self) -> bool:
        """Is a half-open model's one probe in flight? (Its outcome may free the model soon.)"""
        return any(self.fleet.probing(i) for i in self.opts.chain)

    def _unavailable(self, now: float) -> str:
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
