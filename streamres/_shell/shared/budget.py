"""The retry budget every process shares: one token bucket in Redis. I/O shell."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from streamres._fleet.balance import RetryBudget
from streamres._shell.shared.connection import Connection
from streamres._shell.shared.scripts import script

__all__ = ["SCRIPTS", "Budget", "SharedBudget"]

_BUDGET = script("budget")
#: The scripts (``scripts/<name>.lua``, each with what its KEYS and ARGV are).
SCRIPTS = {"budget": _BUDGET}


class SharedBudget(RetryBudget):
    """The client's retry budget, with deposits and refunds also sent to the shared one (the
    local balance is what this process falls back on when Redis is away)."""

    def __init__(self, local: RetryBudget, post: Callable[[str], None]) -> None:
        super().__init__(
            local.ratio,
            local.floor,
            local.cap,
            local.balance,
            local.updated,
            local.window,
            local.recent,
        )
        self._post = post
        #: The balance a fleet's shared bucket starts with (the first process creates it).
        self.initial = local.balance

    def deposit(self, now: float, attempts: int = 1) -> None:
        super().deposit(now, attempts)
        for _ in range(attempts):
            self._post("deposit")

    def refund(self) -> None:
        super().refund()
        self._post("refund")


class Budget(Connection):
    """Deposits, refunds and reservations of the shared bucket."""

    def _budget_args(self, op: str) -> list[Any]:
        b = self.fleet.budget
        initial = b.initial if isinstance(b, SharedBudget) else b.balance
        return [op, b.ratio, b.floor, b.cap, initial, b.window]

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
