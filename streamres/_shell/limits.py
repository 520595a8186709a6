"""Concurrency limits shared by every stream of a client (seed 2.3: 20 requests against a
quota of 5 go from under 50 % to over 95 % success once bounded). I/O shell: anyio semaphores.

A request needs a slot on its route (``Route.max_in_flight``) and on its account
(``account_limits[route.account or route.base_url]``); the rest wait their turn within their
deadline, instead of hitting the server. The turn is a priority lane's (``_core/lanes``): a slot
given back goes to the highest-priority waiter, first come first served within a lane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import anyio.lowlevel

from streamres._core.lanes import NORMAL, Line, reserve
from streamres._fleet.routes import Route
from streamres._shell.connects import Connects
from streamres._shell.lag import LoopLag

__all__ = ["Limits", "Slots"]


def account_of(route: Route) -> str:
    return route.account or route.base_url or ""


class Slots:
    """``n`` slots and a priority line of the requests waiting for one: a slot given back is
    handed to the first waiter (no request arriving later can take it in between)."""

    def __init__(self, n: int) -> None:
        self.size = n
        self.free = n
        self.line: Line[anyio.Event] = Line()

    def shrink(self, n: int) -> None:
        """``n`` fewer slots from now on (those held keep theirs; ``free`` may go below zero)."""
        self.size -= n
        self.free -= n

    def grow(self, n: int) -> None:
        """``n`` more slots, handed to waiters first."""
        self.size += n
        for _ in range(n):
            self.release()

    @property
    def waiting(self) -> int:
        return len(self.line)

    async def acquire(self, priority: int = NORMAL) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        first = self.line.peek()
        if self.free > reserve(priority, self.size) and (
            first is None or first.priority < priority
        ):
            self.free -= 1
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return
        ticket = self.line.push(anyio.Event(), priority)
        try:
            await ticket.item.wait()
        except BaseException:
            if not self.line.remove(ticket):  # served as it was cancelled: hand the slot on
                self.release()
            raise

    def take(self) -> None:
        """Count a slot taken elsewhere (a lease of the fleet's, in Redis), whether or not one
        is free here: ``free`` may go below zero, and slots given back then pay that first."""
        self.free -= 1

    def release(self) -> None:
        if self.free < 0:  # more were taken than there are: this one pays that back
            self.free += 1
            return
        first = self.line.peek()
        if first is None or self.free + 1 <= reserve(first.priority, self.size):
            self.free += 1  # nobody waits, or only background work, for which one stays free
            return
        ticket = self.line.pop()
        assert ticket is not None
        ticket.item.set()


class Limits:
    def __init__(self, routes: Sequence[Route], account_limits: Mapping[str, int]) -> None:
        self._routes = {r.key: Slots(r.max_in_flight) for r in routes if r.max_in_flight}
        self._accounts = {name: Slots(n) for name, n in account_limits.items()}
        self._changed = anyio.Event()
        #: How late the client's event loop runs (its ``Client`` keeps it measured).
        self.lag = LoopLag()
        #: The pace new connections to each server are opened at.
        self.connects = Connects()

    def notify(self) -> None:
        """A model's state changed (an outcome was recorded): wake the streams waiting on it."""
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self, seconds: float) -> None:
        """Wait until the next :meth:`notify`, or ``seconds`` at most."""
        event = self._changed
        with anyio.move_on_after(seconds):
            await event.wait()

    def _semaphores(self, route: Route) -> list[Slots]:
        found = [self._accounts.get(account_of(route)), self._routes.get(route.key)]
        return [s for s in found if s is not None]

    def waiting(self, route: Route) -> int:
        """Requests of this process waiting for a slot the route needs."""
        return max((s.waiting for s in self._semaphores(route)), default=0)

    async def acquire(self, route: Route, seconds: float, priority: int = NORMAL) -> bool:
        """Wait (at most ``seconds``) for a slot on the route and its account, in the lane of
        ``priority``."""
        taken: list[Slots] = []
        try:
            with anyio.move_on_after(seconds):
                for sem in self._semaphores(route):
                    await sem.acquire(priority)
                    taken.append(sem)
                return True
        except BaseException:  # cancelled while waiting: give back what was taken
            for sem in taken:
                sem.release()
            raise
        for sem in taken:
            sem.release()
        return False

    def take(self, route: Route) -> None:
        """Count a slot of the route taken elsewhere (see :meth:`Slots.take`)."""
        for sem in self._semaphores(route):
            sem.take()

    def release(self, route: Route) -> None:
        for sem in self._semaphores(route):
            sem.release()
