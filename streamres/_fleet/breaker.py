"""A circuit breaker per model: a small state machine with time passed in. Pure.

Theory of operation (seed 4.1: threshold 3, recovery 60 s)::

    state      event                                   next        notes
    ---------  --------------------------------------  ----------  -------------------------
    closed     success                                 closed      failure count reset
    closed     failure, ``tripped``                    open        opened_at = now
    closed     failure, not ``tripped``                closed      count + 1
    open       try_acquire, now < opened_at + recovery open        refused
    open       try_acquire, recovery elapsed           half_open   this caller is the probe
    half_open  try_acquire while the probe is out      half_open   refused: one probe only
    half_open  probe succeeds                          closed
    half_open  probe fails                             open        opened_at = now
    any        neutral outcome (permanent error)       unchanged   a probe slot is released

``tripped``: ``threshold`` consecutive failures — and, once the model has seen enough traffic
to judge by (``volume`` attempts in about the last ``memory`` seconds, a decayed count), a
failure *rate* of at least ``rate`` over about the last ``window`` seconds too. The volume is
remembered longer than the rate: at the tail of a burst of thousands, a dozen streams are left,
and three failures in a row among them say no more about the model than they did mid-burst.
Attempts are counted as they start (``record_start``), not as they end: a thousand streams just
sent are a thousand outcomes to come, and the first outcomes of a burst are its fastest —
refused connections — which would otherwise look like the whole of it. One stream at a time,
the seed's rule holds as it is: three failures in a row open the circuit. A thousand streams at
once on a model that fails one answer in five see three failures in a row every second, though
four answers in five succeed; the rate keeps that model's circuit closed (as Hystrix's volume
threshold and resilience4j's failure-rate window do), while a model that fails most of its
answers still opens within a few failures.

Failures are what the upstream's health causes: capacity errors, rate limits, 5xx, drops,
stalls and truncations. A permanent error (bad request, auth) says nothing about the model's
health and is *neutral*; a truncated stream is never a success.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["BreakerState", "CircuitBreaker"]

BreakerState = Literal["closed", "open", "half_open"]


@dataclass
class CircuitBreaker:
    threshold: int = 3
    recovery: float = 60.0
    #: The failure share, over the window, that opens a busy model's circuit.
    rate: float = 0.5
    #: Attempts in about the last ``memory`` seconds from which the rate is judged too (below
    #: it, failures in a row decide alone).
    volume: float = 20.0
    #: Seconds the rate's attempts and outcomes are remembered over (the decay's time constant).
    window: float = 10.0
    #: Seconds the volume is remembered over.
    memory: float = 60.0
    state: BreakerState = "closed"
    failures: int = 0
    opened_at: float = 0.0
    probe_out: bool = False
    #: Attempts and outcomes of about the last ``window`` seconds (decayed), attempts of about
    #: the last ``memory`` seconds (``remembered``), and when they were last aged.
    recent_started: float = 0.0
    recent_ok: float = 0.0
    recent_failed: float = 0.0
    remembered: float = 0.0
    aged_at: float = 0.0

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

    def record_start(self, now: float) -> None:
        """An attempt went to this model (the window's count of traffic)."""
        self._age(now)
        self.recent_started += 1.0
        self.remembered += 1.0

    def failure_rate(self, now: float) -> float | None:
        """The share of failures over the window, or ``None`` below ``volume`` attempts
        (remembered over ``memory``)."""
        self._age(now)
        seen = max(self.recent_started, self.recent_ok + self.recent_failed)
        if max(self.remembered, seen) < self.volume:
            return None
        return min(1.0, self.recent_failed / seen) if seen else None

    def record_success(self, now: float) -> BreakerState:
        self._age(now)
        self.recent_ok += 1.0
        self.failures = 0
        self.probe_out = False
        self.state = "closed"
        return self.state

    def record_failure(self, now: float) -> BreakerState:
        self._age(now)
        self.recent_failed += 1.0
        self.probe_out = False
        if self.state == "half_open":
            self.state, self.opened_at = "open", now
            return self.state
        self.failures += 1
        if self.state == "closed" and self._tripped(now):
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

    def _tripped(self, now: float) -> bool:
        if self.failures < self.threshold:
            return False
        rate = self.failure_rate(now)
        return rate is None or rate >= self.rate

    def _age(self, now: float) -> None:
        if now > self.aged_at:
            keep = math.exp(-(now - self.aged_at) / self.window)
            self.recent_started *= keep
            self.remembered *= math.exp(-(now - self.aged_at) / self.memory)
            self.recent_ok *= keep
            self.recent_failed *= keep
            self.aged_at = now
