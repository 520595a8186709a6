"""How late this process's event loop runs what is due. I/O shell.

A connect timer fires when its time is up *and the loop gets to it*; on a loop busy with
thousands of streams, the connect may have completed in the kernel long before, its completion
queued behind other work in the same turn as the timer — and the timer wins. The server then
takes the blame for this side's load (a breaker opened on a healthy server).

So a ``Client`` measures its loop: a task sleeps :data:`TICK` at a time and records how much
later than asked it woke (a decaying maximum, halving every :data:`HALF_LIFE` seconds) — and,
until it wakes, how far past its wake-up the loop already is: a timer that fires in the same
turn as the overdue watcher, and runs first, sees the block it is in. It
only measures: what the lateness means is the pure policy's (rule 9 of ``_core/policy``) — a
connect gets that lateness, twice over, on top of its timeout, and one that times out all the
same while the loop runs late is this side's failure (``client_busy``), not the server's.
"""

from __future__ import annotations

import math

import anyio

__all__ = ["HALF_LIFE", "TICK", "LoopLag"]

#: Seconds between two measurements.
TICK = 0.05
#: Seconds for a measured lateness to count half.
HALF_LIFE = 2.0


class LoopLag:
    """This event loop's recent lateness (seconds), kept by :meth:`watch`."""

    def __init__(self) -> None:
        self._late = 0.0
        self._at = 0.0
        self._due = math.inf

    def record(self, late: float, now: float) -> None:
        """The loop woke ``late`` seconds after it was due, at ``now``."""
        self._late = max(late, self.late(now))
        self._at = now

    def expect(self, due: float) -> None:
        """The watcher is due to wake at ``due``: until it does, the loop is as late as it is
        past that (a timer run in the same turn, before the watcher, sees it)."""
        self._due = due

    def late(self, now: float) -> float:
        """The recent lateness, decayed to ``now``, or the lateness of the watcher's own
        wake-up still to come, if more."""
        overdue = now - self._due
        if now <= self._at:
            return max(self._late, overdue)
        return max(self._late * math.exp2(-(now - self._at) / HALF_LIFE), overdue)

    async def watch(self) -> None:
        """Measure until cancelled."""
        while True:
            asked = anyio.current_time()
            self.expect(asked + TICK)
            await anyio.sleep(TICK)
            now = anyio.current_time()
            self.record(max(0.0, now - asked - TICK), now)
