"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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


# --- a real redis-server (shared state, the shared cache) ----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server on a free loopback port, that a test may stop and start again
    (``STREAMRES_REDIS_SERVER=/path/to/valkey-server`` runs the same tests on Valkey)."""

    def __init__(self, tmp: Path) -> None:
        exe = os.environ.get("STREAMRES_REDIS_SERVER") or shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.exe, self.tmp, self.port = exe, tmp, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
