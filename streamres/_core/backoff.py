"""The wait before the next attempt: one formula, in one place.

    ceiling(n) = min(maximum, initial * multiplier ** (n - 1))     n = consecutive failures
    backoff(n) = uniform(0, ceiling(n))                             "full jitter"
    wait       = max(backoff(n), hint + uniform(0, 0.1 + 0.1 * hint))   when the server sent
                                                                    Retry-After / retry-after-ms

Why these defaults (initial 1 s, multiplier 3, maximum 30 s): a person is watching a chat
window, so the first retry should come within a second, yet the schedule must widen fast —
the seed's account was banned for retrying every 2 s. Ceilings run 1, 3, 9, 27, 30, 30 … s
(mean waits 0.5, 1.5, 4.5, 13.5, 15 s): about eight attempts in the default 120 s deadline.
The seed's batch schedule (5, 15, 45 s) is ``Backoff(initial=5, multiplier=3, maximum=45)``.

Full jitter spreads clients that failed together across the whole window, which is what breaks
up a thundering herd; a server's Retry-After is a *minimum*, so jitter there only goes up — many
clients told "retry in 2 s" must not all come back at 2.000 s.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff", "after_hint"]


def after_hint(hint: float, rand: float) -> float:
    """A server's wait hint plus positive jitter: never sooner, and not all at the same instant."""
    return hint + rand * (0.1 + 0.1 * hint)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter. Pure: the random draw is passed in.

    >>> Backoff().delay(3, rand=0.5)
    4.5
    """

    initial: float = 1.0
    multiplier: float = 3.0
    maximum: float = 30.0

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.multiplier >= 1 and self.maximum >= self.initial):
            raise ValueError(
                "Backoff needs initial > 0, multiplier >= 1 and maximum >= initial; "
                f"got initial={self.initial}, multiplier={self.multiplier}, "
                f"maximum={self.maximum}"
            )

    def ceiling(self, failures: int) -> float:
        """The upper bound of the wait after ``failures`` consecutive failures (>= 1)."""
        exponent = max(0, failures - 1)
        # Cap the exponent so huge failure counts cannot overflow a float.
        if exponent > 64:
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def delay(self, failures: int, *, rand: float, hint: float | None = None) -> float:
        """Seconds to wait; ``rand`` is a uniform draw from [0, 1)."""
        wait = self.ceiling(failures) * rand
        if hint is not None:
            wait = max(wait, after_hint(hint, rand))
        return wait
