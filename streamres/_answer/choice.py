"""Which model of an answer's chain takes its next attempt, and why none can. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streamres._answer.memory import Memory
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route

__all__ = ["next_available", "probing", "ready_in", "unavailable", "unreachable"]


def next_available(
    fleet: Fleet,
    chain: Sequence[int],
    pos: int,
    t_end: float,
    now: float,
    moved: Callable[[Route, str | None], None],
) -> tuple[int | None, float]:
    """A chain position whose breaker lets a request through now (``pos`` first), or the
    earliest time one will. A model cooling down (after a Retry-After) until past the deadline
    is passed over: the answer moves to the next model instead of waiting in vain. ``moved``
    hears of each breaker that changed state on the way."""
    n = len(chain)
    for step in range(n):
        at = (pos + step) % n
        i = chain[at]
        if fleet.cooldown_left(i, now) >= t_end - now:
            continue
        before = fleet.states[i].breaker.state
        allowed = fleet.try_acquire(i, now)
        after = fleet.states[i].breaker.state
        moved(fleet.routes[i], after if after != before else None)
        if allowed:
            return at, now
    return None, min(fleet.available_at(i, now) for i in chain)


def probing(fleet: Fleet, chain: Sequence[int]) -> bool:
    """Is a half-open model's one probe in flight? (Its outcome may free the model soon.)"""
    return any(fleet.probing(i) for i in chain)


def unavailable(fleet: Fleet, chain: Sequence[int], now: float) -> str:
    """Why no model can take a request before the deadline, model by model."""
    why = []
    for i in dict.fromkeys(chain):
        route, state = fleet.routes[i], fleet.states[i]
        cool = fleet.cooldown_left(i, now)
        if cool > 0:
            why.append(f"{route.model} cooling down for {cool:.0f} s (Retry-After)")
        elif state.breaker.state != "closed":
            wait = max(0.0, state.breaker.available_at(now) - now)
            why.append(f"{route.model} circuit open for {wait:.0f} s")
    return "no model can take a request before the deadline: " + "; ".join(why)


def unreachable(fleet: Fleet, chain: Sequence[int], memory: Memory) -> str | None:
    """Why no model of the chain can be reached, when none has ever answered in this process
    and each one's last connect failed (``None`` otherwise: a server that answered before is
    waited for, as it may be restarting)."""
    why = [memory.why_unreachable(fleet.routes[i]) for i in dict.fromkeys(chain)]
    if not why or None in why:
        return None
    return "; ".join(dict.fromkeys(w for w in why if w))


def ready_in(fleet: Fleet, chain: Sequence[int], now: float) -> float | None:
    """Seconds until a model of the chain takes a request again (``None``: one does now)."""
    wait = min(fleet.available_at(i, now) for i in chain) - now
    return wait if wait > 0 else None
