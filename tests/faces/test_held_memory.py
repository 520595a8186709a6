"""What held answers weigh: the proxy's byte bound on held answers (``[answers] max_bytes``) is a
bound on its memory — long answers whose readers went, kept running by a long ``hold``, then
pushed out — counted with tracemalloc over the proxy's process (the embedded upstream serves
from a process of its own)."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator

import anyio
import httpx
import pytest

from streamres.proxy.config import HoldLimits, parse
from streamres.proxy.server.serve import running
from tests.helpers.redis import free_port

pytestmark = pytest.mark.anyio

BOUND = 2**20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the proxy serves on asyncio (uvicorn)


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def _serving(port: int, proc: subprocess.Popen[bytes]) -> None:
    with anyio.fail_after(60):
        while True:
            assert proc.poll() is None, "the embedded upstream exited"
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)  # polling the condition itself: the port answers
                continue
            await stream.aclose()
            return


@pytest.fixture
def upstream() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The embedded upstream in a process of its own, 3,000-word answers: its port."""
    port = free_port()
    serve = [sys.executable, "-m", "streamres", "serve", "--port", str(port), "--words", "3000"]
    proc = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=15)


async def test_held_answers_stay_within_their_byte_bound_in_memory(
    upstream: tuple[int, subprocess.Popen[bytes]],
) -> None:
    """Waves of ~20,000-character answers, each dropped by its reader after its first events
    and run to its end by a 90 s hold: the proxy's memory grows by at most 1.25 × ``max_bytes``
    while it holds them, and answers are pushed out to stay there."""
    limits = HoldLimits(hold=90, max_bytes=BOUND, max_bytes_per_key=BOUND)
    body = {"model": "m", "stream": True}
    port, proc = upstream
    await _serving(port, proc)
    base_url = f"http://127.0.0.1:{port}/v1"
    config = parse({"routes": [{"name": "m", "model": "m", "base_url": base_url}]}, {})
    async with (
        running(config, port=0, answers=limits) as run,
        httpx.AsyncClient(base_url=run.url, timeout=60) as http,
    ):

        async def dropped(question: str) -> None:
            ask = {**body, "messages": [{"role": "user", "content": question}]}
            async with http.stream("POST", "/v1/chat/completions", json=ask) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # the reader goes; the answer runs on in its hold

        await dropped("warm up")  # the process's one-time allocations first
        await run.proxy.answers.settled()
        tracemalloc.start()
        try:
            before, grown, made = _traced(), 0, 0
            for wave in range(5):
                async with anyio.create_task_group() as tg:
                    for i in range(5):
                        tg.start_soon(dropped, f"wave {wave}, question {i}")
                made += 5
                await run.proxy.answers.settled()
                grown = max(grown, _traced() - before)
        finally:
            tracemalloc.stop()
        held = len(run.proxy.answers)
    assert held < made  # answers were pushed out
    assert grown <= 1.25 * BOUND, f"{grown / 2**20:.2f} MiB for a bound of {BOUND / 2**20} MiB"


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
async def test_the_byte_bound_counts_what_held_answers_take(
    upstream: tuple[int, subprocess.Popen[bytes]], api: str
) -> None:
    """Long answers (~20,000 characters each) read to their end and kept: what the proxy
    counts them as weighing (``held_bytes``, what ``max_bytes`` bounds) is within 1.25× of
    what its memory grew by while it took them, either way — and under 8 bytes a character."""
    port, proc = upstream
    await _serving(port, proc)
    base_url = f"http://127.0.0.1:{port}/v1"
    config = parse({"routes": [{"name": "m", "model": "m", "base_url": base_url}]}, {})
    path = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}.get(api, "/v1/responses")
    async with (
        running(config, port=0) as run,
        httpx.AsyncClient(base_url=run.url, timeout=60) as http,
    ):

        async def read(question: str) -> int:
            ask: dict[str, object] = {"model": "m", "stream": True, "max_tokens": 100_000}
            if api == "responses":
                ask = {"model": "m", "stream": True, "input": question}
            else:
                ask["messages"] = [{"role": "user", "content": question}]
            async with http.stream("POST", path, json=ask) as r:
                assert r.status_code == 200
                got = await r.aread()
            return len(got)

        await read("warm up")  # the process's one-time allocations first
        await run.proxy.answers.settled()
        answers = run.proxy.answers
        tracemalloc.start()
        try:
            before, counted = _traced(), answers.held_bytes
            for i in range(6):
                await read(f"question {i}")
            await answers.settled()
            grown, counted = _traced() - before, answers.held_bytes - counted
        finally:
            tracemalloc.stop()
        chars = sum(len(h.log.text) for h in answers._held.values()) * 6 // len(answers)
    assert len(answers) == 7 and chars > 100_000
    assert grown / 1.25 <= counted <= grown * 1.25, (counted, grown)
    assert counted / chars < 8, counted / chars
