"""When a stream that is alive is too slow to wait on. Pure: times are passed in.

Theory of operation. The stall timer sees silence only: a provider that keeps the connection
up at one token a second, while the same model usually streams at a hundred, is waited on to
the deadline. A **pace floor** (opt-in: ``PaceFloor``) says how slow is too slow: a share of
the model's own learnt pace (``relative``: its median over its last successful answers, in
text events a second — a server sends about one token per event), and an absolute floor
(``absolute``), whichever is higher. An attempt is judged over a sliding ``window`` of seconds,
once a whole window has passed since its first output (so a slow start is the first-token
wait's to judge, not this). Below the floor, the attempt ends as ``slow``: with another model
to go to, the answer moves on to it at once, continued from what was delivered (policy rule
6), with the reason in its status event. A model alone is never judged (there is nowhere
better to go).

Judging costs one comparison per read, and one count every ``window / 4`` seconds at most.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LEARN_PACE_AFTER", "PaceFloor", "PaceWatch", "learnt_pace"]

#: Successful answers a model's pace is learnt from before a relative floor applies.
LEARN_PACE_AFTER = 5


@dataclass(frozen=True, slots=True)
class PaceFloor:
    """How slow a stream that is still producing may be before the answer moves on.

    ``relative``: a share of the model's learnt pace (0.25: a quarter of its usual speed);
    ``absolute``: text events (about tokens) a second; ``window``: the seconds a pace is
    judged over. Either floor may be ``None``; the higher one that applies is used.

    >>> PaceFloor(relative=0.25, absolute=2.0, window=10.0).floor(learnt=40.0)
    10.0
    """

    relative: float | None = 0.25
    absolute: float | None = None
    window: float = 10.0

    def __post_init__(self) -> None:
        for name in ("relative", "absolute"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ValueError(f"PaceFloor {name} must be None or positive, not {value!r}")
        if isinstance(self.window, bool) or not self.window > 0:
            raise ValueError(f"PaceFloor window must be positive seconds, not {self.window!r}")
        if self.relative is not None and self.relative >= 1:
            raise ValueError(
                f"PaceFloor relative is a share of the model's pace, below 1: {self.relative!r}"
            )

    def floor(self, learnt: float | None) -> float | None:
        """Events a second below which a stream is too slow (``learnt``: the model's pace)."""
        floors = [self.absolute] if self.absolute is not None else []
        if self.relative is not None and learnt is not None:
            floors.append(self.relative * learnt)
        return max(floors) if floors else None


def learnt_pace(samples: Sequence[float]) -> float | None:
    """A model's pace (events a second) from its last successful answers, once enough are
    known: their median."""
    return statistics.median(samples) if len(samples) >= LEARN_PACE_AFTER else None


@dataclass
class PaceWatch:
    """One attempt's pace, against ``floor`` events a second over ``window`` seconds."""

    floor: float
    window: float
    _reads: deque[tuple[float, int]] = field(default_factory=deque)
    _count: int = 0
    _first: float | None = None
    _next: float = 0.0

    def output(self, now: float, pieces: int) -> float | None:
        """``pieces`` text events came: the pace over the last window when it is below the
        floor (the attempt is too slow), else ``None``."""
        if self._first is None:
            self._first = now
            self._next = now + self.window
        self._reads.append((now, pieces))
        self._count += pieces
        if now < self._next:
            return None
        self._next = now + self.window / 4
        start = now - self.window
        while self._reads and self._reads[0][0] < start:
            self._count -= self._reads.popleft()[1]
        rate = self._count / self.window
        return rate if rate < self.floor else None
