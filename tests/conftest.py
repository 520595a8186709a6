"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from streamres._core.tokens import counter_for
from streamres.upstream import Upstream
from tests.helpers.redis import RedisServer

# Shared machines are noisy: a property is about results, never about how long an example took.
settings.register_profile("streamres", deadline=None)
settings.load_profile("streamres")


@pytest.fixture(scope="session", autouse=True)
def _token_encoding_loaded() -> None:
    """Load the tiktoken encoding once up front (~0.2 s, once per process), so that no test's
    timing depends on whether it happened to be the first to count tokens."""
    counter_for("m")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with Upstream(ping_interval=0.02) as up:
        yield up


# --- a real redis-server (shared state, the shared cache) ----------------------------------


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
