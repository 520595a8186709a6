"""The retry budget every process shares: one token bucket in Redis. I/O shell.

This process's fleet keeps its own budget (what it falls back on while Redis is away) and tells
its deposits and refunds as news (``Fleet.news``); they are sent here. A retry's reservation is
asked of the shared bucket by the answer's shell (the machine's ``Reserve`` action)."""

from __future__ import annotations

from typing import Any

import anyio

from streamres._shell.shared.connection import Connection
from streamres._shell.shared.scripts import script

__all__ = ["SCRIPTS", "Budget"]

_BUDGET = script("budget")
#: The scripts (``scripts/<name>.lua``, each with what its KEYS and ARGV are).
SCRIPTS = {"budget": _BUDGET}


class Budget(Connection):
    """Deposits, refunds and reservations of the shared bucket."""

    def _budget_args(self, op: str) -> list[Any]:
        b = self.fleet.budget
        return [op, b.ratio, b.floor, b.cap, self._initial_balance, b.window]

    def _budget_post(self, op: str) -> None:
        if op == "deposit":
            self._deposits += 1  # sent together, twice a second: not a round trip per answer
        elif self.connected:
            self._post("budget", [f"{self.prefix}:budget"], self._budget_args(op))

    async def _send_deposits(self) -> None:
        while True:
            await anyio.sleep(0.5)
            if self._deposits and self.connected:
                n, self._deposits = self._deposits, 0
                await self._call(
                    "budget", [f"{self.prefix}:budget"], [*self._budget_args("deposit"), n]
                )

    async def reserve_retry(self) -> float:
        """Reserve the next retry token of the budget every process shares: seconds until it
        is there (this process's own budget decides while Redis is away)."""
        got = await self._call("budget", [f"{self.prefix}:budget"], self._budget_args("reserve"))
        if got is None:
            return self.fleet.budget.reserve(anyio.current_time())
        wait = float(got)
        return float("inf") if wait < 0 else wait
