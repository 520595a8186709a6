"""What every provider module provides: a request description and a stream decoder.

A decoder turns one SSE event of its provider into the answer's next text (often ``""``) and
keeps the few facts the retry loop needs as attributes: the finish reason, whether the
terminal event came, an in-band error, and reported usage. Attributes rather than an event
object per SSE event, because this runs once per token and allocation is the hot path's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._classify import Failure, failure

__all__ = ["HttpRequest", "StreamDecoder", "normalise_finish"]


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One streaming POST, ready for any HTTP client."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)


_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "pause",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}


def normalise_finish(reason: str) -> str:
    """Provider stop reasons in OpenAI's words: ``stop``, ``length``, ``tool_calls``…"""
    return _FINISH.get(reason, reason)


class StreamDecoder:
    """Base for the per-provider decoders (see ``_openai`` and ``_anthropic``)."""

    __slots__ = ("error", "finish_reason", "input_tokens", "output_tokens", "terminal")

    def __init__(self) -> None:
        #: Normalised finish reason, once the model said it finished.
        self.finish_reason: str | None = None
        #: The protocol's terminal event arrived (``[DONE]``, ``message_stop``).
        self.terminal = False
        #: An error the stream reported in-band, or a malformed chunk.
        self.error: Failure | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def feed(self, name: str, data: bytes) -> str:
        """One SSE event -> the text it adds to the answer (``""`` for none)."""
        raise NotImplementedError

    def end_failure(self) -> Failure | None:
        """At the end of the body: ``None`` if the answer is complete, else why not."""
        if self.error is not None:
            return self.error
        if self.finish_reason is not None:
            return None
        if self.terminal:
            return failure(
                "truncated", "the stream sent its terminator without a finish reason (cut short)"
            )
        return failure("truncated", "the stream ended without its terminal event")

    def _malformed(self, data: bytes) -> str:
        shown = data[:80].decode("utf-8", "replace")
        self.error = failure("malformed", f"unparsable chunk from the server: {shown!r}")
        return ""
