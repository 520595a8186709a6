"""Hostile upstreams: one attempt against each attack, the client process's peak RSS. Part of
``streamres bench``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import streamres
from streamres.benchmarks.common import Q, peak_rss_kib, server

_ATTACKS = {
    "clean answer (baseline)": "none",
    "data: lines that never end an event": "flood@5",
    "gzip bomb (2 MiB -> 1 GiB)": "bomb",
}


async def probe(url: str) -> dict[str, Any]:
    """One answer with one attempt, in this (child) process: outcome, time, peak RSS."""
    started = time.perf_counter()
    outcome = "done"
    try:
        async for _ in streamres.stream_resilient(
            Q, model="m", base_url=url, api_key="x", max_attempts=1, deadline=60
        ):
            pass
    except streamres.StreamError as exc:
        outcome = f"{type(exc).__name__} ({exc.reason})"
    return {
        "outcome": outcome,
        "seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mib": round(peak_rss_kib() / 1024, 1),
    }


def hostile() -> list[dict[str, Any]]:
    """Peak RSS of a client process under each attack, next to a clean answer's."""
    rows = []
    for name, faults in _ATTACKS.items():
        with server("--faults", faults) as url:
            out = subprocess.run(
                [sys.executable, "-m", "streamres.benchmarks.suite", "--probe", url],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        rows.append({"attack": name, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows
