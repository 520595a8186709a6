"""A circuit breaker per model: a small state machine with time passed in. Pure.

Theory of operation (seed 4.1: threshold 3, recovery 60 s)::

    state      event                                   next        notes
    ---------  --------------------------------------  ----------  -------------------------
    closed     success                                 closed      failure count reset
    closed     failure (count reaches threshold)       open        opened_at = now
    closed     failure (below threshold)               closed      count + 1
    open       try_acquire, now < opened_at + recovery open        refused
    open       try_acquire, recovery elapsed           half_open   this caller is the probe
    half_open  try_acquire while the probe is out      half_open   refused: one probe only
    half_open  probe succeeds                          closed
    half_open  probe fails                             open        opened_at = now
    any        neutral outcome (permanent error)       unchanged   a probe slot is released

Failures are what the upstream's health causes: capacity errors, rate limits, 5xx, drops,
stalls and truncations. A permanent error (bad request, auth) says nothing about the model's
health and is *neutral*; a truncated stream is never a success.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BreakerState", "CircuitBreaker"]

BreakerState = Literal["closed", "open", "half_open"]


@dataclass
class CircuitBreaker:
    threshold: int = 3
    recovery: float = 60.0
    state: BreakerState = "closed"
    failures: int = 0
    opened_at: float = 0.0
    probe_out: bool = False

    def try_acquire(self, now: float) -> bool:
        """May a request go to this model now? (In half-open, True for exactly one caller.)"""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now < self.opened_at + self.recovery:
                return False
            self.state = "half_open"
            self.probe_out = False
        if self.probe_out:
            return False
        self.probe_out = True
        return True

    def available_at(self, now: float) -> float:
        """Earliest time a request could be let through (``now`` if it can be now)."""
        if self.state == "open":
            return max(now, self.opened_at + self.recovery)
        if self.state == "half_open" and self.probe_out:
            return now + self.recovery  # unknown: the probe decides; check again later
        return now

    def record_success(self, now: float) -> BreakerState:
        self.failures = 0
        self.probe_out = False
        self.state = "closed"
        return self.state

    def record_failure(self, now: float) -> BreakerState:
        self.probe_out = False
        if self.state == "half_open":
            self.state, self.opened_at = "open", now
            return self.state
        self.failures += 1
        if self.state == "closed" and self.failures >= self.threshold:
            self.state, self.opened_at = "open", now
        return self.state

    def open_until(self, until: float) -> None:
        """Another process found this model failing (shared state): refuse it until
        ``until``, then probe as usual. A longer refusal already in place is kept."""
        if self.state == "open" and self.opened_at + self.recovery >= until:
            return
        if self.state == "half_open" and self.probe_out:
            return  # this process's own probe is deciding
        self.state, self.opened_at, self.probe_out = "open", until - self.recovery, False

    def record_neutral(self) -> None:
        """An outcome that says nothing about health (a permanent error): free the probe."""
        self.probe_out = False
