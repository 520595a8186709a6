"""Weights and metrics across processes: a failure moves the fleet's weight of a model, and
every second each process sends its figures and takes back everyone's. I/O shell."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio

from streamres._shell.shared.connection import Connection
from streamres._shell.shared.scripts import script

__all__ = ["METRICS_EVERY", "SCRIPTS", "Metrics"]

#: Seconds between two metrics syncs; a process silent for three is no longer counted.
METRICS_EVERY = 1.0

#: The scripts (``scripts/<name>.lua``, each with what its KEYS and ARGV are).
SCRIPTS = {"weight": script("weight"), "metrics": script("metrics")}


def _ttft_of(others: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, ...]]:
    """The other processes' recent times to first token, by route key and request kind (what
    each exported; a process that exports no kinds is read as quick requests)."""
    out: dict[tuple[str, str], list[float]] = {}
    for routes in others:
        for key, figures in routes.items():
            if not isinstance(figures, dict):
                continue
            for kind in ("quick", "reasoning"):
                got = figures.get(f"ttft_{kind}")
                if got is None and kind == "quick" and "ttft_reasoning" not in figures:
                    got = figures.get("ttft")
                if isinstance(got, list):
                    out.setdefault((str(key), kind), []).extend(
                        float(x) for x in got if isinstance(x, (int, float)) and x >= 0
                    )
    return {k: tuple(v) for k, v in out.items()}


class Metrics(Connection):
    """The fleet's weights and figures, one view for every process."""

    def _weigh(self, i: int, op: str) -> None:
        """Fleet hook: a model's weight moved here; move the fleet's (the script publishes
        the result, which every process — this one too — applies)."""
        w = self.fleet.states[i].weight
        self._post(
            "weight",
            [f"{self.prefix}:weights"],
            [self.fleet.routes[i].key, op, w.base, w.penalty, w.restore, w.floor, self._channel],
        )

    def _weighed(self, event: dict[str, Any]) -> None:
        i = self.fleet.by_key.get(str(event.get("route")))
        weight = event.get("weight")
        if i is not None and isinstance(weight, (int, float)):
            self.fleet.set_weight(i, float(weight))
            self.notify()

    async def sync_metrics(self) -> None:
        """Send this process's figures; take back every live process's (one round trip)."""
        routes = self.fleet.exported(anyio.current_time())
        figures = json.dumps({"id": self.id, "routes": routes})
        got = await self._call(
            "metrics",
            [f"{self.prefix}:metrics:procs"],
            [self.id, figures, int(METRICS_EVERY * 3000), f"{self.prefix}:metrics:of:"],
        )
        if got is not None:
            others = []
            for blob in got:
                with contextlib.suppress(ValueError, TypeError):
                    data = json.loads(blob)
                    if data["id"] != self.id and isinstance(data["routes"], dict):
                        others.append(data["routes"])
            self.others = others
            self.fleet.peer_ttft = _ttft_of(others)

    async def _sync_metrics_often(self) -> None:
        while True:
            await self.sync_metrics()
            await anyio.sleep(METRICS_EVERY)
