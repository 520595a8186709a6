"""How many new connections to one server may be opening at once. Pure: outcomes are passed in.

Theory of operation. A burst of thousands of streams opened at once asks a server to accept
thousands of connections in the same instant: its accept queue overflows and the kernel drops
the SYNs it has no room for (the client sees a connect that takes a second or more, then times
out), and this process's own event loop, handling thousands of handshakes in one turn, runs so
late that connects which did complete are seen too late. Either way a healthy server looks
broken because of the client's own burst.

So each server (scheme, host, port) gets a **window** of connects in progress, as TCP's
congestion window bounds packets in flight: a stream that needs a new connection waits for room
(a connection kept alive needs none), and the connect timer starts when it gets it. The window
opens by one for each connect that completed quickly (``FAST`` seconds) and halves, never below
``FLOOR``, when one is refused or times out — the sign of a full accept queue — once per round:
connects that started before the last halving do not halve it again, so one overflow is
answered once, not once per dropped SYN. A connect that completed slowly moves nothing: it may
be the server's queue, or only this side's loop running late, which says nothing about the
server (on a machine starved of CPU a slow connect is the rule). Starting at ``START`` and never
above ``CEILING``, a quiet client never waits: its few connects fit at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CEILING", "FAST", "FLOOR", "START", "ConnectPace", "Outcome"]

#: Connects in progress a server starts with.
START = 64.0
#: Never fewer in progress than this, however many were refused.
FLOOR = 4.0
#: Never more than this: beyond it a burst only fills the server's accept queue faster.
CEILING = 512.0
#: A connect that completed within this opens the window by one; a slower one (a SYN dropped
#: and resent after a second, or only this side's loop running late) moves nothing.
FAST = 0.75

#: What became of a connect: it completed (in how many seconds is the caller's to say), it was
#: refused or timed out, or it tells nothing (cancelled).
Outcome = Literal["connected", "failed", "unknown"]


@dataclass(slots=True)
class ConnectPace:
    """One server's window of connects in progress."""

    window: float = START
    in_progress: int = 0
    #: Rounds of halving so far; a connect remembers the round it started in.
    round: int = 0
    #: Connects that waited for room, and the most that were ever in progress (for metrics).
    waited: int = 0
    most: int = 0

    def room(self) -> bool:
        """May another connect start now?"""
        return self.in_progress < int(self.window)

    def start(self) -> int:
        """A connect starts: the round it belongs to (give it back to :meth:`end`)."""
        self.in_progress += 1
        self.most = max(self.most, self.in_progress)
        return self.round

    def end(self, started_in: int, outcome: Outcome, seconds: float = 0.0) -> None:
        """The connect that started in round ``started_in`` ended after ``seconds``."""
        self.in_progress -= 1
        if outcome == "unknown":
            return
        if outcome == "connected":
            if seconds < FAST:
                self.window = min(CEILING, self.window + 1.0)
        elif started_in == self.round:  # the first sign of this overflow: halve, once
            self.window = max(FLOOR, self.window / 2.0)
            self.round += 1
