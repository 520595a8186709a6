"""``streamres proxy`` with the official SDKs as its clients, while the upstream breaks."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import openai
import pytest
import structlog

import streamres
from streamres.proxy import Config, ConfigError, running
from streamres.proxy.config import HoldLimits, parse
from streamres.upstream import FaultPlan, ModelSpec, Upstream, split_tokens
from tests.helpers.chat_ui import AFTER_TOOLS, TOOLS
from tests.helpers.node import node_env

pytestmark = pytest.mark.anyio
Q = [{"role": "user", "content": "Explain TCP slow start."}]
SAMPLE_ROUTES = (Path(__file__).resolve().parents[2] / "demos" / "routes.toml").read_text("utf-8")
WRITE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the official SDKs and uvicorn run on asyncio


_MADE: list[Any] = []


def oai(**kw: Any) -> openai.AsyncOpenAI:
    """An OpenAI SDK client, closed after the test."""
    client = openai.AsyncOpenAI(**kw)
    _MADE.append(client)
    return client


def anth(**kw: Any) -> anthropic.AsyncAnthropic:
    """An Anthropic SDK client, closed after the test."""
    client = anthropic.AsyncAnthropic(**kw)
    _MADE.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_sdk_clients() -> AsyncIterator[None]:
    yield
    while _MADE:
        await _MADE.pop().close()


def _upstream_answer(up: Upstream) -> str:
    return up.answer(Q)


async def _openai_text(url: str, model: str = "demo", **kw: Any) -> tuple[str, Any]:
    sdk = oai(base_url=url + "/v1", api_key="k")
    stream = await sdk.chat.completions.create(
        model=model, messages=Q, stream=True, stream_options={"include_usage": True}, **kw
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, (usage, finish)


async def test_openai_sdk_streams_the_exact_answer_through_mid_stream_faults() -> None:
    """An in-band error after 20 tokens and a reset after 40: the SDK's text is the upstream's
    whole answer, with usage and a finish reason, and it made one request (no SDK retry)."""
    async with running(port=0, faults="error@20,reset@40", token_delay=0) as run:
        assert run.upstream is not None
        text, (usage, finish) = await _openai_text(run.url)
        assert text == _upstream_answer(run.upstream)
        assert finish == "stop" and usage is not None and usage.completion_tokens > 0
        assert [r[0] for r in run.proxy.requests] == ["/v1/chat/completions"]
        assert len(run.upstream.requests) == 3  # the proxy resumed twice


async def test_anthropic_sdk_streams_the_exact_answer_served_by_an_openai_model() -> None:
    """An Anthropic client, OpenAI-format models behind: the message events accumulate to the
    exact answer through a 529 and a reset."""
    async with running(port=0, faults="529,reset@30", token_delay=0) as run:
        assert run.upstream is not None
        sdk = anth(base_url=run.url, api_key="k")
        async with sdk.messages.stream(model="demo", max_tokens=4000, messages=Q) as stream:
            message = await stream.get_final_message()
        assert message.content[0].text == _upstream_answer(run.upstream)  # type: ignore[union-attr]
        assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
        assert len(run.proxy.requests) == 1


async def test_responses_api_stream_and_final_response() -> None:
    """The Responses API: the deltas and the completed response's output_text are exact."""
    async with running(port=0, faults="reset@25", token_delay=0) as run:
        assert run.upstream is not None
        sdk = oai(base_url=run.url + "/v1", api_key="k")
        stream = await sdk.responses.create(model="demo", input=Q[0]["content"], stream=True)
        deltas, final = "", None
        async for ev in stream:
            if ev.type == "response.output_text.delta":
                deltas += ev.delta
            elif ev.type == "response.completed":
                final = ev.response
        assert deltas == _upstream_answer(run.upstream)
        assert final is not None and final.output_text == deltas


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
async def test_not_streamed_answers_are_whole(api: str) -> None:
    """stream=false in each API: one JSON answer with the exact text, after the faults."""
    async with running(port=0, faults="error@15", token_delay=0) as run:
        assert run.upstream is not None
        want = _upstream_answer(run.upstream)
        if api == "openai":
            sdk = oai(base_url=run.url + "/v1", api_key="k")
            r = await sdk.chat.completions.create(model="demo", messages=Q)
            got = r.choices[0].message.content
        elif api == "anthropic":
            a = anth(base_url=run.url, api_key="k")
            m = await a.messages.create(model="demo", max_tokens=4000, messages=Q)
            got = m.content[0].text  # type: ignore[union-attr]
        else:
            sdk = oai(base_url=run.url + "/v1", api_key="k")
            resp = await sdk.responses.create(model="demo", input=Q[0]["content"])
            got = resp.output_text
        assert got == want


async def test_tool_calls_arrive_whole_through_a_fault_in_their_arguments() -> None:
    """A reset two pieces into a tool call's arguments: the SDK's accumulated call is whole
    (its arguments parse), and the text before it exact."""
    async with Upstream() as probe:
        cut = len(split_tokens(probe.answer(Q))) + 2
    async with running(port=0, faults=f"reset@{cut}", token_delay=0) as run:
        assert run.upstream is not None
        sdk = oai(base_url=run.url + "/v1", api_key="k")
        stream = await sdk.chat.completions.create(
            model="demo-large", messages=Q, stream=True, tools=[WRITE]
        )
        text, calls, finish = "", {}, None
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    got = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    got["name"] += tc.function.name or ""  # type: ignore[union-attr]
                    got["arguments"] += tc.function.arguments or ""  # type: ignore[union-attr]
                finish = choice.finish_reason or finish
        assert text == run.upstream.answer(Q)
        assert finish == "tool_calls" and [c["name"] for c in calls.values()] == ["write_file"]
        args = json.loads(calls[0]["arguments"])
        assert sorted(args) == ["content", "path"] and all(
            isinstance(v, str) for v in args.values()
        )
        assert len(run.upstream.requests) == 2


async def test_a_break_after_tool_results_adds_no_tool_round_through_the_proxy() -> None:
    """A chat UI's request (many tools offered, the history ending in the tools' results),
    broken mid-answer: the OpenAI SDK gets the uncut answer's text and no tool call — the
    continuation's run of the same round again is not handed on."""

    async def ask(run: Any) -> tuple[str, list[str], str | None]:
        sdk = oai(base_url=run.url + "/v1", api_key="k")
        stream = await sdk.chat.completions.create(
            model="demo", messages=AFTER_TOOLS, stream=True, tools=TOOLS
        )
        text, names, finish = "", [], None
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                names += [tc.function.name for tc in choice.delta.tool_calls or [] if tc.function]
                finish = choice.finish_reason or finish
        return text, [n for n in names if n], finish

    async with running(port=0, token_delay=0) as run:
        uncut = await ask(run)
    async with running(port=0, faults="reset@30", token_delay=0) as run:
        assert run.upstream is not None
        broken = await ask(run)
        assert len(run.upstream.requests) == 2
    assert uncut == (run.upstream.answer(AFTER_TOOLS), [], "stop")
    assert broken == uncut


async def test_an_openai_client_served_by_an_anthropic_model() -> None:
    """Routes of the other provider: an OpenAI SDK client, a Claude-shaped upstream."""
    async with Upstream(models={"claude": ModelSpec(faults=FaultPlan("error@20"))}) as up:
        route = streamres.Route(
            "claude", provider="anthropic", base_url=up.anthropic_url, api_key="k"
        )
        config = Config(routes=[route], models={"claude": ["claude"]})
        async with running(config, port=0) as run:
            text, _ = await _openai_text(run.url, model="claude")
        assert text == up.answer(Q)


async def test_an_answer_that_stopped_at_the_seam_says_so_before_its_end() -> None:
    """A model that will not continue after a break: the client's stream ends normally, and
    just before its end a comment says the answer is incomplete (join=ended_at_seam)."""
    models = {"m": ModelSpec(faults=FaultPlan("reset@20"), instruct="shorter")}
    async with Upstream(models=models) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", continuation="instruct")
        config = Config(routes=[route], models={"m": ["m"]})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=60) as http:
            body = {"model": "m", "messages": Q, "stream": True}
            got = await http.post(f"{run.url}/v1/chat/completions", json=body)
    raw = got.text
    assert ": streamres join=ended_at_seam complete=false" in raw
    assert raw.index("join=ended_at_seam") < raw.index('"finish_reason":"stop"')
    assert raw.rstrip().endswith("data: [DONE]")


# -- what a client gets wrong -------------------------------------------------------------------


async def test_bad_input_is_answered_in_the_callers_own_error_format() -> None:
    """Malformed JSON 400, unknown model 404 — as each SDK's own error types, not retried."""
    async with running(port=0, faults="none", token_delay=0) as run:
        async with httpx.AsyncClient() as http:
            r = await http.post(run.url + "/v1/chat/completions", content=b"{not json")
            assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
            r = await http.post(run.url + "/v1/messages", content=b"[]")
            assert r.status_code == 400 and r.json()["type"] == "error"
        sdk = oai(base_url=run.url + "/v1", api_key="k", max_retries=2)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await sdk.chat.completions.create(model="gpt-9", messages=Q)
        a = anth(base_url=run.url, api_key="k")
        with pytest.raises(anthropic.NotFoundError):
            await a.messages.create(model="gpt-9", max_tokens=10, messages=Q)
        assert [status for *_, status in run.proxy.requests] == [400, 400, 404, 404]


async def test_client_keys_and_their_limits() -> None:
    """With client keys: a wrong key 401; over a client's in-flight limit 429 + Retry-After."""
    async with Upstream(token_delay=0.05) as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "ui", "key_env": "UI_KEY", "max_in_flight": 1}],
        }
        config = parse(raw, {"UI_KEY": "client-secret"})
        async with running(config, port=0) as run:
            bad = oai(base_url=run.url + "/v1", api_key="wrong", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(model="m", messages=Q)
            good = oai(base_url=run.url + "/v1", api_key="client-secret", max_retries=0)
            first = await good.chat.completions.create(model="m", messages=Q, stream=True)
            await first.__anext__()  # one answer in flight
            async with httpx.AsyncClient() as http:
                r = await http.post(
                    run.url + "/v1/chat/completions",
                    headers={"authorization": "Bearer client-secret"},
                    json={"model": "m", "messages": Q},
                )
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            await first.close()


async def test_a_deeply_nested_body_is_a_400_and_gives_its_slot_back() -> None:
    """A few KB of nested JSON is a 400 in the caller's format, not a 500, and the client key's
    in-flight count comes back: five of them, then an ordinary request still gets through."""
    async with Upstream() as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "ui", "key_env": "UI_KEY", "max_in_flight": 1}],
        }
        config = parse(raw, {"UI_KEY": "client-secret"})
        auth = {"authorization": "Bearer client-secret", "content-type": "application/json"}
        nested = b'{"model": "m", "messages": ' + b"[" * 6000 + b"]" * 6000 + b"}"
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            for _ in range(5):
                r = await http.post(run.url + "/v1/chat/completions", headers=auth, content=nested)
                assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
            ok = await http.post(
                run.url + "/v1/chat/completions", headers=auth, json={"model": "m", "messages": Q}
            )
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "wizard", "content": "hi"}],
        [{"role": "user", "content": "\ud800"}],
    ],
)
async def test_a_request_the_library_refuses_is_a_400_not_a_503(messages: Any) -> None:
    """What the library refuses as InvalidRequest (a bogus role, a lone surrogate) is the
    caller's mistake: 400 without Retry-After, so no SDK retries it."""
    async with (
        running(port=0, faults="none", token_delay=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        r = await http.post(
            run.url + "/v1/chat/completions",
            content=json.dumps({"model": "demo", "messages": messages}).encode(),
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 400, r.text
    assert "retry-after" not in r.headers


async def test_stream_must_be_a_boolean_and_bearer_is_any_case() -> None:
    """``"stream": "false"`` is a 400 (it is truthy: it would have streamed); the Bearer scheme
    is case-insensitive, as HTTP says; the request history is bounded."""
    from streamres.proxy.server.app import REQUESTS_KEPT

    async with Upstream() as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "ui", "key_env": "UI_KEY"}],
        }
        config = parse(raw, {"UI_KEY": "client-secret"})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            url = run.url + "/v1/chat/completions"
            body: dict[str, Any] = {"model": "m", "messages": Q, "stream": "false"}
            r = await http.post(url, headers={"authorization": "Bearer client-secret"}, json=body)
            assert r.status_code == 400 and "JSON boolean" in r.json()["error"]["message"]
            body["stream"] = False
            for scheme in ("bearer", "BEARER", "Bearer"):
                r = await http.post(
                    url, headers={"authorization": f"{scheme} client-secret"}, json=body
                )
                assert r.status_code == 200, (scheme, r.text)
            assert run.proxy.requests.maxlen == REQUESTS_KEPT


async def test_health_and_metrics_are_the_operators_once_client_keys_are_set() -> None:
    """With client keys, ``/health``, ``/metrics`` and the board need the operator key (bearer,
    or the password of HTTP Basic, which a browser asks for); without an operator key they say
    how to set one; ``public_health = true`` opens them; a client key is not the operator's."""
    import base64

    async with Upstream() as up:
        base = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "ui", "key_env": "UI_KEY"}],
        }
        env = {"UI_KEY": "client-secret", "OP_KEY": "op-secret"}
        setups = {
            "none": parse(base, env),
            "keyed": parse({**base, "operator": {"key_env": "OP_KEY"}}, env),
            "public": parse({**base, "operator": {"public_health": True}}, env),
        }
        basic = "Basic " + base64.b64encode(b"anyone:op-secret").decode()
        got = {}
        for name, config in setups.items():
            async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
                for who, auth in (
                    ("nobody", None),
                    ("client", "Bearer client-secret"),
                    ("bearer", "Bearer op-secret"),
                    ("basic", basic),
                ):
                    headers = {"authorization": auth} if auth else {}
                    statuses = [
                        (await http.get(run.url + page, headers=headers)).status_code
                        for page in ("/health", "/metrics", "/")
                    ]
                    got[name, who] = statuses
                r = await http.get(run.url + "/health")
                if r.status_code == 401:
                    assert r.headers["www-authenticate"].startswith("Basic")
                    assert "operator" in r.json()["error"]["message"]
    shut = [401, 401, 401]
    assert got["none", "nobody"] == got["none", "bearer"] == shut
    assert got["keyed", "nobody"] == got["keyed", "client"] == shut
    assert got["keyed", "bearer"] == got["keyed", "basic"] == [200, 200, 200]
    assert got["public", "nobody"] == [200, 200, 200]
    with pytest.raises(ConfigError, match=r"\[operator\]"):
        parse({**base, "operator": {"key_env": "MISSING"}}, env)


async def test_a_client_that_goes_away_closes_the_upstream_stream() -> None:
    """Closing the client's stream mid-answer, with no hold (``[answers] hold = 0``): the
    upstream sees its stream end at once."""
    no_hold = HoldLimits(hold=0)
    async with running(port=0, faults="none", token_delay=0.05, answers=no_hold) as run:
        assert run.upstream is not None
        sdk = oai(base_url=run.url + "/v1", api_key="k")
        stream = await sdk.chat.completions.create(model="demo", messages=Q, stream=True)
        async for _ in stream:
            break
        assert run.upstream.in_flight("demo-large") == 1
        await stream.close()
        with anyio.fail_after(2):  # the answer would take 6 s more: only the close ends it
            await run.upstream.wait_streams_done()


async def test_upstream_keys_never_reach_a_client_or_a_log() -> None:
    """A route's key, echoed back by a hostile upstream, appears in no response and no log."""
    secret = "sk-upstream-SECRET-42"
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("401"))}) as up:
        raw = {
            "routes": [
                {"name": "m", "model": "m", "base_url": up.openai_url, "api_key_env": "UP_KEY"}
            ]
        }
        config = parse(raw, {"UP_KEY": secret})
        with structlog.testing.capture_logs() as logs:
            async with running(config, port=0) as run, httpx.AsyncClient() as http:
                r = await http.post(
                    run.url + "/v1/chat/completions", json={"model": "m", "messages": Q}
                )
                health = (await http.get(run.url + "/health")).text
                metrics = (await http.get(run.url + "/metrics")).text
        assert r.status_code == 401
        for text in (r.text, health, metrics, json.dumps(logs, default=str)):
            assert secret not in text


async def test_models_health_and_metrics() -> None:
    """/v1/models lists what a client may ask for; /health says why; /metrics counts."""
    async with running(port=0, faults="none", token_delay=0) as run:
        await _openai_text(run.url)
        async with httpx.AsyncClient() as http:
            models = (await http.get(run.url + "/v1/models")).json()
            health = (await http.get(run.url + "/health")).json()
            metrics = (await http.get(run.url + "/metrics")).text
            board = (await http.get(run.url + "/")).text
    assert {m["id"] for m in models["data"]} == {"chat", "demo", "demo-large", "demo-small"}
    assert models["data"][-1]["id"] == "demo-small"  # the chains first, then single models
    assert health["models"]["demo-large"]["requests"] == 1
    assert health["models"]["demo-small"]["reasons"] == ["too few requests to judge (0 of 5)"]
    assert 'streamres_requests_total{model="demo-large"} 1.0' in metrics
    assert 'fetch("/health"' in board


async def test_streams_in_flight_finish_when_the_server_stops() -> None:
    """Shutdown while an answer streams: the answer still arrives whole (graceful)."""
    async with running(port=0, faults="none", token_delay=0.01) as run:
        assert run.upstream is not None
        sdk = oai(base_url=run.url + "/v1", api_key="k")
        stream = await sdk.chat.completions.create(model="demo", messages=Q, stream=True)
        text = ""
        async for chunk in stream:
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
            run.server.should_exit = True  # type: ignore[attr-defined]
        assert text == _upstream_answer(run.upstream)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"polcy": {"deadline": 30}}, "'polcy' is not one (did you mean 'policy'?)"),
        ({"policy": {"deadlin": 30}}, "[policy]: known keys are deadline"),
        ({"routes": [{"modle": "m"}]}, "routes[0]: known keys are"),
        ({"routes": [{"modle": "m"}]}, "'modle' is not one (did you mean 'model'?)"),
        ({"clients": [{"key_envv": "K"}]}, "clients[0]: known keys are"),
        ({"operator": {"public": True}}, "did you mean 'public_health'?"),
    ],
)
async def test_a_misspelt_table_or_key_is_refused_with_the_one_meant(
    raw: dict[str, Any], words: str
) -> None:
    """A table or key the file misspells is refused, naming the one meant: ignored, what the
    user set (a deadline, a model) would be lost without a word."""
    whole = {"routes": [{"model": "m", "base_url": "http://127.0.0.1:1/v1"}], **raw}
    with pytest.raises(ConfigError) as info:
        parse(whole, {})
    assert words in str(info.value)


async def test_the_sample_routes_file_serves_in_front_of_the_embedded_upstream(
    tmp_path: Path,
) -> None:
    """``demos/routes.toml`` as the README uses it, in front of ``streamres serve`` (on this
    test's port): its alias is a chain of two routes, and the SDK gets the exact answer."""
    async with Upstream(faults="529") as up:
        path = tmp_path / "routes.toml"
        path.write_text(SAMPLE_ROUTES.replace("http://127.0.0.1:8765/v1", up.openai_url))
        config = streamres.proxy.load(str(path))
        assert config.models["chat"] == ["large", "small"] and config.deadline == 120
        async with running(config, port=0) as run:
            text, _ = await _openai_text(run.url, model="chat")
        assert text == _upstream_answer(up)


async def test_a_bad_config_is_one_clear_line() -> None:
    """Missing key variables and unknown route names are named, with what to do."""
    with pytest.raises(ConfigError, match="environment variable NOPE is empty"):
        parse({"routes": [{"model": "m", "api_key_env": "NOPE"}]}, {})
    with pytest.raises(ConfigError, match=r"models.chat: a list of route names among \['m'\]"):
        parse({"routes": [{"model": "m"}], "models": {"chat": ["x"]}}, {})
    with pytest.raises(ConfigError, match="no \\[\\[routes\\]\\]"):
        parse({}, {})
    got = await anyio.run_process(
        [sys.executable, "-m", "streamres", "proxy", "--config", "/nonexistent.toml"],
        check=False,
    )
    assert got.returncode == 2 and "cannot read /nonexistent.toml" in got.stderr.decode()


# -- real clients of another language, and a real browser ------------------------------------

NODE_CLIENT = textwrap.dedent(
    """
    const OpenAI = require("openai");
    (async () => {
      const client = new OpenAI({ baseURL: process.argv[2], apiKey: "k" });
      const stream = await client.chat.completions.create({
        model: "demo", messages: [{ role: "user", content: "Explain TCP slow start." }],
        stream: true,
      });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content || "";
      process.stdout.write(JSON.stringify({ text }));
    })().catch((e) => { console.error(e); process.exit(1); });
    """
)


async def test_the_openai_npm_package_streams_the_exact_answer(tmp_path: Path) -> None:
    """The official openai package under Node, through faults: the exact answer."""
    env = node_env("openai")
    script = tmp_path / "client.js"
    script.write_text(NODE_CLIENT, encoding="utf-8")
    async with running(port=0, faults="error@20,reset@40", token_delay=0) as run:
        assert run.upstream is not None
        done = await anyio.run_process(["node", str(script), run.url + "/v1"], check=False, env=env)
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stdout)["text"] == _upstream_answer(run.upstream)


async def test_the_health_board_shows_a_model_turning_jammed_in_a_browser() -> None:
    """Headless Chromium opens the board during a fault storm and renders the large model as
    jammed, with its reason."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    async with running(port=0, faults="503*40", token_delay=0) as run:
        for _ in range(6):  # the large model fails every time; the small one answers
            await _openai_text(run.url, model="demo")
        assert run.proxy.pages.health()["models"]["demo-large"]["status"] == "jammed"
        done = await anyio.run_process(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=4000",
                "--dump-dom",
                run.url + "/",
            ],
            check=False,
        )
    dom = done.stdout.decode()
    assert 'data-model="demo-large" data-status="jammed"' in dom, dom[-2000:]
    assert 'data-model="demo-small" data-status="healthy"' in dom


async def test_the_board_charts_each_models_last_minutes_in_a_browser(tmp_path: Path) -> None:
    """Headless Chromium renders, per model, three charts of the last minutes (success, first
    token, capacity errors) with a point per bucket and a mark where the breaker opened, at a
    desktop's width and a phone's; the screenshots are kept (``STREAMRES_TEST_ARTIFACTS``, or
    the test's directory)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    keep = anyio.Path(os.environ.get("STREAMRES_TEST_ARTIFACTS") or tmp_path)
    await keep.mkdir(parents=True, exist_ok=True)
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    async with running(port=0, faults="503*40", token_delay=0) as run:
        for _ in range(6):
            await _openai_text(run.url, model="demo")
        health = run.proxy.pages.health()["models"]
        assert health["demo-large"]["trend"] and health["demo-large"]["breaker_changes"]
        done = await anyio.run_process(
            [*base, "--virtual-time-budget=4000", "--dump-dom", run.url + "/"], check=False
        )
        shots = {}
        for name, size in (("board.png", "1200,700"), ("board-phone.png", "390,1400")):
            shots[name] = keep / name
            await anyio.run_process(
                [
                    *base,
                    f"--window-size={size}",
                    "--virtual-time-budget=4000",
                    f"--screenshot={shots[name]}",
                    run.url + "/",
                ],
                check=False,
            )
    dom = done.stdout.decode()
    cards = dom.split('class="card"')[1:]
    assert len(cards) == 2, dom[-2000:]
    large = next(c for c in cards if 'data-model="demo-large"' in c)
    for signal in ("success_rate", "ttft_p50", "capacity_error_rate"):
        assert f'data-signal="{signal}"' in large
    assert large.count("<circle") >= 2  # a point per bucket (no first token: all refused)
    assert 'stroke="#d33"' in large  # the breaker opened
    assert ">100 %<" in large  # capacity errors: every request of the large model refused
    for shot in shots.values():
        data = await shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    print(f"board screenshots: {', '.join(str(s) for s in shots.values())}")


@pytest.mark.parametrize("shared", [False, True])
async def test_tenants_never_share_answers(shared: bool) -> None:
    """Two client keys ask the same question: each gets its own upstream answer (the cache and
    single-flight are per key); the same key asking again is answered from its cache. With
    ``[cache] shared = true`` the operator lets them share: one upstream request."""
    async with Upstream() as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "clients": [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key_env": "B_KEY"}],
            "cache": {"ttl": 60, "shared": shared},
        }
        config = parse(raw, {"A_KEY": "key-a", "B_KEY": "key-b"})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:

            async def ask(key: str) -> str:
                r = await http.post(
                    run.url + "/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": "m", "messages": Q},
                )
                return str(r.json()["choices"][0]["message"]["content"])

            answers = [await ask("key-a"), await ask("key-b"), await ask("key-a")]
        assert answers == [up.answer(Q)] * 3
        # a, then b on its own (unless shared); a's repeat from a's cache
        assert len(up.requests) == (1 if shared else 2)


async def test_a_proxy_with_a_cache_asks_once_for_a_repeated_question() -> None:
    """[cache] in routes.toml: the same question twice through the proxy, one upstream
    request; the second answer exact, from the cache."""
    async with Upstream() as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "cache": {"ttl": 60},
        }
        async with running(parse(raw, {}), port=0) as run:
            first, _ = await _openai_text(run.url, model="m")
            again, _ = await _openai_text(run.url, model="m")
        assert first == again == up.answer(Q)
        assert len(up.requests) == 1
    with pytest.raises(ConfigError, match=r"\[cache\]"):
        parse({"routes": [{"model": "m"}], "cache": {"ttl": -1}}, {})


async def test_a_proxy_with_a_semantic_cache_answers_a_question_asked_in_other_words() -> None:
    """[cache.semantic] in routes.toml: a question, then the same in other words (the bundled
    model, offline), then a different one: two upstream requests; the second answer is the
    first's."""
    async with Upstream() as up:
        raw = {
            "routes": [{"name": "m", "model": "m", "base_url": up.openai_url}],
            "cache": {"semantic": {"threshold": 0.93, "routes": ["m"]}},
        }
        async with running(parse(raw, {}), port=0) as run:
            assert await run.proxy.client.cache_ready()
            sdk = oai(base_url=run.url + "/v1", api_key="k")
            texts = []
            for q in (
                "How do I reset my password?",
                "How can I reset my password?",
                "What is the capital of France?",
            ):
                reply = await sdk.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": q}]
                )
                texts.append(reply.choices[0].message.content)
        assert texts[0] == texts[1] != texts[2]
        assert len(up.requests) == 2
    for bad in ({"threshold": 2}, {"embed": "x"}, {"routes": "m"}):
        with pytest.raises(ConfigError, match=r"\[cache\]: .*[Ss]emantic"):
            parse({"routes": [{"model": "m"}], "cache": {"semantic": bad}}, {})


async def test_a_refusal_that_came_with_a_200_is_not_a_success() -> None:
    """An upstream that refused in a 200's JSON body: the client gets a 4xx, never a 200; a real
    4xx keeps its status; capacity stays a 503 with Retry-After."""
    from streamres.proxy.server.app import _status_of

    def rejected(code: int | None) -> streamres.StreamError:
        return streamres.RequestRejected("refused", partial_text="", status_code=code)

    assert _status_of(rejected(200)) == (400, None)
    assert _status_of(rejected(None)) == (400, None)
    assert _status_of(rejected(404)) == (404, None)
    assert _status_of(streamres.AttemptsExhausted("busy", partial_text="")) == (503, 5.0)

    def exhausted(reason: str) -> streamres.StreamError:
        return streamres.AttemptsExhausted("gave up", partial_text="", reason=reason)

    # 503 and 429 only for capacity; an upstream that broke every attempt is a 502.
    assert _status_of(exhausted("capacity")) == (503, 5.0)
    assert _status_of(exhausted("rate_limit")) == (429, 5.0)
    for broken in ("malformed", "truncated", "stall", "transient", "connection"):
        assert _status_of(exhausted(broken)) == (502, None), broken


async def test_the_proxys_connections_send_without_waiting_for_acks() -> None:
    """The socket the proxy listens on gives connections with Nagle's algorithm off
    (``TCP_NODELAY``), as asyncio sets it for TCP sockets: with it on, every response on a
    kept-alive connection waited about 40 ms for the client's delayed ACK between its head
    and its body (measured: ``GET /v1/models`` 44 ms from the second request on; 1.6 ms)."""
    import asyncio
    import socket

    from streamres.proxy.server.serve import _listening

    sock = _listening("127.0.0.1", 0)
    nodelay: list[int] = []
    accepted = asyncio.Event()

    class Seen(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            nodelay.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            accepted.set()
            transport.close()

    server = await asyncio.get_running_loop().create_server(Seen, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        with anyio.fail_after(5):
            await accepted.wait()
        writer.close()
    assert nodelay == [1]


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_a_proxy_left_by_an_error_closes_its_listening_socket(server: str) -> None:
    """The code inside ``running()`` fails: the proxy stops and its listening socket is
    closed, not left to the garbage collector (which warned later, in whatever test ran)."""
    import gc
    import warnings

    class Failed(Exception):
        pass

    with pytest.raises(BaseExceptionGroup) as info:
        async with (
            running(port=0, faults="none", server=server) as run,
            httpx.AsyncClient() as http,
        ):
            assert (await http.get(run.url + "/health")).status_code == 200
            raise Failed
    assert info.group_contains(Failed)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]


def _two_models(up: Upstream, policy: dict[str, Any] | None = None) -> Config:
    """A proxy config for the embedded upstream's "slow" then "fast", asked for as "chat"."""
    routes = [{"model": m, "base_url": up.openai_url} for m in ("slow", "fast")]
    raw = {"routes": routes, "models": {"chat": ["slow", "fast"]}, "policy": policy or {}}
    return parse(raw, {})


async def _ask_chat(run: Any, **kw: Any) -> tuple[str, str]:
    """(the text, the model that wrote it) through the OpenAI SDK."""
    sdk = oai(base_url=run.url + "/v1", api_key="k")
    stream = await sdk.chat.completions.create(model="chat", messages=Q, stream=True, **kw)
    text, model = "", ""
    async for chunk in stream:
        model = chunk.model or model
        for choice in chunk.choices:
            text += choice.delta.content or ""
    return text, model


async def test_a_20_s_first_token_goes_to_the_fallback_through_the_proxy() -> None:
    """A model that takes 20 s to start, asked a quick question through the proxy: the
    fallback's answer after the quick bound (10 s), whole."""
    slow = ModelSpec(faults=FaultPlan("slow@0*3"))
    async with (
        Upstream(models={"slow": slow}, stall_seconds=20) as up,
        running(_two_models(up), port=0) as run,
    ):
        text, model = await _ask_chat(run)
    assert text == up.answer(Q) and model == "fast"


async def test_a_reasoning_request_waits_and_a_trickle_moves_on_through_the_proxy() -> None:
    """The proxy's policy carries the bounds: a reasoning request waits for the slow model's
    first token; with a pace floor, a trickling model is left for the next."""
    slow = ModelSpec(faults=FaultPlan("slow@0*3"))
    async with Upstream(models={"slow": slow}, stall_seconds=3) as up:
        config = _two_models(up, {"quick_first_token_timeout": 1})
        async with running(config, port=0) as run:
            text, model = await _ask_chat(run, reasoning_effort="high")
    assert text == up.answer(Q) and model == "slow"
    async with Upstream(models={"slow": ModelSpec(token_delay=0.2)}) as up:
        floor = {"pace_floor": {"absolute": 20, "window": 1}}
        async with running(_two_models(up, floor), port=0) as run:
            text, model = await _ask_chat(run)
    assert text == up.answer(Q) and model == "fast"


async def test_an_account_out_of_credit_goes_to_another_account_through_the_proxy() -> None:
    """``insufficient_quota`` on the first route's key: the answer comes from the route on the
    other key, the spent account asked once."""
    spent = ModelSpec(faults=FaultPlan("429:type=insufficient_quota*9"))
    async with Upstream(models={"slow": spent}) as up:
        routes = [
            {"model": "slow", "base_url": up.openai_url, "api_key_env": "SPENT"},
            {"model": "fast", "base_url": up.openai_url, "api_key_env": "OTHER"},
        ]
        raw = {"routes": routes, "models": {"chat": ["slow", "fast"]}}
        config = parse(raw, {"SPENT": "k-spent", "OTHER": "k-other"})
        async with running(config, port=0) as run:
            text, model = await _ask_chat(run)
    assert text == up.answer(Q) and model == "fast"
    assert [r.model for r in up.requests] == ["slow", "fast"]


@pytest.mark.parametrize(
    ("clients", "said"),
    [
        (
            [{"name": "ui", "key_env": "A"}, {"name": "ui", "key_env": "B"}],
            "clients[0] and clients[1] are both named 'ui'",
        ),
        (
            [{"key_env": "A"}, {"name": "client0", "key_env": "B"}],
            "both named 'client0'",
        ),
        (
            [{"name": "ui", "key_env": "A"}, {"name": "batch", "key_env": "A"}],
            "clients[0] and clients[1] have the same key",
        ),
    ],
)
async def test_two_keys_under_one_name_or_one_key_twice_is_refused(
    clients: list[dict[str, Any]], said: str
) -> None:
    """A client's name is its tenancy: two keys under one name would read and stop each
    other's answers. Refused at load, in one line naming them (and never the key)."""
    raw = {"routes": [{"model": "m", "base_url": "http://127.0.0.1:9/v1"}], "clients": clients}
    with pytest.raises(ConfigError, match=re.escape(said)) as got:
        parse(raw, {"A": "sk-secret-a", "B": "sk-secret-b"})
    assert "sk-secret" not in str(got.value)
