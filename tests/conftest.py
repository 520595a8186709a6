"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import settings

import streamres
from streamres._core.tokens import counter_for
from streamres.upstream import Upstream

# Shared machines are noisy: a property is about results, never about how long an example took.
settings.register_profile("streamres", deadline=None)
settings.load_profile("streamres")

#: Backoff for tests: real waits, but short ones.
FAST = streamres.Backoff(initial=0.01, multiplier=2.0, maximum=0.05)
USER = [{"role": "user", "content": "Explain TCP slow start."}]


@pytest.fixture(scope="session", autouse=True)
def _token_encoding_loaded() -> None:
    """Load the tiktoken encoding once up front (~0.2 s, once per process), so that no test's
    timing depends on whether it happened to be the first to count tokens."""
    counter_for("m")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with Upstream(ping_interval=0.02) as up:
        yield up
