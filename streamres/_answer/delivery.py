"""What reached the caller, and its books: the text within the answer's bounds, reasoning and
tool calls, and the ledger that counts the tokens delivered, reported and wasted. Pure.

An answer is bounded whatever the server sends: past ``ReadLimits.answer`` characters, or past
``max_tokens`` counted in UTF-8 bytes as it streams (``bounds.token_bytes``), what fits is
delivered and the answer ends there, complete, with ``finish_reason="length"``.

A resumed attempt's text goes through the de-duplicator, which records how it was joined
(:data:`JOINS`: prefill, de-duplicated, restart removed, diverged; the done event reports the
most doubtful).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from streamres._core.bounds import token_bytes
from streamres._core.dedup import Deduplicator
from streamres._core.events import Join, ToolCall, Usage
from streamres._core.tokens import Counter, TokenLedger, count_long
from streamres._providers.wire import StreamDecoder

__all__ = ["JOINS", "Delivery", "Join", "Tally"]

#: The joins from the surest to the most doubtful: the done event reports the most doubtful
#: of the answer's resumes.
JOINS: tuple[Join, ...] = get_args(Join)


@dataclass(frozen=True, slots=True)
class Tally:
    """One attempt's tokens, as :meth:`Delivery.tally` counted them."""

    #: Tokens it delivered to the caller, and tokens of its text that were removed (repeats).
    delivered: int
    wasted: int
    #: Its output count: the server's report, else the estimate (``None``: owed, or nothing).
    output: int | None
    #: ``output`` is the ledger's estimate, not a server's report.
    estimated: bool


class Delivery:
    """The answer as the caller has it, and the counts the done event reports."""

    def __init__(self, answer_chars: int, max_tokens: int | None) -> None:
        self.parts: list[str] = []
        self.chars = 0
        #: Characters the answer may still deliver (``ReadLimits.answer``), and UTF-8 bytes
        #: (from ``max_tokens``, counted as it streams); which bound cut it, once one did.
        self.room = answer_chars
        self.byte_room = token_bytes(max_tokens)
        self.cut: Literal["", "characters", "max_tokens"] = ""
        self.thinking: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()
        #: Complete signed thinking blocks of the answer so far (sent back on resume).
        self.signed_thinking: list[dict[str, Any]] = []
        # -- the ledger --
        self.ledger: TokenLedger | None = None
        self.encoding = ""
        self.count: Counter | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        #: Some attempt's output count is the ledger's estimate, not a server's report.
        self.estimated = False
        #: The one attempt's counts are owed (see :class:`~streamres.Usage`).
        self.owed = False
        self.wasted = ""
        self.deduplicated = 0
        #: The most doubtful join so far.
        self.join: Join = "none"
        #: The delivered answer's length in the *server's* tokens, while every attempt so far
        #: was on a server that sends one token per event (llama.cpp's) and joined exactly
        #: (prefill): the budget left after a resume is counted in these. ``None``: unknown,
        #: the ledger's encoding counts instead.
        self.server_tokens: int | None = 0

    @property
    def text(self) -> str:
        """The answer delivered so far."""
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def fit(self, text: str) -> str:
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

    def add(self, text: str) -> str:
        """Deliver what of ``text`` fits; return it (empty: nothing more reaches the caller)."""
        text = self.fit(text)
        if text:
            self.parts.append(text)
            self.chars += len(text)
            if self.ledger is not None:
                self.ledger.add(text)
        return text

    def continued_from(self, text: str) -> None:
        """The caller has ``text`` of this answer already (``continue_from``): delivered, never
        sent again; its length in the server's tokens is unknown."""
        self.add(text)
        self.server_tokens = None

    def think(self, text: str) -> str:
        """Reasoning came: what of it fits the answer's bounds, kept; returned to be shown."""
        if text := self.fit(text):
            self.thinking.append(text)
        return text

    def call(self, calls: tuple[ToolCall, ...]) -> None:
        """The model's whole tool calls, the answer's."""
        self.tool_calls = calls

    def finish(self, decoder: StreamDecoder, *, repeats_dropped: bool) -> str:
        """Why the answer ended, as the last attempt's server said — ``length`` at a bound;
        a turn that ended for tool calls that were all a continuation's repeats of calls
        already run (``repeats_dropped``, none handed on) ends as ``stop``."""
        if self.cut:
            return "length"
        finish = decoder.finish_reason or "stop"
        repeats_only = repeats_dropped and not self.tool_calls
        return "stop" if finish == "tool_calls" and repeats_only else finish

    def calls_too_long(self) -> None:
        """Tool-call arguments past the answer's bound: no call is whole; the answer is cut."""
        self.cut = "characters"

    def keep_signed_thinking(self, blocks: list[dict[str, Any]]) -> None:
        """The signed thinking that led to the first text shown (sent back on resume)."""
        if not self.signed_thinking:
            self.signed_thinking = list(blocks)

    # -- the ledger --------------------------------------------------------------------------

    def have_encoding(self, encoding: str, count: Counter) -> None:
        """The token encoding is loaded (the first one loaded counts the answer)."""
        if self.count is None:
            self.encoding, self.count = encoding, count

    def ledger_of_text(self) -> TokenLedger:
        """The ledger of the delivered text (the encoding is loaded), made when first needed."""
        if self.ledger is None:
            assert self.count is not None
            self.ledger = TokenLedger(self.count)
            self.ledger.add(self.text)
        return self.ledger

    def owe(self) -> None:
        """The one attempt's counts wait until someone reads the usage."""
        self.owed = True

    def server_tokens_or_count(self) -> int:
        """The delivered answer's length in tokens: the server's own, where known."""
        return self.tokens() if self.server_tokens is None else self.server_tokens

    def tokens(self) -> int:
        """Delivered tokens (the encoding is loaded)."""
        return self.ledger_of_text().tokens

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        assert self.count is not None
        return count_long(self.count, text)

    def joined(self, dedup: Deduplicator, added: int) -> bool:
        """Record how this continuation was joined onto the delivered text; whether the server
        answered a prefill by starting over (it ignores the partial turn: llama-cpp-python's
        server), so it is asked by instruct from now on."""
        stats = dedup.stats
        restarted_prefill = dedup.mode == "prefill" and stats.restarted
        if dedup.mode == "prefill":
            kind: Join = "restart_removed" if stats.restarted else "prefill"
        elif stats.diverged:
            kind = "diverged"
        elif stats.restarted:
            kind = "restart_removed"
        else:
            kind = "deduplicated"
        if added:  # a continuation that added nothing joined nothing
            self.join_as(kind)
        return restarted_prefill

    def join_as(self, kind: Join) -> None:
        """A resume joined as ``kind``: the done event reports it if it is the most doubtful."""
        if JOINS.index(kind) > JOINS.index(self.join):
            self.join = kind

    def tally(
        self,
        *,
        added: int,
        dropped: str,
        dedup: Deduplicator | None,
        single: bool,
        reported: int | None,
        input_tokens: int | None,
        tokens_before: int,
    ) -> Tally:
        """Count an attempt that ended: it added ``added`` characters, and ``dropped`` of its
        text was removed (``single``: the answer's one complete attempt, counted by the
        server's ``reported`` output). The answer's usage adds it."""
        if dedup is not None:
            self.wasted += dropped
            self.deduplicated += len(dedup.stats.dropped)
        wasted = self.count_text(dropped)
        if single:
            assert reported is not None
            delivered = reported
        elif self.owed:
            delivered = 0  # counted when first read
        else:
            delivered = (self.tokens() - tokens_before) if added else 0
        estimate = delivered + wasted if added or dropped else None
        estimated = reported is None and estimate is not None
        out = reported if reported is not None else estimate
        if self.owed:  # the server reported none; the answer's usage counts it when read
            out, estimated = None, False
        if input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + input_tokens
        if out is not None:
            self.output_tokens = (self.output_tokens or 0) + out
        self.estimated = self.estimated or estimated
        return Tally(delivered, wasted, out, estimated)

    def count_server_tokens(
        self, dedup: Deduplicator | None, *, continues: bool, pieces: int
    ) -> None:
        """Keep the answer's length in the server's own tokens while it can be known: every
        attempt on a server that sends one token per event (llama.cpp's server, which names
        itself: ``continues``) and every resume a prefill that dropped nothing (so each event
        received was delivered)."""
        if self.server_tokens is None:
            return
        exact = dedup is None or (dedup.mode == "prefill" and not dedup.stats.dropped)
        if continues and exact:
            self.server_tokens += pieces
        else:
            self.server_tokens = None

    def usage(self, *, single: bool) -> Usage:
        """The answer's usage, counted now (``single``: one attempt, the server's count)."""
        if single and self.output_tokens is not None:
            delivered = self.output_tokens  # the server's own count of this single attempt
        else:
            delivered = self.tokens()
        output = self.output_tokens
        if self.estimated and output is not None:
            output = max(output, delivered)  # never fewer than what reached the caller
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=output,
            estimated=self.estimated,
            delivered_tokens=delivered,
            wasted_tokens=self.count_text(self.wasted),
            encoding=self.encoding or "reported",
        )

    def usage_owed(self, load_now: Callable[[str], tuple[str, Counter]], model: str) -> Usage:
        """The usage of an answer whose counts are owed: made when first read."""
        text = self.text

        def later() -> tuple[str, int]:
            encoding, count = load_now(model)
            return encoding, count_long(count, text) if text else 0

        return Usage(input_tokens=self.input_tokens, estimated=True, later=later)
