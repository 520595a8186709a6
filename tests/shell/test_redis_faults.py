"""An account limit held by three processes through Redis's faults: killed and restarted
empty, paused (SIGSTOP), emptied (FLUSHALL) and full (``maxmemory`` with ``noeviction``) —
against a real ``redis-server`` and an upstream that counts what it serves at once.

Each worker keeps more streams going than its share, so the limit is what holds them back.
Once every process has seen a fault (each says when its shared state goes away and comes back)
and the answers running then have ended, the fleet keeps to the processes' shares (the limit
divided by the three each last saw: here the limit itself); after it ends, to the limit
within ``RECOVERY`` — the time the README gives: one answer's length and the rejoin's few
seconds. Emptied, it never goes past the limit at all. Every answer is exact."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from streamres.upstream import Upstream
from tests.helpers.redis import RedisSentinelServers, RedisServer, connected
from tests.helpers.redis import Servers as RedisServers

pytestmark = pytest.mark.anyio

Q = [{"role": "user", "content": "Explain TCP slow start."}]
LIMIT, WORKERS, EACH = 6, 3, 4  # 12 streams wanted at once, 6 allowed
WORDS, DELAY = 40, 0.02  # answers of about a second
#: After a fault ends: an answer's length for what was let through to end, and the rejoin's
#: check (each second) and the lost-data grace (1.5 s).
RECOVERY = 5.0

WORKER = textwrap.dedent(
    """
    import json, sys, anyio, streamres
    url, shared, each, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    Q = [{"role": "user", "content": "Explain TCP slow start."}]
    async def main():
        route = streamres.Route("m", base_url=url, api_key="k", account="acct")
        texts, errors = [], []
        async with streamres.Client(
            [route], account_limits={"acct": limit}, shared=shared, deadline=60,
            backoff=streamres.Backoff(initial=0.05, maximum=0.5),
        ) as client:
            stop = anyio.Event()
            async def one():
                while not stop.is_set():
                    text = ""
                    try:
                        async for ev in client.stream(Q, model="m"):
                            if ev.type == "text":
                                text += ev.text
                    except streamres.StreamError as exc:
                        errors.append(repr(exc))
                    texts.append(text)
            async def until_told():
                await anyio.to_thread.run_sync(sys.stdin.readline)
                stop.set()
            async def say_state():  # each change of the shared state as this process sees it
                seen = None
                while not stop.is_set():
                    if (now := client.shared_status().connected) != seen:
                        seen = now
                        print("connected" if now else "away", flush=True)
                    await anyio.sleep(0.02)
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_told)
                tg.start_soon(say_state)
                for _ in range(each):
                    tg.start_soon(one)
        print(json.dumps({"texts": texts, "errors": errors}))
    anyio.run(main)
    """
)


class _Workers:
    """The worker processes' state as each last said it, and their answers once ended."""

    def __init__(self) -> None:
        self.states: list[str] = [""] * WORKERS
        self.results: list[dict[str, Any]] = []
        self._said = anyio.Event()

    def said(self, i: int, line: str) -> None:
        if line in ("connected", "away"):
            self.states[i] = line
            self._said.set()
            self._said = anyio.Event()
        else:
            self.results.append(json.loads(line))

    async def all(self, state: str) -> None:
        """Until every worker has said ``state`` last."""
        with anyio.fail_after(30):
            while any(s != state for s in self.states):
                await self._said.wait()


@asynccontextmanager
async def _workers(url: str, shared: str) -> AsyncIterator[_Workers]:
    """Three worker processes streaming until the block ends, saying their shared state as it
    changes; then their answers."""
    workers = _Workers()
    procs = [
        await anyio.open_process(
            [sys.executable, "-c", WORKER, url, shared, str(EACH), str(LIMIT)],
            stderr=None,
        )
        for _ in range(WORKERS)
    ]

    async def read(i: int, proc: Any) -> None:
        assert proc.stdout is not None
        lines = BufferedByteReceiveStream(proc.stdout)
        with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
            while True:
                workers.said(i, (await lines.receive_until(b"\n", 1 << 26)).decode())

    async with anyio.create_task_group() as readers:
        for i, proc in enumerate(procs):
            readers.start_soon(read, i, proc)
        try:
            yield workers
        finally:
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(b"stop\n")
            with anyio.fail_after(60):
                for proc in procs:
                    await proc.wait()


async def _redis(url: str, call: Callable[[Any], Awaitable[Any]]) -> Any:
    """One call on the servers a shared-state URL names (one server, a cluster, Sentinel's
    primary)."""
    async with connected(url, decode_responses=True) as client:
        return await call(client)


async def _fill(url: str) -> None:
    """A server full: its memory limit below what it uses, writes refused (``noeviction``);
    pings, reads and pub/sub answered."""

    async def full(r: Any) -> None:
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set({"maxmemory": str(used // 2), "maxmemory-policy": "noeviction"})

    await _redis(url, full)


async def _all_seen(url: str) -> None:
    """Until every worker has seen the other two: each has sent its figures (the metrics
    sync, once a second, scored by when they lapse) since the last of them first did."""

    async def scores() -> list[float]:
        got = await _redis(
            url, lambda r: r.zrange("{streamres}:metrics:procs", 0, -1, withscores=True)
        )
        return [float(m.score) for m in got]

    with anyio.fail_after(30):
        while len(first := await scores()) < WORKERS:  # noqa: ASYNC110 (Redis's state, not ours)
            await anyio.sleep(0.1)
        while min(await scores()) <= max(first):  # noqa: ASYNC110 (Redis's state, not ours)
            await anyio.sleep(0.1)


async def _settled(up: Upstream, workers: _Workers) -> None:
    """A fault has begun: until every worker has seen it and the answers running then (let
    through by the fleet's count, or by a process's share before the others saw it) have
    ended."""
    await workers.all("away")
    await up.wait_streams_begun_done()


async def _window(up: Upstream, seconds: float) -> int:
    """The most streams the upstream served at once over the next ``seconds``."""
    up.reset_peak()
    await anyio.sleep(seconds)
    return up.peak_in_flight()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the workers are processes of their own
async def test_an_account_limit_holds_through_every_redis_fault(
    redis_servers: RedisServers,
) -> None:
    """On one Redis, Valkey, a Redis Cluster and a primary with Sentinel alike."""
    url = redis_servers.url
    peaks: dict[str, int] = {}
    async with Upstream(token_delay=DELAY, words=WORDS) as up:
        async with _workers(up.openai_url, url) as workers:
            await workers.all("connected")
            await _all_seen(url)
            peaks["steady"] = await _window(up, 2.0)

            # Killed, and back without its data.
            redis_servers.stop()
            await _settled(up, workers)
            peaks["killed"] = await _window(up, 2.0)
            redis_servers.start()
            await anyio.sleep(RECOVERY)
            peaks["after restart"] = await _window(up, 2.0)

            # Paused: every call times out; then back with its data (and its late replies).
            pids = redis_servers.pids()
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                await _settled(up, workers)
                peaks["paused"] = await _window(up, 2.0)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            await anyio.sleep(RECOVERY)
            peaks["after pause"] = await _window(up, 2.0)

            # Emptied under the fleet's feet: no connection lost, every lease gone.
            for primary in redis_servers.primaries():
                await _redis(primary, lambda r: r.flushall())
            peaks["flushed"] = await _window(up, RECOVERY)
            peaks["after flush"] = await _window(up, 2.0)

            # Full: writes refused, pings answered.
            for primary in redis_servers.primaries():
                await _fill(primary)
            await _settled(up, workers)
            peaks["full"] = await _window(up, 2.0)
            for primary in redis_servers.primaries():
                await _redis(primary, lambda r: r.config_set({"maxmemory": "0"}))
            await anyio.sleep(RECOVERY)
            peaks["after full"] = await _window(up, 2.0)
        answer = up.answer(Q, words=WORDS)
    texts = [t for r in workers.results for t in r["texts"]]
    errors = [e for r in workers.results for e in r["errors"]]
    assert not errors, errors[:3]
    assert len(texts) > 60 and all(t == answer for t in texts)
    share = WORKERS * max(1, LIMIT // WORKERS)
    assert peaks["steady"] == LIMIT, peaks  # the limit is what holds them back
    for phase in ("killed", "paused", "full"):
        assert peaks[phase] <= share, (phase, peaks)
    assert peaks["flushed"] <= LIMIT, peaks
    for phase in ("after restart", "after pause", "after flush", "after full"):
        # At the limit and not under it: no lease left behind (a late reply, a lost release)
        # holds a slot that no answer uses.
        assert peaks[phase] == LIMIT, (phase, peaks)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_account_limit_holds_through_a_sentinel_failover(tmp_path: Path) -> None:
    """Sentinel moves the primary to its replica while three processes stream under the
    account limit: the fleet follows it (coredis asks Sentinel again), keeps within the limit
    throughout, is back at the limit within ``RECOVERY``, and every answer is exact."""
    servers = RedisSentinelServers(tmp_path)
    servers.create()
    peaks: dict[str, int] = {}
    try:
        async with Upstream(token_delay=DELAY, words=WORDS) as up:
            async with _workers(up.openai_url, servers.url) as workers:
                await _all_seen(servers.url)
                peaks["steady"] = await _window(up, 2.0)
                old = servers.primary
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, servers.fail_over)
                    peaks["failing over"] = await _window(up, 2.0)
                assert servers.primary != old
                await anyio.sleep(RECOVERY)
                peaks["after"] = await _window(up, 2.0)
            answer = up.answer(Q, words=WORDS)
    finally:
        servers.close()
    texts = [t for r in workers.results for t in r["texts"]]
    errors = [e for r in workers.results for e in r["errors"]]
    assert not errors, errors[:3]
    assert len(texts) > 30 and all(t == answer for t in texts)
    assert peaks["steady"] == LIMIT, peaks
    assert peaks["failing over"] <= LIMIT, peaks
    assert peaks["after"] == LIMIT, peaks


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_killed_process_s_slots_are_free_within_a_lease(
    redis_server: RedisServer,
) -> None:
    """A worker holding both slots of an account is killed (SIGKILL: no release); another
    process waits for a slot and gets one when the dead worker's leases lapse — within one
    lease (10 s; it was 30 s), not at the end of the answers it was streaming."""
    import streamres
    from streamres._shell.shared import LEASE

    async with Upstream(token_delay=0.05, words=2000) as up:  # answers of 100 s
        worker = await anyio.open_process(
            [sys.executable, "-c", WORKER, up.openai_url, redis_server.url, "2", "2"]
        )
        try:
            with anyio.fail_after(30):
                while up.in_flight() < 2:  # noqa: ASYNC110 (the upstream's count)
                    await anyio.sleep(0.05)
        finally:
            worker.kill()
            await worker.wait()
        killed = anyio.current_time()
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client(
            [route], account_limits={"acct": 2}, shared=redis_server.url
        ) as client:
            with anyio.fail_after(LEASE + 10):
                async for ev in client.stream(
                    [{"role": "user", "content": "Explain TCP slow start."}], model="m"
                ):
                    if ev.type == "text":
                        break
        waited = anyio.current_time() - killed
    assert 1 < waited <= LEASE + 2, waited  # it did wait: no release came
