"""``streamres bench warning``: what the early warning saves, on the real fleet policy.

A simulation in simulated time (ten minutes in well under a second), of the fleet's own code:
``Fleet`` chooses each request's model by weight × the trend's share, records each outcome, and
opens and closes breakers, exactly as in a ``Client``. Two models share the traffic (4 requests
a second, ``model=None``); model ``a`` slides towards capacity — its refusals rise from none at
2 minutes to 95 % at 5, its time to first token from 0.2 s to 0.8 s — holds there for a minute,
then recovers; ``b`` stays healthy. A request refused by ``a`` falls back to ``b`` (so the
person still gets an answer, later). Counted, with the trend steering traffic and without
(weights ×0.7 per failure and the breaker only): requests refused by ``a``, those refused before
its breaker first opened, when the verdict first said ``degrading``, and ``a``'s share of the
requests while it slid.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import streamres
from streamres._fleet.fleet import Fleet
from streamres.benchmarks.common import summary
from streamres.benchmarks.table import table

__all__ = ["main", "simulate"]


def _refusal_rate(t: float) -> float:
    if t < 120:
        return 0.0
    if t < 300:
        return 0.95 * (t - 120) / 180
    if t < 360:
        return 0.95
    return 0.0


def simulate(steering: bool, seed: int = 0, seconds: int = 600, rate: int = 4) -> dict[str, Any]:
    rng = random.Random(seed)
    fleet = Fleet(
        [
            streamres.Route("a", base_url="http://a/v1"),
            streamres.Route("b", base_url="http://b/v1"),
        ],
        breaker_threshold=3,
        breaker_recovery=30.0,
    )
    fleet.steering = steering
    refused = refused_before_open = to_a_sliding = 0
    first_open: float | None = None
    first_warning: float | None = None
    for tick in range(seconds * rate):
        now = tick / rate
        chain = fleet.chain(None, fallback=True, rand=rng.random())
        for i in chain:
            if not fleet.try_acquire(i, now):
                continue
            fleet.started(i, now, resume=False)
            if 120 <= now < 360:
                to_a_sliding += i == 0
            p = _refusal_rate(now) if i == 0 else 0.0
            if rng.random() < p:
                fleet.failed(i, now, "capacity", ttft=None, retry_after=None)
                refused += 1
                if first_open is None:
                    refused_before_open += 1
                if fleet.states[0].breaker.state == "open" and first_open is None:
                    first_open = now
                continue
            ttft = 0.2 + (0.6 * min(1.0, max(0.0, (now - 120) / 180)) if i == 0 else 0.0)
            if i == 0 and now >= 360:
                ttft = 0.2
            fleet.succeeded(i, now, ttft=ttft, latency=ttft + 2.0)
            break
        if first_warning is None and fleet.metrics(now)["a"].health.status == "degrading":
            first_warning = now
    requests_sliding = (360 - 120) * rate
    return {
        "trend_steering": "on" if steering else "off",
        "refused_by_a": refused,
        "refused_before_breaker_opened": refused_before_open,
        "degrading_at_s": "—" if first_warning is None else round(first_warning),
        "breaker_first_open_at_s": "—" if first_open is None else round(first_open),
        "a_share_while_sliding": f"{to_a_sliding / requests_sliding:.0%}",
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench warning", description=summary(__doc__))
    p.add_argument("--seeds", type=int, default=5, help="runs per setting (seeds 0…N-1)")
    args = p.parse_args(argv)
    rows = []
    for steering in (False, True):
        runs = [simulate(steering, seed) for seed in range(args.seeds)]
        row = dict(runs[0])
        for key, value in row.items():
            if isinstance(value, (int, float)) and all(
                isinstance(r[key], (int, float)) for r in runs
            ):
                row[key] = round(sum(r[key] for r in runs) / len(runs), 1)
        shares = [float(r["a_share_while_sliding"].rstrip("%")) for r in runs]
        row["a_share_while_sliding"] = f"{sum(shares) / len(shares):.0f}%"
        rows.append(row)
    print("A model sliding to capacity (simulated, the fleet's own policy; mean of the seeds)")
    print(table(rows, list(rows[0])))
    return 0
