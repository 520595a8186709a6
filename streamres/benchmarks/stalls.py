"""Stall detection: how soon a silent stream is resumed at default settings, by its pace. Part
of ``streamres bench``."""

from __future__ import annotations

from typing import Any

import anyio

import streamres
from streamres.benchmarks.common import Q
from streamres.upstream import Upstream

_STALLS = [
    ("fast stream (10 ms between tokens)", 0.01, "stall@20"),
    ("slow stream (1 s between tokens)", 1.0, "stall@6"),
]


async def stall_detection(quick: bool) -> list[dict[str, Any]]:
    """Seconds from the last token before a stall to the resume event, with the defaults."""
    rows = []
    for label, delay, fault in _STALLS[:1] if quick else _STALLS:
        async with Upstream(faults=fault, token_delay=delay, ping_interval=0.2, words=12) as up:
            last_text = resumed = 0.0
            async for ev in streamres.stream_resilient(
                Q, model="m", base_url=up.openai_url, api_key="x", deadline=120
            ):
                if ev.type == "text" and not resumed:
                    last_text = anyio.current_time()
                elif ev.type == "resume" and not resumed:
                    resumed = anyio.current_time()
            rows.append({"stream": label, "stall_to_resume_s": round(resumed - last_text, 2)})
    return rows
