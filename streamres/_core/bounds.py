"""How much one stream may make streamres hold, whatever the server sends.

A hostile or broken upstream can send ``data:`` lines that never end their event, one line of
hundreds of megabytes, or a small gzip body that inflates to gigabytes. Each is bounded here;
past a bound the attempt fails as ``malformed`` (what was delivered is kept) and the answer
resumes. The defaults sit far above anything a real LLM stream sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamres._core.inflate import MAX_INFLATE
from streamres._core.sse import MAX_EVENT, MAX_LINE

__all__ = ["ReadLimits"]


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds on what one response may make streamres hold (bytes).

    >>> ReadLimits(line=1 << 20)
    ReadLimits(line=1048576, event=8388608, inflate=16777216)
    """

    #: One event-stream line.
    line: int = MAX_LINE
    #: The data of one event (its ``data:`` lines together).
    event: int = MAX_EVENT
    #: What one network read of a compressed body may expand to.
    inflate: int = MAX_INFLATE

    def __post_init__(self) -> None:
        for name in ("line", "event", "inflate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
                raise ValueError(f"ReadLimits.{name} must be an integer >= 1024, not {value!r}")
