"""The events a UI receives: frozen, slotted dataclasses with a ``type`` field.

Consume them with ``match ev.type`` (or ``match ev: case TextEvent(text=t)``). A stream is
zero or more ``text`` events interleaved with status events (``retry``, ``resume``,
``fallback``), and ends with exactly one ``done`` event — or a :class:`~streamres.StreamError`.
Status events all carry a one-line, human-readable ``.message`` a UI can show as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Attempt",
    "DoneEvent",
    "Event",
    "FallbackEvent",
    "Join",
    "ResumeEvent",
    "RetryEvent",
    "StatusEvent",
    "TextEvent",
    "ThinkingEvent",
    "ToolCall",
    "ToolCallEvent",
    "Usage",
]


class Usage:
    """Token usage, summed over every attempt of one answer — what a person can bill from.

    ``input_tokens`` is what the servers reported (``None`` when none did: unknown, not zero).
    ``output_tokens`` adds, per attempt, what its server reported or, for an attempt that
    reported nothing (broken attempts never do), the ledger's count of what it generated;
    ``estimated`` is true when any attempt's count is such an estimate, and then the total is
    never below ``delivered_tokens``. ``delivered_tokens`` counts the final answer with the
    token ledger; ``wasted_tokens`` the text generated again after a resume and dropped. Each
    attempt's own figures are in ``DoneEvent.history``.

    Counts the servers did not report are made when first read: an answer that needs none of
    them on its way (one attempt, no resume) never waits for the token encoding to load.
    Frozen, like the events.
    """

    __slots__ = (
        "_delivered_tokens",
        "_encoding",
        "_later",
        "_output_tokens",
        "_wasted_tokens",
        "estimated",
        "input_tokens",
    )

    input_tokens: int | None
    estimated: bool
    _output_tokens: int | None
    _delivered_tokens: int
    _wasted_tokens: int
    _encoding: str
    _later: Callable[[], tuple[str, int]] | None

    def __init__(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        delivered_tokens: int = 0,
        wasted_tokens: int = 0,
        encoding: str = "",
        estimated: bool = False,
        *,
        later: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "input_tokens", input_tokens)
        set_(self, "_output_tokens", output_tokens)
        set_(self, "_delivered_tokens", delivered_tokens)
        set_(self, "_wasted_tokens", wasted_tokens)
        set_(self, "_encoding", encoding)
        set_(self, "estimated", estimated)
        #: Counts owed: ``() -> (encoding, tokens delivered)``, the answer's one estimated
        #: attempt (output = delivered).
        set_(self, "_later", later)

    def _settle(self) -> None:
        later = self._later
        if later is not None:
            encoding, tokens = later()
            set_ = object.__setattr__
            set_(self, "_encoding", encoding)
            set_(self, "_delivered_tokens", tokens)
            set_(self, "_output_tokens", tokens)
            set_(self, "_later", None)

    @property
    def output_tokens(self) -> int | None:
        self._settle()
        return self._output_tokens

    @property
    def delivered_tokens(self) -> int:
        self._settle()
        return self._delivered_tokens

    @property
    def wasted_tokens(self) -> int:
        return self._wasted_tokens

    @property
    def encoding(self) -> str:
        """The tiktoken encoding used for the ledger, ``"approximate"``, or ``"reported"``."""
        self._settle()
        return self._encoding

    def _fields(self) -> tuple[object, ...]:
        return (
            self.input_tokens,
            self.output_tokens,
            self.delivered_tokens,
            self.wasted_tokens,
            self.encoding,
            self.estimated,
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Usage is frozen: cannot set {name}")

    def __reduce__(self) -> tuple[type[Usage], tuple[object, ...]]:
        # Copies, pickles and dataclasses.asdict(done) carry the counts (made now if owed).
        return (Usage, self._fields())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Usage):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        names = (
            "input_tokens",
            "output_tokens",
            "delivered_tokens",
            "wasted_tokens",
            "encoding",
            "estimated",
        )
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"Usage({shown})"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request made for an answer, and how it ended."""

    number: int
    model: str
    #: ``"ok"`` or a failure kind (``capacity``, ``stall``, ``truncated``…).
    outcome: str
    message: str = ""
    status_code: int | None = None
    #: Characters this attempt added to the answer.
    chars: int = 0
    seconds: float = 0.0
    #: For a resumed attempt: repeated characters removed, the most characters held back
    #: while deciding, and for how long.
    repeated_chars: int = 0
    held_chars: int = 0
    hold_seconds: float = 0.0
    #: Tokens as the server reported them for this attempt (``None``: not reported).
    input_tokens: int | None = None
    #: Output tokens: reported, or (``estimated``) counted by the ledger for a broken attempt.
    output_tokens: int | None = None
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class TextEvent:
    """The next piece of the answer. Never repeats text given before."""

    text: str
    type: Literal["text"] = field(default="text", init=False)


@dataclass(frozen=True, slots=True)
class ThinkingEvent:
    """Reasoning the model streams before (or between) its answer; never part of ``text``."""

    text: str
    type: Literal["thinking"] = field(default="thinking", init=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call: ``arguments`` is the whole JSON text, and it parses."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """A tool call the model made, reported only once its arguments arrived whole."""

    id: str
    name: str
    arguments: str
    type: Literal["tool_call"] = field(default="tool_call", init=False)


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """An attempt failed before any text of it was shown; the next one starts after ``delay``."""

    message: str
    attempt: int
    delay: float
    reason: str
    model: str
    status_code: int | None = None
    tokens_so_far: int = 0
    type: Literal["retry"] = field(default="retry", init=False)


@dataclass(frozen=True, slots=True)
class ResumeEvent:
    """The stream broke after text was shown; it continues from there after ``delay``."""

    message: str
    attempt: int
    delay: float
    reason: str
    model: str
    strategy: str
    tokens_so_far: int = 0
    chars_so_far: int = 0
    type: Literal["resume"] = field(default="resume", init=False)


@dataclass(frozen=True, slots=True)
class FallbackEvent:
    """The answer moves to another model (before or during the stream)."""

    message: str
    attempt: int
    from_model: str
    to_model: str
    reason: str
    tokens_so_far: int = 0
    type: Literal["fallback"] = field(default="fallback", init=False)


#: How an answer was joined across its resumes (``DoneEvent.join``), from the surest to the
#: most doubtful.
Join = Literal[
    "none",
    "prefill",
    "deduplicated",
    "restart_removed",
    "diverged",
    "calls_dropped",
    "ended_at_seam",
]


@dataclass(frozen=True, slots=True)
class DoneEvent:
    """The last event: the whole answer and how it was obtained."""

    text: str
    finish_reason: str
    model: str
    attempts: int
    resumes: int
    usage: Usage
    history: tuple[Attempt, ...] = ()
    #: Characters of repeated text the de-duplicator removed across resumes.
    deduplicated_chars: int = 0
    elapsed: float = 0.0
    #: The tool calls of the turn (complete and parseable), if the model made any.
    tool_calls: tuple[ToolCall, ...] = ()
    #: The reasoning text streamed as ``thinking`` events.
    thinking: str = ""
    #: What the model said instead of answering, when it refused (OpenAI's ``refusal``); the
    #: finish reason is then ``"refusal"``.
    refusal: str = ""
    #: ``"hit"``: answered from the cache (no request made); ``"semantic"``: answered from the
    #: cache for a question asked in other words (``cache_match``, ``cache_score``);
    #: ``"joined"``: shared the stream of an identical request already in flight; ``""``: this
    #: request's own stream.
    cache: Literal["", "hit", "semantic", "joined"] = ""
    #: For ``cache="semantic"``: the question whose answer this is, as it was asked.
    cache_match: str = ""
    #: For ``cache="semantic"``: its cosine similarity to this question (1.0: the same once
    #: case, width, spacing and punctuation are folded).
    cache_score: float = 0.0
    #: How the answer was joined across its resumes — the most doubtful of them: ``"none"``
    #: (never resumed), ``"prefill"`` (the server continued the same turn: exact),
    #: ``"deduplicated"`` (a new turn, its repeat of the delivered text removed),
    #: ``"restart_removed"`` (the model began the answer again; the repeat removed whole),
    #: ``"diverged"`` (a restart that drifted from the delivered text: joined at a word seam,
    #: worth a look), ``"calls_dropped"`` (a continuation called the last tool round again,
    #: the same names and arguments, and those calls were not handed on: a model that took
    #: "continue" for a new turn, or an agent polling on purpose — the two cannot be told
    #: apart, and running a round twice is the worse mistake), ``"ended_at_seam"`` (asked to
    #: continue, the model added nothing, again and again: the answer stops where the break
    #: left it, although the finish reason is ``stop`` — mid-sentence, or at a sentence end
    #: the model may or may not have meant as its last).
    join: Join = "none"
    #: The id the server gave the response that finished the answer: a Chat Completions
    #: chunk's ``id``, Anthropic's message id, the Responses API's response id (``""``: none
    #: came, or the answer came from the cache).
    response_id: str = ""
    type: Literal["done"] = field(default="done", init=False)

    @property
    def complete(self) -> bool:
        """False when the model stopped at a resume's seam without finishing the answer, or
        when calls a continuation made were not handed on (``join="calls_dropped"``)."""
        return self.join not in ("ended_at_seam", "calls_dropped")


StatusEvent = RetryEvent | ResumeEvent | FallbackEvent
Event = (
    TextEvent | ThinkingEvent | ToolCallEvent | RetryEvent | ResumeEvent | FallbackEvent | DoneEvent
)
