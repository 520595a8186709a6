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
from typing import Any, Literal

from streamres._answer.memory import Memory
from streamres._core.bounds import token_bytes
from streamres._core.dedup import Deduplicator
from streamres._core.events import ToolCall, Usage
from streamres._core.tokens import Counter, TokenLedger, count_long
from streamres._fleet.routes import Route

__all__ = ["JOINS", "Delivery"]

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
        #: The most doubtful join so far (an index into ``JOINS``).
        self.join = 0
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

    # -- the ledger --------------------------------------------------------------------------

    def tokens(self) -> int:
        """Delivered tokens (the encoding is loaded)."""
        if self.ledger is None:
            assert self.count is not None
            self.ledger = TokenLedger(self.count)
            self.ledger.add(self.text)
        return self.ledger.tokens

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        assert self.count is not None
        return count_long(self.count, text)

    def joined(self, dedup: Deduplicator, added: int, route: Route, memory: Memory) -> None:
        """Record how this continuation was joined onto the delivered text."""
        stats = dedup.stats
        if dedup.mode == "prefill":
            kind = "prefill"
            if stats.restarted:
                # The server answered a prefill by starting over: it ignores the partial turn
                # (llama-cpp-python's server). Instruct from now on.
                assert route.base_url is not None
                memory.prefill_refused.add((route.base_url, route.model))
                kind = "restart_removed"
        elif stats.diverged:
            kind = "diverged"
        elif stats.restarted:
            kind = "restart_removed"
        else:
            kind = "deduplicated"
        if added:  # a continuation that added nothing joined nothing
            self.join = max(self.join, JOINS.index(kind))

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
