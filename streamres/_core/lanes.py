"""Priority lanes: who gets the next free slot. Pure.

Theory of operation. A request that finds its route's or account's slots full joins a waiting
line. The line is ordered by priority (higher first), then by arrival (first come, first served
within a lane). A slot given back goes straight to the first waiter in the line — never to a
request that arrives later, whatever its lane — so a person's question waits only for the
answers already streaming, never behind a batch queued before it. The same order holds across
processes with shared state (the Redis line in ``_shell/shared`` ranks waiters by the same two
keys).

Priorities are integers, higher first; four have names (``high`` 10, ``normal`` 0, ``low``
-10, ``background`` -20). ``Client.stream()`` defaults to ``normal``, ``streamres batch`` to
``low``. Work nobody watches (the proxy's Responses API ``background`` answers) goes in
``background`` and below: those lanes never take a set's last free slot when it has two or
more (:func:`reserve`) — a person arriving while background work fills a route finds a slot at
once, instead of waiting for that work to end.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "BACKGROUND",
    "HIGH",
    "LOW",
    "NAMES",
    "NORMAL",
    "Line",
    "Ticket",
    "check_priority",
    "parse_priority",
    "reserve",
]

HIGH, NORMAL, LOW, BACKGROUND = 10, 0, -10, -20
NAMES = {"high": HIGH, "normal": NORMAL, "low": LOW, "background": BACKGROUND}


def reserve(priority: int, size: int) -> int:
    """Slots of a set of ``size`` a request of ``priority`` leaves free for others: one for a
    background lane when there are two or more, else none."""
    return 1 if priority <= BACKGROUND and size >= 2 else 0


#: Priorities outside this range are refused (the shared line keeps them exact in a float).
BOUND = 100

T = TypeVar("T")


def check_priority(value: object) -> int:
    """A priority as given to ``Client.stream(priority=...)``: an int, or a lane's name."""
    if isinstance(value, str) and value.strip().lower() in NAMES:
        return NAMES[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"priority must be an integer (higher goes first) or one of "
            f"{', '.join(NAMES)}, not {value!r:.60}"
        )
    if not -BOUND <= value <= BOUND:
        raise ValueError(f"priority must be between {-BOUND} and {BOUND}, not {value}")
    return value


def parse_priority(text: str) -> int:
    """A priority from text (a header, a config file, a flag): a name or an integer."""
    stripped = text.strip()
    try:
        number = int(stripped)
    except ValueError:
        return check_priority(stripped)
    return check_priority(number)


@dataclass(eq=False)
class Ticket(Generic[T]):
    """One waiter's place in a :class:`Line`."""

    item: T
    priority: int
    order: int
    #: ``waiting`` until served by :meth:`Line.pop` or taken out by :meth:`Line.remove`.
    state: str = field(default="waiting")


class Line(Generic[T]):
    """Waiters by priority, then arrival. ``pop`` serves the first; ``remove`` takes one out
    (a waiter that gave up) in O(1), its entry dropped when it reaches the front."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Ticket[T]]] = []
        self._count = itertools.count()
        self._waiting = 0

    def __len__(self) -> int:
        return self._waiting

    def push(self, item: T, priority: int) -> Ticket[T]:
        ticket = Ticket(item, priority, next(self._count))
        heapq.heappush(self._heap, (-priority, ticket.order, ticket))
        self._waiting += 1
        return ticket

    def remove(self, ticket: Ticket[T]) -> bool:
        """Take a waiter out; ``False`` if it was already served."""
        if ticket.state != "waiting":
            return False
        ticket.state = "left"
        self._waiting -= 1
        return True

    def peek(self) -> Ticket[T] | None:
        """The first waiter, not served (``None`` if nobody waits)."""
        while self._heap and self._heap[0][2].state != "waiting":
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Ticket[T] | None:
        """Serve the first waiter (``None`` if nobody waits)."""
        while self._heap:
            _, _, ticket = heapq.heappop(self._heap)
            if ticket.state == "waiting":
                ticket.state = "served"
                self._waiting -= 1
                return ticket
        return None
