"""Streams for the tests: short real backoff, a question, and draining a stream."""

from __future__ import annotations

from typing import Any

import streamres
from streamres.upstream import Upstream

#: Backoff for tests: real waits, but short ones.
FAST = streamres.Backoff(initial=0.01, multiplier=2.0, maximum=0.05)
USER = [{"role": "user", "content": "Explain TCP slow start."}]


async def collect(stream: streamres.ResilientStream) -> tuple[str, list[Any], streamres.DoneEvent]:
    """Drain a stream: (text from text events, every event, the done event)."""
    text = ""
    events: list[Any] = []
    async with stream:
        async for ev in stream:
            events.append(ev)
            if ev.type == "text":
                text += ev.text
    done = events[-1]
    assert isinstance(done, streamres.DoneEvent)
    return text, events, done


def url_for(up: Upstream, provider: str) -> str:
    return up.openai_url if provider == "openai" else up.anthropic_url
