"""A hedged first token (``Client(hedge=True)``): when the first model is slow to start for its
own history, the fallback is started alongside, and the first to stream wins. I/O shell.

Theory of operation. The answer starts as usual on its chain (racer A). If A has shown no
output — text, thinking, a tool call — ``after`` seconds in (the first-output limit learnt
from the model's recent times to first token, ``_core/stall``), and is still on its first
model, racer B starts: the same request on the rest of the chain, within what is left of the
deadline, announced by a ``FallbackEvent`` with ``reason="hedge"``. From then on:

- the first output (or a finished answer) from either wins; the other is closed at once — its
  request closed, its slot, probe and budget given back — and the winner's events go on;
- A leaving its first model (it failed there) is closed: B is that move, already under way;
- a racer that fails leaves the other to go on alone; both failing raise the last failure.

Before the hedge, A's status events reach the caller as they come; during the race, neither
racer's (they would contradict each other); after it, the winner's. A's attempts on its first
model wait the whole first-output limit (``Options.hedged``): the hedge, not a timeout,
answers its slowness — a model slow this once still wins if its first token comes before the
fallback's.

Cost: while both race, two requests are open, and the one closed may be billed for its input
and whatever output its server made before the close. The winner runs in a task of its own,
so its events wait in a list until passed on (at most the answer's own bound, ``ReadLimits``).
A hedge starts only on a model slow for its own history (never before ``LEARN_AFTER`` answers
of it), and only with ``hedge=True``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from streamres._core.errors import StreamError
from streamres._core.events import DoneEvent, Event, FallbackEvent
from streamres._shell.log import log

__all__ = ["hedged"]

_OUTPUT = ("text", "thinking", "tool_call")


@dataclass(eq=False)
class _Racer:
    """One of the two answers racing: what it yielded so far, and how it ended."""

    model: str
    events: list[Event] = field(default_factory=list)
    error: StreamError | None = None
    done: bool = False
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def out(self) -> bool:
        """Out of the race: ended without a finished answer (failed, or closed)."""
        return self.done and not any(isinstance(e, DoneEvent) for e in self.events)


class _Race:
    def __init__(self) -> None:
        self.changed = anyio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


async def _pump(racer: _Racer, start: Callable[[], AsyncIterator[Event]], race: _Race) -> None:
    try:
        with racer.scope:
            events = start()
            try:
                async for ev in events:
                    racer.events.append(ev)
                    race.wake()
            finally:
                await events.aclose()  # type: ignore[attr-defined]
    except StreamError as exc:
        racer.error = exc
    finally:
        racer.done = True
        race.wake()


def _decisive(ev: Event) -> bool:
    return ev.type in _OUTPUT or isinstance(ev, DoneEvent)


async def hedged(
    tg: anyio.abc.TaskGroup,
    first: Callable[[], AsyncIterator[Event]],
    second: Callable[[], AsyncIterator[Event]],
    *,
    after: float,
    first_model: str,
    second_model: str,
) -> AsyncIterator[Event]:
    """The events of one answer, hedged (see module). ``first``: the answer on its whole
    chain; ``second``: the same on the chain after its first model (started only if needed);
    ``tg``: the client's task group, where both run."""
    race = _Race()
    a = _Racer(first_model)
    tg.start_soon(_pump, a, first, race)
    b: _Racer | None = None
    winner: _Racer | None = None
    seen = {id(a): 0}
    hedge_at = anyio.current_time() + after
    may_hedge = True
    finished = False
    try:
        while winner is None:
            while seen[id(a)] < len(a.events) and winner is None:
                ev = a.events[seen[id(a)]]
                if _decisive(ev):
                    winner = a
                    break
                seen[id(a)] += 1
                if ev.type == "fallback":
                    if b is None:
                        may_hedge = False  # it moved on before any hedge: no race
                    else:
                        a.scope.cancel()  # B is that move, already under way
                if b is None:
                    yield ev
            if winner is None and b is not None:
                while seen[id(b)] < len(b.events):
                    if _decisive(b.events[seen[id(b)]]):
                        winner = b
                        break
                    seen[id(b)] += 1
            if winner is not None:
                break
            if b is None and a.done:
                winner = a  # it ended before any hedge: its failure or its answer, as it is
                break
            if b is not None and (a.out() or b.out()):
                if a.out() and b.out():
                    raise b.error or a.error or StreamError("both hedged answers stopped")
                winner = b if a.out() else a  # the other goes on alone
                break
            if b is None and may_hedge and anyio.current_time() >= hedge_at:
                b = _Racer(second_model)
                seen[id(b)] = 0
                tg.start_soon(_pump, b, second, race)
                log.info("streamres.hedged", model=first_model, fallback=second_model)
                yield FallbackEvent(
                    f"{first_model} is slow to start — also asking {second_model}",
                    attempt=1,
                    from_model=first_model,
                    to_model=second_model,
                    reason="hedge",
                )
                continue
            changed = race.changed
            wait = hedge_at - anyio.current_time() if b is None and may_hedge else None
            with anyio.move_on_after(wait if wait is not None else float("inf")):
                await changed.wait()
        for loser in (a, b):
            if loser is not None and loser is not winner:
                loser.scope.cancel()  # at once: its request closed, its slot given back
        i = seen[id(winner)]
        while True:
            while i < len(winner.events):
                ev = winner.events[i]
                i += 1
                yield ev
                if isinstance(ev, DoneEvent):
                    finished = True
                    return  # the rest (reading the body's end) is the racer's own
            if winner.done:
                if winner.error is not None:
                    raise winner.error
                raise StreamError("the hedged answer was stopped (the client closed)")
            del winner.events[:i]  # passed on: held no longer
            i = 0
            changed = race.changed
            await changed.wait()
    finally:
        if not finished:
            for racer in (a, b):
                if racer is not None:
                    racer.scope.cancel()
