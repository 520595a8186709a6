"""How late this process's event loop runs what is due. I/O shell.

A connect timer fires when its time is up *and the loop gets to it*; on a loop busy with
thousands of streams, the connect may have completed in the kernel long before, its completion
queued behind other work in the same turn as the timer — and the timer wins. The server then
takes the blame for this side's load (a breaker opened on a healthy server).

So a ``Client`` measures its loop: a task sleeps :data:`TICK` at a time and records how much
later than asked it woke (a decaying maximum, halving every :data:`HALF_LIFE` seconds). A
connect gets that lateness, twice over, on top of its timeout; and a connect that times out all
the same while the loop runs late (:meth:`LoopLag.busy`) is this side's failure
(``client_busy``), not the server's.
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

    def record(self, late: float, now: float) -> None:
        """The loop woke ``late`` seconds after it was due, at ``now``."""
        self._late = max(late, self.late(now))
        self._at = now

    def late(self, now: float) -> float:
        """The recent lateness, decayed to ``now``."""
        if now <= self._at:
            return self._late
        return self._late * math.exp2(-(now - self._at) / HALF_LIFE)

    def allowance(self, now: float) -> float:
        """Seconds to add to a connect timer started at ``now``."""
        return 2.0 * self.late(now)

    def busy(self, timeout: float, now: float) -> bool:
        """Did a connect timer of ``timeout`` seconds fire because of this side? True when the
        loop has been running at least half that late."""
        return self.late(now) >= timeout / 2

    async def watch(self) -> None:
        """Measure until cancelled."""
        while True:
            asked = anyio.current_time()
            await anyio.sleep(TICK)
            now = anyio.current_time()
            self.record(max(0.0, now - asked - TICK), now)
