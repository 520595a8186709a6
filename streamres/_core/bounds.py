"""How much one stream may make streamres hold, whatever the server sends.

A hostile or broken upstream can send ``data:`` lines that never end their event, one line of
hundreds of megabytes, or a small gzip body that inflates to gigabytes. Each is bounded here;
past a bound the attempt fails as ``malformed`` (what was delivered is kept) and the answer
resumes. A stream that never ends is bounded too: one answer delivers at most ``answer``
characters (text and reasoning together, tool-call arguments too), and at most
:data:`BYTES_PER_TOKEN` UTF-8 bytes per token of ``max_tokens`` (plus :data:`BYTES_SLACK`);
past either, the answer ends there with ``finish_reason="length"``, the partial kept, and the
upstream's stream is closed. The defaults sit far above anything a real LLM stream sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamres._core.inflate import MAX_INFLATE
from streamres._core.sse import MAX_EVENT, MAX_LINE

__all__ = ["ANSWER", "BYTES_PER_TOKEN", "BYTES_SLACK", "ReadLimits", "token_bytes"]

#: Characters one answer may deliver: about a million tokens of prose, far past any model's
#: output limit (the largest are near 128,000 tokens), and a few MiB held per stream.
ANSWER = 1 << 22

#: ``max_tokens`` counted as it streams, in UTF-8 bytes. Tokenizers give about 4 bytes per token
#: (3 for CJK, where a token is often one character); the server counts its own tokens and stops
#: itself, so this bound is for one that does not: twice that, so no honest answer is cut.
BYTES_PER_TOKEN = 8
#: Bytes allowed on top of ``max_tokens × BYTES_PER_TOKEN`` (a very small budget's headroom).
BYTES_SLACK = 256


def token_bytes(max_tokens: int | None) -> int | None:
    """The UTF-8 bytes an answer with ``max_tokens`` may deliver (``None``: no such bound)."""
    return None if max_tokens is None else max_tokens * BYTES_PER_TOKEN + BYTES_SLACK


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds on what one response may make streamres hold (bytes).

    >>> ReadLimits(line=1 << 20)
    ReadLimits(line=1048576, event=8388608, inflate=16777216, answer=4194304)
    """

    #: One event-stream line.
    line: int = MAX_LINE
    #: The data of one event (its ``data:`` lines together).
    event: int = MAX_EVENT
    #: What one network read of a compressed body may expand to.
    inflate: int = MAX_INFLATE
    #: Characters one answer may deliver (text, reasoning and tool-call arguments together).
    answer: int = ANSWER

    def __post_init__(self) -> None:
        for name in ("line", "event", "inflate", "answer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
                raise ValueError(f"ReadLimits.{name} must be an integer >= 1024, not {value!r}")
