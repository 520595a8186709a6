"""Load balancing state: gradual weights and the retry budget. Pure, time passed in.

Weights (seed 5.4): zeroing a model after one failure sent all traffic to the other and took
that one down too. So each failure multiplies a model's weight by ``penalty`` (0.7), each
success moves it a quarter of the way back to its base, and it never drops below ``floor``
times its base: a jammed model keeps a trickle of traffic and can prove it recovered.

Retry budget (no retry storms): a token bucket. Every first attempt deposits ``ratio`` tokens
(0.2: retries may add at most 20 % to the first attempts), a ``floor`` rate (1 token/s) keeps a
quiet client able to retry at all. The balance is capped, and the cap grows with the traffic
that funds it, as gRPC's and Finagle's budgets do: it is ``cap`` (10) or ``ratio`` times the
first attempts of about the last ``window`` seconds (10; a count that decays exponentially),
whichever is more. So a burst of 2,000 first attempts banks the 400 retries it paid for, where
a fixed cap kept 10, while a long calm period still cannot bank a storm, and retries still add
at most ``ratio`` to the first attempts (plus ``floor`` a second). A retry spends one token;
with none left, it waits for the next one.
Waiting is a queue: :meth:`RetryBudget.reserve` takes the next token even before it exists (the
balance goes below zero) and says when it will be there, so each waiting retry sleeps once, in
the order it asked, instead of every waiter waking to compete for each new token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RetryBudget", "Weight"]


@dataclass
class Weight:
    base: float = 1.0
    penalty: float = 0.7
    restore: float = 0.25
    floor: float = 0.05
    current: float = -1.0

    def __post_init__(self) -> None:
        if self.base <= 0:
            raise ValueError(f"a route's weight must be positive, not {self.base}")
        if self.current < 0:
            self.current = self.base

    def failure(self) -> float:
        self.current = max(self.base * self.floor, self.current * self.penalty)
        return self.current

    def success(self) -> float:
        self.current = min(self.base, self.current + (self.base - self.current) * self.restore)
        return self.current


@dataclass
class RetryBudget:
    ratio: float = 0.2
    floor: float = 1.0
    cap: float = 10.0
    balance: float = 10.0
    updated: float | None = None
    #: Seconds over which first attempts count towards the cap (the decay's time constant).
    window: float = 10.0
    #: First attempts of about the last ``window`` seconds (decayed).
    recent: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ratio", "floor", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"RetryBudget.{name} must be a number >= 0, not {value!r}")
        if not self.window > 0:
            raise ValueError(
                f"RetryBudget.window must be a number of seconds > 0, not {self.window!r}"
            )

    @property
    def limit(self) -> float:
        """The balance's cap now: ``cap``, or what the recent first attempts paid for."""
        return max(self.cap, self.ratio * self.recent)

    def _refill(self, now: float) -> None:
        if self.updated is not None and now > self.updated:
            elapsed = now - self.updated
            self.recent *= math.exp(-elapsed / self.window)
            self.balance = min(self.limit, self.balance + elapsed * self.floor)
        self.updated = now if self.updated is None else max(self.updated, now)

    def deposit(self, now: float, attempts: int = 1) -> None:
        """First attempts were made."""
        self._refill(now)
        self.recent += attempts
        self.balance = min(self.limit, self.balance + self.ratio * attempts)

    def wait(self, now: float) -> float:
        """Seconds until a retry may go (0 when a token is there)."""
        self._refill(now)
        if self.balance >= 1.0:
            return 0.0
        if self.floor <= 0:
            return float("inf")
        return (1.0 - self.balance) / self.floor

    def reserve(self, now: float) -> float:
        """Take the next token for a retry: seconds until it is there (0: now). The caller
        waits that long, or :meth:`refund` s the token if it will not retry after all."""
        self._refill(now)
        self.balance -= 1.0
        if self.balance >= 0.0:
            return 0.0
        if self.floor <= 0:
            return float("inf")
        return -self.balance / self.floor

    def refund(self) -> None:
        """Give back a token taken by :meth:`reserve` and not used."""
        self.balance = min(self.limit, self.balance + 1.0)

    def withdraw(self, now: float) -> bool:
        """Spend a token for a retry; False when there is none."""
        self._refill(now)
        if self.balance < 1.0:
            return False
        self.balance -= 1.0
        return True
