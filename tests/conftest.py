"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from streamres._answer.memory import Memory
from streamres._core.tokens import counter_for
from streamres._shell import stream as _stream
from streamres.upstream import Upstream
from tests.helpers.redis import (
    TOPOLOGIES,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    Servers,
)

# Shared machines are noisy: a property is about results, never about how long an example took.
# The suite's properties are seeded (the same examples every run, so a red run is the change's);
# STREAMRES_HYPOTHESIS=fuzz draws fresh examples, ten times as many, for a longer search.
settings.register_profile("streamres", deadline=None, derandomize=True, database=None)
settings.register_profile("fuzz", deadline=None, max_examples=1000)
settings.load_profile("fuzz" if os.environ.get("STREAMRES_HYPOTHESIS") == "fuzz" else "streamres")


@pytest.fixture(autouse=True)
def _fresh_server_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process remembers about servers (prefill refused, reached, resumes sent whole) is
    keyed by base URL, and the embedded upstream's ports are reused: a test that followed
    another on the same port once found it "refusing prefill" and resumed by instruct. Each
    test starts with the memory of a fresh process."""
    monkeypatch.setattr(_stream, "_MEMORY", Memory())


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


@pytest.fixture(params=TOPOLOGIES)
def redis_servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Servers]:
    """Redis as operators run it: one redis-server, one Valkey (``valkey-server``, or
    ``STREAMRES_VALKEY_SERVER``), a three-primary Redis Cluster, a primary with a replica
    and Sentinel — each with its URL, to stop, start, pause, empty and fill."""
    servers: Servers
    if request.param == "valkey":
        exe = os.environ.get("STREAMRES_VALKEY_SERVER") or shutil.which("valkey-server")
        if exe is None:
            pytest.skip("valkey-server is not installed (Debian: bookworm-backports)")
        servers = RedisServer(tmp_path, exe)
        servers.start()
    elif request.param == "cluster":
        servers = RedisClusterServers(tmp_path)
        servers.create()
    elif request.param == "sentinel":
        servers = RedisSentinelServers(tmp_path)
        servers.create()
    else:
        servers = RedisServer(tmp_path)
        servers.start()
    try:
        yield servers
    finally:
        servers.close()
