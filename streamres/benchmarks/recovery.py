"""Recovery: the gap from a fault to the next new character, and what it wastes, against a
client that restarts. Part of ``streamres bench``."""

from __future__ import annotations

from typing import Any

import anyio

import streamres
from streamres.benchmarks.common import Q
from streamres.upstream import Upstream

_RECOVERY: list[tuple[str, str, dict[str, Any], str, str]] = [
    # label, provider, upstream kwargs, fault, client continuation
    ("429 Retry-After 0.2 s", "openai", {}, "429:retry-after=0.2", "auto"),
    ("529 Retry-After 0.2 s", "anthropic", {}, "529:retry-after=0.2", "auto"),
    ("error event, prefill", "anthropic", {}, "error@40", "auto"),
    ("error event, instruct-overlap", "openai", {}, "error@40", "auto"),
    ("error event, restart", "openai", {"instruct": "restart"}, "error@40", "auto"),
    ("reset, prefill", "anthropic", {}, "reset@40", "auto"),
    ("reset, instruct-overlap", "openai", {}, "reset@40", "auto"),
    ("reset, instruct-preamble", "openai", {"instruct": "preamble"}, "reset@40", "auto"),
    ("stall (0.5 s), prefill", "anthropic", {"ping_interval": 0.1}, "stall@40", "auto"),
    ("truncation, instruct-overlap", "openai", {}, "truncate@40", "auto"),
    ("[DONE] without finish, prefill", "openai", {}, "done-no-finish@40", "prefill"),
]


async def recovery() -> list[dict[str, Any]]:
    rows = []
    for label, provider, kw, fault, continuation in _RECOVERY:
        # Token by token, as a real model streams, so the hold-back is what a user would see.
        async with Upstream(faults=fault, token_delay=0.002, **kw) as up:
            base = up.openai_url if provider == "openai" else up.anthropic_url
            marks: list[tuple[str, float, float]] = []
            done: streamres.DoneEvent | None = None
            async for ev in streamres.stream_resilient(
                Q,
                model="m",
                base_url=base,
                api_key="x",
                provider=provider,  # type: ignore[arg-type]
                stall_timeout=0.5,
                continuation=continuation,  # type: ignore[arg-type]
                backoff=streamres.Backoff(initial=0.001, maximum=0.001),
            ):
                delay = getattr(ev, "delay", 0.0)
                marks.append((ev.type, anyio.current_time(), delay))
                if ev.type == "done":
                    done = ev
            assert done is not None
            status = next(i for i, m in enumerate(marks) if m[0] in ("retry", "resume"))
            nxt = next(m for m in marks[status + 1 :] if m[0] == "text")
            gap = nxt[1] - marks[status][1] - marks[status][2]
            last = done.history[-1]
            rows.append(
                {
                    "scenario": label,
                    "gap_ms": gap * 1000,
                    "held_chars": last.held_chars,
                    "hold_ms": last.hold_seconds * 1000,
                    "wasted_tokens": done.usage.wasted_tokens,
                    "exact": done.text == up.answer(Q),
                    "restart_client_wasted": await _restart_waste(base, provider, fault, up),
                }
            )
    return rows


async def _restart_waste(base: str, provider: str, fault: str, up: Upstream) -> int | str:
    """What a restart-from-scratch client regenerates: the whole partial answer (shown twice)."""
    if "@" not in fault:
        return 0
    up.faults.push(fault)
    try:
        async for _ in streamres.stream_resilient(
            Q,
            model="m",
            base_url=base,
            api_key="x",
            provider=provider,  # type: ignore[arg-type]
            max_attempts=1,
            stall_timeout=0.5,
        ):
            pass
    except streamres.StreamError as exc:
        from streamres._core.tokens import counter_for

        return counter_for("m")[1](exc.partial_text)
    return 0
