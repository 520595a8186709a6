"""Shared state on a real ``redis-server``: limits that hold across processes, breakers that
open for all, and streams that go on when Redis goes away."""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamres
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.redis import EVERY_REDIS, EVERY_REDIS_ASYNCIO, RedisServer, free_port
from tests.helpers.redis import Servers as RedisServers

pytestmark = pytest.mark.anyio
Q = [{"role": "user", "content": "Explain TCP slow start."}]


WORKER = textwrap.dedent(
    """
    import json, sys, anyio, streamres
    url, shared, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    Q = [{"role": "user", "content": "Explain TCP slow start."}]
    async def main():
        route = streamres.Route("m", base_url=url, api_key="k", account="acct")
        async with streamres.Client(
            [route], account_limits={"acct": 10}, shared=shared or None, deadline=120,
            backoff=streamres.Backoff(initial=0.05, maximum=0.5),
        ) as client:
            texts = []
            async def one():
                text = ""
                async for ev in client.stream(Q, model="m"):
                    if ev.type == "text":
                        text += ev.text
                texts.append(text)
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(one)
            print(json.dumps(texts))
    anyio.run(main)
    """
)


async def _text(client: streamres.Client) -> str:
    """One answer's text, streamed from model ``m``."""
    text = ""
    async for ev in client.stream(Q, model="m"):
        if ev.type == "text":
            text += ev.text
    return text


async def _workers(url: str, shared: str, workers: int, streams: int) -> list[str]:
    async def run(out: list[str]) -> None:
        done = await anyio.run_process(
            [sys.executable, "-c", WORKER, url, shared, str(streams)], check=True
        )
        out.extend(json.loads(done.stdout))

    texts: list[str] = []
    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(run, texts)
    return texts


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the workers are processes of their own
@EVERY_REDIS_ASYNCIO
async def test_an_account_quota_holds_across_four_processes(redis_servers: RedisServers) -> None:
    """4 processes × 50 streams, an account quota of 10: with shared state the upstream never
    serves more than 10 at once, and every answer is exact; each process alone keeps its own
    10, so without sharing the upstream sees up to 40. On one Redis, Valkey, a Redis Cluster
    and a primary with Sentinel alike."""
    async with Upstream(token_delay=0.01, words=30) as up:
        texts = await _workers(up.openai_url, redis_servers.url, 4, 50)
        shared_peak = up.peak_in_flight()
        want = up.answer(Q, words=30)
    async with Upstream(token_delay=0.01, words=30) as up:
        await _workers(up.openai_url, "", 4, 50)
        alone_peak = up.peak_in_flight()
    print(f"peak in flight at the upstream: shared {shared_peak}, per process {alone_peak}")
    assert len(texts) == 200 and all(t == want for t in texts)
    assert shared_peak <= 10 < alone_peak


@EVERY_REDIS
async def test_a_model_jammed_for_one_process_opens_for_all(redis_servers: RedisServers) -> None:
    """Three failures open the breaker in one client: another client (a process of its own
    would do the same) refuses that model as soon as the news arrives, and a client started
    later reads it too."""
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("503*50"))}) as up:
        routes = [streamres.Route("m", base_url=up.openai_url, api_key="k")]
        kw: dict[str, Any] = {"shared": redis_servers.url, "breaker_recovery": 60.0}
        async with streamres.Client(routes, **kw) as a, streamres.Client(routes, **kw) as b:
            with pytest.raises(streamres.StreamError):
                async for _ in a.stream(Q, model="m", max_attempts=3, deadline=20):
                    pass
            assert a.metrics()["m"].breaker == "open"
            with anyio.fail_after(2):
                while b.metrics()["m"].breaker != "open":
                    await b._limits.changed(0.1)  # type: ignore[union-attr]
            async with streamres.Client(routes, **kw) as c:
                assert c.metrics()["m"].breaker == "open"
        requests = len(up.requests)
    assert requests == 3  # b and c never sent one


async def test_a_first_token_limit_learnt_in_one_process_serves_another(
    redis_server: RedisServer,
) -> None:
    """One client learns that model a starts its answers in well under a second; another
    client sharing Redis, which never asked a, finds a suddenly silent after its headers and
    moves to the fallback after the fleet's learnt limit (8 s) — not its own first-output
    minute, which it would wait alone."""
    models = {"a": ModelSpec(faults=FaultPlan()), "b": ModelSpec()}
    async with Upstream(models=models, stall_seconds=300) as up:
        routes = [
            streamres.Route("a", base_url=up.openai_url, api_key="k"),
            streamres.Route("b", base_url=up.openai_url, api_key="k"),
        ]
        kw: dict[str, Any] = {"shared": redis_server.url, "deadline": 90}
        async with streamres.Client(routes, **kw) as one, streamres.Client(routes, **kw) as two:
            for _ in range(6):
                async for ev in one.stream(Q, model=["a", "b"]):
                    if ev.type == "done":
                        assert ev.model == "a"
            for client in (one, two):
                await client._shared_state.sync_metrics()  # type: ignore[union-attr]
            assert two.metrics()["a"].requests == 0  # nothing learnt here
            faults = up.models["a"].faults
            assert faults is not None
            faults.push("stall@0")  # headers, then keep-alives only
            events = [ev async for ev in two.stream(Q, model=["a", "b"])]
    done = events[-1]
    assert isinstance(done, streamres.DoneEvent)
    assert done.text == up.answer(Q) and done.model == "b"
    assert done.history[0].outcome == "stall" and done.elapsed < 30


@EVERY_REDIS
async def test_weights_and_metrics_are_the_fleets(redis_servers: RedisServers) -> None:
    """Two capacity errors on a model in one client lower its weight in another (and in one
    started later) to the same value; each client's metrics are its own, the fleet's are the
    sum over both."""
    models = {"a": ModelSpec(faults=FaultPlan("503*2")), "b": ModelSpec()}
    async with Upstream(models=models) as up:
        routes = [
            streamres.Route("a", base_url=up.openai_url, api_key="k"),
            streamres.Route("b", base_url=up.openai_url, api_key="k"),
        ]
        kw: dict[str, Any] = {"shared": redis_servers.url, "backoff": streamres.Backoff(0.01)}
        async with streamres.Client(routes, **kw) as a, streamres.Client(routes, **kw) as b:
            async for _ in a.stream(Q, model="a", fallback=False):
                pass
            ours = a.metrics()["a"].weight
            assert ours == pytest.approx(1 - 0.51 * 0.75)  # x0.7 twice, then a quarter back
            with anyio.fail_after(2):
                while abs(b.metrics()["a"].weight - ours) > 1e-9:
                    await b._limits.changed(0.1)  # type: ignore[union-attr]
            async for _ in b.stream(Q, model="b", fallback=False):
                pass
            for client in (a, b, a):
                await client._shared_state.sync_metrics()  # type: ignore[union-attr]
            fleet = a.fleet_metrics()
            assert (fleet["a"].requests, fleet["a"].capacity_errors, fleet["b"].requests) == (
                3,
                2,
                1,
            )
            assert (a.metrics()["b"].requests, b.metrics()["a"].requests) == (0, 0)
            # The trends are the fleet's too: a's three attempts on a, b's one on b, by bucket.
            trend_a, trend_b = fleet["a"].trend, fleet["b"].trend
            assert sum(p.requests for p in trend_a) == 3 and sum(p.requests for p in trend_b) == 1
            assert sum(p.requests for p in b.metrics()["b"].trend) == 1
            assert b.metrics()["a"].trend == ()  # b alone never asked a
            from prometheus_client import CollectorRegistry, generate_latest

            from streamres.prometheus import register

            registry = CollectorRegistry()
            register(a, registry, fleet=True)
            scraped = generate_latest(registry).decode()
            assert 'streamres_requests_total{model="b"} 1.0' in scraped
            assert 'streamres_last_minute_requests{model="a"} 3.0' in scraped
            async with streamres.Client(routes, **kw) as c:
                assert c.metrics()["a"].weight == pytest.approx(ours)
        async with streamres.Client(routes) as alone:
            assert alone.fleet_metrics()["a"].requests == 0


async def test_damaged_news_on_the_channel_is_ignored(redis_server: RedisServer) -> None:
    """Messages on the fleet's channel that are not its news (not JSON, not an object) change
    nothing: Redis stays reachable, and the next real news is applied."""
    import coredis

    route = streamres.Route("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    async with (
        streamres.Client([route], shared=redis_server.url) as client,
        coredis.Redis.from_url(redis_server.url, decode_responses=True) as r,
    ):
        for junk in ("not json", "[1, 2]", "null", '{"kind": "weight", "route": "m"}'):
            await r.publish("streamres:events", junk)
        await r.publish("streamres:events", '{"kind": "weight", "route": "m", "weight": 0.5}')
        with anyio.fail_after(5):
            while client.metrics()["m"].weight != 0.5:
                await client._limits.changed(0.1)  # type: ignore[union-attr]
        status = client.shared_status()
        assert status is not None and status.connected


async def test_streams_go_on_when_redis_goes_away_and_rejoin(redis_server: RedisServer) -> None:
    """Redis killed while answers stream and new ones start: every answer is exact, health
    says why limits are local, and once Redis is back the state is shared again."""
    async with Upstream(token_delay=0.005, words=40) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", max_in_flight=3)
        async with streamres.Client([route], shared=redis_server.url) as client:
            texts: list[str] = []

            async def one() -> None:
                texts.append(await _text(client))

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(one)
                    if i == 4:
                        redis_server.stop()
            status = client.shared_status()
            assert status is not None and not status.connected and status.local_fallbacks > 0
            assert any("shared state unavailable" in r for r in client.health()["m"].reasons)
            redis_server.start()
            with anyio.fail_after(5):
                while not client.shared_status().connected:  # type: ignore[union-attr]
                    await client._limits.changed(0.2)  # type: ignore[union-attr]
            assert not any("shared" in r for r in client.health()["m"].reasons)
            await one()
        assert len(texts) == 13 and all(t == up.answer(Q, words=40) for t in texts)
        assert up.peak_in_flight() <= 3


async def test_a_redis_slow_to_answer_at_start_is_waited_for(redis_server: RedisServer) -> None:
    """A machine busy starting many processes: Redis answers the first calls (connecting,
    loading the scripts) only after 0.8 s — past a stream's 0.25 s bound. The client waits for
    them (their own patience) and starts on the fleet's limits, not on local ones."""
    import socket

    host, port = "127.0.0.1", int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    opened = anyio.current_time()

    async def forward(client: anyio.abc.SocketStream) -> None:
        await anyio.sleep_until(opened + 0.8)  # the slow start itself, not a synchronisation
        async with client, await anyio.connect_tcp(host, port) as server:

            async def pump(a: anyio.abc.SocketStream, b: anyio.abc.SocketStream) -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    async for chunk in a:
                        await b.send(chunk)

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, client, server)
                tg.start_soon(pump, server, client)

    listener = await anyio.create_tcp_listener(local_host=host, family=socket.AF_INET)
    slow = f"redis://{host}:{listener.extra(anyio.abc.SocketAttribute.local_port)}/0"
    async with Upstream() as up, listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, forward)
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", max_in_flight=2)
        async with streamres.Client([route], shared=slow) as client:
            assert await _text(client) == up.answer(Q)
            status = client.shared_status()
            assert status is not None and status.connected and status.local_fallbacks == 0
        tg.cancel_scope.cancel()


async def test_round_trips_per_stream_on_the_fault_free_path(redis_server: RedisServer) -> None:
    """A warm answer under a shared limit costs two Redis round trips: one script takes the
    slot, one gives it back. Counted by the client, by script, and by the server (top-level
    script calls: the once-a-second metrics sync may fall in the window, and is told apart)."""
    import coredis

    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", max_in_flight=2)
        probe = coredis.Redis.from_url(redis_server.url, decode_responses=True)
        async with (
            probe,
            probe.pubsub(channels=["streamres:events"]) as releases,
            streamres.Client([route], shared=redis_server.url) as client,
        ):
            state = client._shared_state
            assert state is not None
            async for _ in client.stream(Q, model="m"):  # loads the scripts
                pass
            await _released(releases)
            before, ours = await _calls(probe), collections.Counter(state.calls)
            async for _ in client.stream(Q, model="m"):
                pass
            await _released(releases)
            after, made = await _calls(probe), collections.Counter(state.calls) - ours
    used = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert made - collections.Counter({"metrics": made["metrics"]}) == collections.Counter(
        {"acquire": 1, "release": 1}
    ), made
    assert used.get("cmdstat_evalsha") == sum(made.values()), (used, made)
    assert not used.get("cmdstat_eval") and not used.get("cmdstat_script"), used


async def _calls(r: Any) -> dict[str, int]:
    stats = await r.info("commandstats")
    return {k: int(v["calls"]) for k, v in stats.items()}


async def _released(pubsub: Any) -> None:
    """The release is sent in the background: wait for its announcement."""
    with anyio.fail_after(5):
        async for message in pubsub:
            data = message.get("data")
            if message.get("type") == "message" and json.loads(data).get("kind") == "slot":
                return


def test_shared_state_without_its_client_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "coredis" else real(name, *a)
    )
    with pytest.raises(streamres.InvalidRequest, match=r"pip install 'streamres\[shared\]'"):
        streamres.Client(
            [streamres.Route("m", base_url="http://127.0.0.1:9/v1", api_key="k")],
            shared="redis://127.0.0.1:1/0",
        )
    from streamres._apps import cli

    monkeypatch.setattr(cli, "_configure_logs", lambda verbose: None)  # the app's, not ours
    assert cli.main(["proxy", "--redis", "redis://127.0.0.1:1/0", "--port", "0"]) == 2
    assert "pip install 'streamres[shared]'" in capsys.readouterr().err


def test_a_shared_url_is_checked_at_construction() -> None:
    """A Client with shared= that is not a Redis URL: InvalidRequest at once."""
    with pytest.raises(streamres.InvalidRequest, match="Redis URL"):
        streamres.Client([streamres.Route("m", base_url="http://x/v1")], shared="localhost")


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(offsets=st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.01]), min_size=3, max_size=3))
async def test_one_half_open_probe_across_processes(
    redis_server: RedisServer, offsets: list[float]
) -> None:
    """Three clients (processes of their own would do the same) find a jammed model's circuit
    half-open at the same moment, each starting at a drawn offset: one probe reaches the
    upstream; the others wait for its outcome instead of sending probes of their own."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("503*100"))}) as up:
        routes = [streamres.Route("m", base_url=up.openai_url, api_key="k")]
        kw: dict[str, Any] = {
            "shared": redis_server.url,
            "shared_prefix": prefix,
            "breaker_threshold": 1,
            "breaker_recovery": 1.0,
        }
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(streamres.Client(routes, **kw)) for _ in range(3)
            ]
            with pytest.raises(streamres.StreamError):
                async for _ in clients[0].stream(Q, model="m", max_attempts=1):
                    pass
            with anyio.fail_after(2):  # the news reaches the other two
                for c in clients[1:]:
                    while c.metrics()["m"].breaker != "open":
                        await c._limits.changed(0.1)  # type: ignore[union-attr]
            before = len(up.requests)
            await anyio.sleep(1.0)  # the circuit's recovery time: now it is half-open everywhere

            async def probe(client: streamres.Client, offset: float) -> None:
                await anyio.sleep(offset)
                with contextlib.suppress(streamres.StreamError):
                    async for _ in client.stream(Q, model="m", deadline=0.25):
                        pass

            async with anyio.create_task_group() as tg:
                for client, offset in zip(clients, offsets, strict=True):
                    tg.start_soon(probe, client, offset)
        assert len(up.requests) - before == 1


async def _proxy_answers(url: str, n: int, want: str) -> int:
    """``n`` streamed answers through the proxy at once, each on its own connection; how many
    came out exact."""
    body = {"model": "m", "messages": Q, "stream": True}
    exact = 0

    async def one() -> None:
        nonlocal exact
        transport = httpx.AsyncHTTPTransport(retries=20)  # the workers may still be starting
        async with (
            httpx.AsyncClient(transport=transport, timeout=60) as http,
            http.stream("POST", url + "/v1/chat/completions", json=body) as r,
        ):
            text = ""
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices") or []:
                        text += (choice.get("delta") or {}).get("content") or ""
        exact += text == want

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return exact


async def _fleet_requests(base: str, model: str, wanted: int) -> bool:
    """Read the proxy's health stream (an event a second) until ``model`` shows ``wanted``
    requests (the workers sync their figures every second)."""
    async with httpx.AsyncClient(timeout=None) as http:
        with anyio.fail_after(10):
            async with http.stream("GET", f"{base}/health/stream") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        health = json.loads(line[6:])
                        if health["models"][model]["requests"] == wanted:
                            return True
    return False


async def test_proxy_workers_share_an_account_limit(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """`streamres proxy --workers 2 --redis URL`: 24 streams spread over two worker processes
    keep an account's limit of 4 at the upstream; every answer exact; /metrics counts the
    requests of both workers."""
    peaks = {}
    for label, redis in (("shared", redis_server.url), ("per worker", None)):
        async with Upstream(token_delay=0.01, words=30) as up:
            config = tmp_path / "routes.toml"
            config.write_text(
                f'[[routes]]\nname = "m"\nmodel = "m"\nbase_url = "{up.openai_url}"\n'
                'account = "acct"\n\n[accounts]\nacct = 4\n',
                encoding="utf-8",
            )
            port = free_port()
            argv = [
                sys.executable,
                "-m",
                "streamres",
                "proxy",
                "--config",
                str(config),
                "--workers",
                "2",
                "--port",
                str(port),
            ]
            if redis:
                argv += ["--redis", redis]
            proc = await anyio.open_process(argv)
            try:
                base = f"http://127.0.0.1:{port}"
                exact = await _proxy_answers(base, 24, up.answer(Q, words=30))
                if redis:  # whichever worker answers counts both workers' requests
                    assert await _fleet_requests(base, "m", len(up.requests))
            finally:
                proc.terminate()
                await proc.wait()
                await proc.aclose()
            assert exact == 24
            peaks[label] = up.peak_in_flight()
    print(f"peak in flight at the upstream (limit 4): {peaks}")
    assert peaks["shared"] <= 4


@EVERY_REDIS
async def test_the_retry_budget_is_one_for_every_process(redis_servers: RedisServers) -> None:
    """A budget of one retry token (no refill to speak of): one client's retry spends it, so
    another client's retry finds none and gives up instead of retrying — 3 requests at the
    upstream, where two budgets of their own would have made 4."""
    budget = {"ratio": 0.0, "floor": 0.01, "cap": 1.0, "balance": 1.0}
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("503*100"))}) as up:
        routes = [streamres.Route("m", base_url=up.openai_url, api_key="k")]
        fast = streamres.Backoff(initial=0.01, maximum=0.02)
        clients = [
            streamres.Client(
                routes,
                shared=redis_servers.url,
                shared_prefix=f"b{uuid.uuid4().hex[:8]}",
                retry_budget=streamres.RetryBudget(**budget),
                breaker_threshold=100,
                backoff=fast,
            )
        ]
        clients.append(
            streamres.Client(
                routes,
                shared=redis_servers.url,
                shared_prefix=clients[0]._shared_prefix,
                retry_budget=streamres.RetryBudget(**budget),
                breaker_threshold=100,
                backoff=fast,
            )
        )
        async with clients[0] as a, clients[1] as b:
            for client in (a, b):
                with pytest.raises(streamres.StreamError):
                    async for _ in client.stream(Q, model="m", max_attempts=2, deadline=3):
                        pass
        assert len(up.requests) == 3


async def test_the_fleet_s_budget_banks_what_its_first_attempts_paid_for(
    redis_server: RedisServer,
) -> None:
    """The shared bucket follows the same rule as one process's: 2,000 first attempts across
    the fleet bank 400 retries (the cap grows with them), the 401st waits."""
    import coredis

    from streamres._shell.shared.budget import _BUDGET

    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as redis:
        script = redis.register_script(_BUDGET)
        # ratio, floor, cap, initial balance, window: a floor of one token per 1,000 s and a
        # window of years, so the time the 401 calls take (on a busy machine, seconds) refills
        # and forgets next to nothing
        args = [0.2, 0.001, 10.0, 10.0, 1e9]
        await script(keys=["b:budget"], args=["deposit", *args, 2000])
        waits = [
            float(await script(keys=["b:budget"], args=["reserve", *args])) for _ in range(401)
        ]
    assert max(waits[:400]) < 1e-3 and waits[400] > 500


async def test_the_limit_holds_through_a_redis_restart_that_loses_every_lease(
    redis_server: RedisServer,
) -> None:
    """Two answers hold an account's two slots; Redis dies, an answer started meanwhile waits
    for one of them (this process counts what it holds); Redis comes back **empty**, and the
    process puts its slots back, so the ones started after still wait their turn. The
    upstream never serves more than two at once, and every answer is exact."""
    import coredis

    slots = "{streamres}:slots:account:acct"
    async with Upstream(token_delay=0.02, words=120) as up:  # answers of 2.5 s and more
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client(
            [route], account_limits={"acct": 2}, shared=redis_server.url, deadline=60
        ) as client:
            texts: list[str] = []

            async def one() -> None:
                texts.append(await _text(client))

            def status() -> streamres.SharedStatus:
                got = client.shared_status()
                assert got is not None
                return got

            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(one)
                with anyio.fail_after(10):
                    while up._counters.in_flight.get("m", 0) < 2:  # noqa: ASYNC110 (the server's)
                        await anyio.sleep(0.01)
                redis_server.stop()
                with anyio.fail_after(10):
                    while status().connected:
                        await client._limits.changed(0.1)  # type: ignore[union-attr]
                tg.start_soon(one)  # while Redis is away: waits for one of the two
                redis_server.start()  # empty: no persistence
                with anyio.fail_after(10):
                    while not status().connected:
                        await client._limits.changed(0.1)  # type: ignore[union-attr]
                redis = coredis.Redis.from_url(redis_server.url, decode_responses=True)
                async with redis:
                    held = await redis.zcard(slots)
                for _ in range(3):
                    tg.start_soon(one)
            assert held >= 1  # what the process held is back in Redis
        assert texts == [up.answer(Q, words=120)] * 6
        assert up.peak_in_flight() <= 2


async def test_during_an_outage_each_process_keeps_its_share_of_the_limit(
    redis_server: RedisServer,
) -> None:
    """Three clients (as three processes) share an account limit of 6 through Redis; Redis
    dies; each falls back to its share — 6 divided by the 3 processes it last saw — so the
    upstream serves at most 6 at once, not 18; every answer is exact, and the share goes back
    to Redis's limit when it returns."""
    async with Upstream(token_delay=0.02, words=60) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    streamres.Client(
                        [route], account_limits={"acct": 6}, shared=redis_server.url, deadline=60
                    )
                )
                for _ in range(3)
            ]
            states = [c._shared_state for c in clients]
            with anyio.fail_after(10):  # each has seen the other two (metrics, once a second)
                while any(s is None or len(s.others) < 2 for s in states):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            redis_server.stop()
            texts: list[str] = []

            async def one(client: streamres.Client) -> None:
                texts.append(await _text(client))

            async with anyio.create_task_group() as tg:
                for i in range(30):
                    tg.start_soon(one, clients[i % 3])
            assert all(s is not None and not s.connected for s in states)
            assert {s._accounts["acct"].size for s in states if s is not None} == {2}
        assert texts == [up.answer(Q, words=60)] * 30
        assert up.peak_in_flight() <= 6


async def test_a_redis_out_of_memory_is_one_outage_not_a_flapping_one(
    redis_server: RedisServer,
) -> None:
    """Redis full (``maxmemory`` with ``noeviction``: writes refused, pings answered): the
    process goes to its own limits once and stays there — one warning, not one a second — and
    rejoins when Redis takes writes again."""
    import coredis
    from structlog.testing import capture_logs

    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        redis = coredis.Redis.from_url(redis_server.url, decode_responses=True)
        async with (
            redis,
            streamres.Client([route], account_limits={"acct": 2}, shared=redis_server.url) as c,
        ):
            status = c.shared_status
            with capture_logs() as logs:
                await redis.set("ballast", "x" * 2_000_000)
                await redis.config_set({"maxmemory": "1mb", "maxmemory-policy": "noeviction"})
                with anyio.fail_after(10):
                    while status().connected:  # type: ignore[union-attr]
                        await c._limits.changed(0.1)  # type: ignore[union-attr]
                # Three rejoin checks' worth of time: still away, still one warning.
                with anyio.move_on_after(3.5):
                    while not status().connected:  # type: ignore[union-attr]
                        await c._limits.changed(0.1)  # type: ignore[union-attr]
                assert not status().connected  # type: ignore[union-attr]
                await redis.delete(["ballast"])
                await redis.config_set({"maxmemory": "0"})  # room again
                with anyio.fail_after(10):
                    while not status().connected:  # type: ignore[union-attr]
                        await c._limits.changed(0.1)  # type: ignore[union-attr]
            async for _ in c.stream(Q, model="m"):
                pass
    events = [e["event"] for e in logs]
    assert events.count("streamres.shared_unavailable") == 1, events
    assert events.count("streamres.shared_rejoined") == 1
