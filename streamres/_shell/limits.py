"""Concurrency limits shared by every stream of a client (seed 2.3: 20 requests against a
quota of 5 go from under 50 % to over 95 % success once bounded). I/O shell: anyio semaphores.

A request needs a slot on its route (``Route.max_in_flight``) and on its account
(``account_limits[route.account or route.base_url]``); the rest wait their turn, in order,
within their deadline, instead of hitting the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio

from streamres._fleet.routes import Route

__all__ = ["Limits"]


def account_of(route: Route) -> str:
    return route.account or route.base_url or ""


class Limits:
    def __init__(self, routes: Sequence[Route], account_limits: Mapping[str, int]) -> None:
        self._routes = {r.key: anyio.Semaphore(r.max_in_flight) for r in routes if r.max_in_flight}
        self._accounts = {name: anyio.Semaphore(n) for name, n in account_limits.items()}
        self._changed = anyio.Event()

    def notify(self) -> None:
        """A model's state changed (an outcome was recorded): wake the streams waiting on it."""
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self, seconds: float) -> None:
        """Wait until the next :meth:`notify`, or ``seconds`` at most."""
        event = self._changed
        with anyio.move_on_after(seconds):
            await event.wait()

    def _semaphores(self, route: Route) -> list[anyio.Semaphore]:
        found = [self._accounts.get(account_of(route)), self._routes.get(route.key)]
        return [s for s in found if s is not None]

    async def acquire(self, route: Route, seconds: float) -> bool:
        """Wait (at most ``seconds``) for a slot on the route and its account."""
        taken: list[anyio.Semaphore] = []
        try:
            with anyio.move_on_after(seconds):
                for sem in self._semaphores(route):
                    await sem.acquire()
                    taken.append(sem)
                return True
        except BaseException:  # cancelled while waiting: give back what was taken
            for sem in taken:
                sem.release()
            raise
        for sem in taken:
            sem.release()
        return False

    def release(self, route: Route) -> None:
        for sem in self._semaphores(route):
            sem.release()
