"""Shared state's URLs for Redis as operators run it — one server, a Redis Cluster, a primary
with Sentinel — read as documented; a cluster reached through one node's plain URL, and a
cluster down at start, against real servers."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import streamres
from streamres._shell.shared.servers import Servers, tagged
from streamres.upstream import Upstream
from tests.helpers.redis import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    connected,
)

pytestmark = pytest.mark.anyio

Q = [{"role": "user", "content": "Explain TCP slow start."}]


@pytest.mark.parametrize(
    ("url", "kind", "nodes", "service", "db", "user", "password", "tls"),
    [
        ("redis://h:6379/0", "server", (), "", 0, None, None, False),
        ("unix:///run/redis.sock?db=2", "server", (), "", 0, None, None, False),
        ("redis+cluster://a:7000,b:7001", "cluster", (("a", 7000), ("b", 7001)), "", 0, None, None, False),
        ("rediss+cluster://:s%40cret@a:7000/0", "cluster", (("a", 7000),), "", 0, None, "s@cret", True),
        ("redis+sentinel://s1:26379,s2:26380/mymaster", "sentinel", (("s1", 26379), ("s2", 26380)), "mymaster", 0, None, None, False),
        ("redis+sentinel://app:pw@[::1]:26379/mymaster/3", "sentinel", (("::1", 26379),), "mymaster", 3, "app", "pw", False),
    ],
)  # fmt: skip
def test_the_documented_url_forms_are_read(
    url: str,
    kind: str,
    nodes: tuple[tuple[str, int], ...],
    service: str,
    db: int,
    user: str | None,
    password: str | None,
    tls: bool,
) -> None:
    got = Servers.parse(url)
    assert (got.kind, got.nodes, got.service, got.db) == (kind, nodes, service, db)
    assert (got.username, got.password, got.tls) == (user, password, tls)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("localhost:6379", "must be a Redis URL"),
        ("redis+cluster://", "at least one host:port"),
        ("redis+cluster://a", "not host:port"),
        ("redis+cluster://a:7000/3", "database 0 only"),
        ("redis+cluster://a:7000?ssl=1", "takes no options"),
        ("redis+sentinel://:hunter2@s:26379", "names the service"),
        ("redis+sentinel://s:26379/m/x", "not a database number"),
    ],
)
def test_a_bad_url_says_what_is_wrong_without_its_password(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        Servers.parse(url)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(streamres.InvalidRequest, match=words):
        streamres.Client([streamres.Route("m", base_url="http://x/v1")], shared=url)


def test_every_key_is_one_hash_tag_unless_the_prefix_has_its_own() -> None:
    assert tagged("streamres") == "{streamres}"
    assert tagged("{fleet}:prod") == "{fleet}:prod"
    # An empty first tag is no tag (Redis hashes the whole key): one is added.
    assert tagged("a{}b}") == "{a{}b}}"


async def _connected_within(client: streamres.Client, seconds: float) -> None:
    status = client.shared_status
    with anyio.fail_after(seconds):
        while not status().connected:  # type: ignore[union-attr]
            await client._limits.changed(0.1)  # type: ignore[union-attr]


async def test_a_cluster_node_s_plain_url_is_named_for_what_it_is(tmp_path: Path) -> None:
    """``redis://`` to one node of a cluster: a warning naming ``redis+cluster://``."""
    from structlog.testing import capture_logs

    cluster = RedisClusterServers(tmp_path)
    cluster.create()
    try:
        async with Upstream() as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k")
            one = f"redis://127.0.0.1:{cluster.ports[0]}/0"
            with capture_logs() as logs:
                async with streamres.Client([route], shared=one) as client:
                    async for _ in client.stream(Q, model="m"):
                        pass
    finally:
        cluster.close()
    warned = [e for e in logs if e["event"] == "streamres.shared_url_is_a_cluster_node"]
    assert len(warned) == 1 and "redis+cluster://" in warned[0]["hint"]


async def test_a_cluster_down_at_start_is_joined_when_it_comes_up(tmp_path: Path) -> None:
    """A cluster client cannot be entered while no node answers (one server's can): the
    client starts on its own limits, answers all the same, and joins the cluster once it is
    up — its slots then counted in the cluster."""
    cluster = RedisClusterServers(tmp_path)
    cluster.create()
    cluster.stop()
    try:
        async with Upstream(token_delay=0.05) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
            async with streamres.Client(
                [route], shared=cluster.url, account_limits={"acct": 2}
            ) as client:
                assert not client.shared_status().connected  # type: ignore[union-attr]
                text = ""
                async for ev in client.stream(Q, model="m"):
                    text += ev.text if ev.type == "text" else ""
                assert text == up.answer(Q)
                cluster.start()
                await _connected_within(client, 20)
                async with anyio.create_task_group() as tg:
                    stream = client.stream(Q, model="m")
                    tg.start_soon(anext, stream)  # a slot taken, in the cluster
                    async with connected(cluster.url, decode_responses=True) as redis:
                        key = "{streamres}:slots:account:acct"
                        with anyio.fail_after(10):
                            while await redis.zcard(key) < 1:  # noqa: ASYNC110 (Redis's state)
                                await anyio.sleep(0.05)
                await stream.aclose()
    finally:
        cluster.close()


async def test_a_client_left_by_an_exception_gives_its_slots_back(
    redis_server: RedisServer,
) -> None:
    """The block around a client raises while an answer holds a slot: the slot is back in
    Redis when the block is left, not when its lease lapses; and the answer closed afterwards
    closes quietly (it raised ``ClosedResourceError``, from the client's closed outbox)."""
    async with Upstream(token_delay=0.05) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        key = "{streamres}:slots:account:acct"
        async with connected(redis_server.url, decode_responses=True) as redis:
            with pytest.raises(RuntimeError, match="the caller's own"):
                async with streamres.Client(
                    [route], shared=redis_server.url, account_limits={"acct": 2}
                ) as client:
                    stream = client.stream(Q, model="m")
                    await anext(stream)
                    assert await redis.zcard(key) == 1
                    raise RuntimeError("the caller's own")
            assert await redis.zcard(key) == 0
            await stream.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
async def test_a_password_in_the_url_reaches_the_servers(kind: str, tmp_path: Path) -> None:
    """Managed Redis has a password: given in a cluster or Sentinel URL, it opens the data
    servers (``--requirepass``; Sentinel told it with ``auth-pass``); the client's slot is
    counted there, and the password is in no log line."""
    from structlog.testing import capture_logs

    secret = "s3cret-pw"
    servers = (RedisClusterServers if kind == "cluster" else RedisSentinelServers)(
        tmp_path, password=secret
    )
    servers.create()
    try:
        async with Upstream(token_delay=0.05) as up:
            route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
            with capture_logs() as logs:
                async with streamres.Client(
                    [route], shared=servers.url, account_limits={"acct": 2}
                ) as client:
                    assert client.shared_status().connected  # type: ignore[union-attr]
                    assert secret not in client.shared_status().url  # type: ignore[union-attr]
                    stream = client.stream(Q, model="m")
                    await anext(stream)
                    async with connected(servers.url, decode_responses=True) as redis:
                        assert await redis.zcard("{streamres}:slots:account:acct") == 1
                    await stream.aclose()
    finally:
        servers.close()
    assert secret not in repr(logs)
