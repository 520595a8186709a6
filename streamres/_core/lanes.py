"""Priority lanes: who gets the next free slot. Pure.

Theory of operation. A request that finds its route's or account's slots full joins a waiting
line. The line is ordered by priority (higher first), then by arrival (first come, first served
within a lane). A slot given back goes straight to the first waiter in the line — never to a
request that arrives later, whatever its lane — so a person's question waits only for the
answers already streaming, never behind a batch queued before it. The same order holds across
processes with shared state (the Redis line in ``_shell/shared`` ranks waiters by the same two
keys).

Priorities are integers, higher first; three have names (``high`` 10, ``normal`` 0, ``low``
-10). ``Client.stream()`` defaults to ``normal``, ``streamres batch`` to ``low``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["HIGH", "LOW", "NAMES", "NORMAL", "Line", "Ticket", "check_priority", "parse_priority"]

HIGH, NORMAL, LOW = 10, 0, -10
NAMES = {"high": HIGH, "normal": NORMAL, "low": LOW}
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

    def pop(self) -> Ticket[T] | None:
        """Serve the first waiter (``None`` if nobody waits)."""
        while self._heap:
            _, _, ticket = heapq.heappop(self._heap)
            if ticket.state == "waiting":
                ticket.state = "served"
                self._waiting -= 1
                return ticket
        return None
