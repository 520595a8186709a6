"""A proxy without client keys is private: no web page may start answers on the operator's
upstream keys (a cross-origin POST, a DNS name rebound to 127.0.0.1), bad requests are refused
before they are accepted, and no error a client reads names an upstream's URL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import Upstream
from tests.helpers.answers import Q
from tests.helpers.redis import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(up: Upstream, **server: Any) -> Any:
    raw = {"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}], "server": server}
    return parse(raw, {})


BACKGROUND = {"model": "m", "input": Q[0]["content"], "background": True}


async def test_a_foreign_host_name_is_refused() -> None:
    """Reached on 127.0.0.1 under another name (what a DNS name rebound to 127.0.0.1 sends):
    403 for answers and for the health pages alike, the upstream never asked; loopback names
    pass, and ``[server] allowed_hosts`` opens it to a name."""
    async with Upstream() as up:
        async with running(_config(up), port=0) as run, httpx.AsyncClient(timeout=30) as http:
            port = run.url.rsplit(":", 1)[1]
            for path, method in (("/v1/responses", "POST"), ("/health", "GET")):
                r = await http.request(
                    method,
                    run.url + path,
                    json=BACKGROUND,
                    headers={"host": f"evil.example:{port}"},
                )
                assert r.status_code == 403, (path, r.text)
                assert "allowed_hosts" in r.json()["error"]["message"]
            assert up.requests == []
            for name in ("localhost", "127.0.0.1", "app.localhost"):
                r = await http.get(run.url + "/health", headers={"host": f"{name}:{port}"})
                assert r.status_code == 200, name
        async with (
            running(_config(up, allowed_hosts=["evil.example"]), port=0) as run,
            httpx.AsyncClient(timeout=30) as http,
        ):
            r = await http.get(run.url + "/health", headers={"host": "evil.example"})
            assert r.status_code == 200


async def test_a_web_page_of_another_origin_is_refused() -> None:
    """A page elsewhere POSTs ``text/plain`` (no preflight) to start a background answer: 403
    and nothing runs; the proxy's own page (same origin) is served; ``allowed_origins`` opens
    it to a page."""
    async with Upstream() as up:
        async with running(_config(up), port=0) as run, httpx.AsyncClient(timeout=30) as http:
            data = httpx.Request("POST", "x", json=BACKGROUND).content
            foreign = {"origin": "https://evil.example", "content-type": "text/plain"}
            r = await http.post(run.url + "/v1/responses", content=data, headers=foreign)
            assert r.status_code == 403 and "allowed_origins" in r.text
            assert up.requests == []
            own = await http.post(
                run.url + "/v1/responses", json=BACKGROUND, headers={"origin": run.url}
            )
            assert own.status_code == 200
        async with (
            running(_config(up, allowed_origins=["https://app.example"]), port=0) as run,
            httpx.AsyncClient(timeout=30) as http,
        ):
            r = await http.post(
                run.url + "/v1/responses",
                json=BACKGROUND,
                headers={"origin": "https://app.example"},
            )
            assert r.status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "input": "x", "background": true, "temperature": NaN}',
        b'{"model": "m", "input": "half \\ud800 a pair", "background": true}',
    ],
    ids=["nan", "lone-surrogate"],
)
async def test_a_bad_background_request_is_refused_before_it_is_accepted(body: bytes) -> None:
    """``temperature: NaN`` or a lone surrogate: a 400 saying what is wrong, not an accepted
    background response that fails later — the upstream never asked."""
    async with (
        Upstream() as up,
        running(_config(up), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        r = await http.post(
            run.url + "/v1/responses",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "NaN" in message or "surrogate" in message
        assert up.requests == []


async def test_no_error_names_an_upstream_url() -> None:
    """A route whose server is not there: the client's 502 says the route cannot be reached,
    naming the route, never its URL."""
    port = free_port()
    raw = {"routes": [{"name": "m", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}]}
    async with running(parse(raw, {}), port=0) as run, httpx.AsyncClient(timeout=30) as http:
        for stream in (False, True):
            r = await http.post(
                run.url + "/v1/chat/completions",
                json={"model": "m", "messages": Q, "stream": stream},
            )
            assert r.status_code == 502, r.text
            message = r.json()["error"]["message"]
            assert "route 'm'" in message and "connection refused" in message
            assert str(port) not in message and "http://" not in message
