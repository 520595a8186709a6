"""The Responses API's conversation state through the proxy, as the official ``openai`` SDK
uses it: ``previous_response_id`` over five turns with a tool round in the middle, on routes
whose upstreams speak Chat Completions and Anthropic, through a storm (a retry, resumes, a
fallback); ``retrieve``, ``input_items.list`` and ``delete`` as the SDK types them; another
key's response a 404; a conversation going on at another replica after the one that served it
was killed (a real Redis, ``streamres proxy`` processes); OpenAI's Agents SDK running its tool
loop on the state the proxy keeps. What each turn's upstream received
is checked against what the client was given: the conversation carried is the one it saw."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openresponses_types import types as spec

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import FaultPlan, Upstream
from tests.helpers.answers import WEATHER_TOOL, proxy_process, shared_config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn and the official SDK run on asyncio


def _config(up: Upstream, **more: Any) -> Any:
    raw = {
        "routes": [
            {"name": "a", "model": "m-chat", "base_url": up.openai_url},
            {
                "name": "b",
                "model": "m-claude",
                "provider": "anthropic",
                "base_url": up.anthropic_url,
                "api_key_env": "UP_KEY",
            },
        ],
        "models": {"chat": ["a", "b"], "claude": ["b"]},
        **more,
    }
    return parse(raw, {"UP_KEY": "k", "A_KEY": "key-a", "B_KEY": "key-b"})


def _turns(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The conversation an upstream was sent, either API's shape, as (role, text) — a tool
    call as ("call", its id), a tool result as ("tool", its output); system turns left out."""
    out: list[tuple[str, str]] = []
    for m in body["messages"]:
        content = m.get("content")
        if isinstance(content, str) and content and m["role"] != "system":
            out.append((m["role"], content))
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "text" and block["text"]:
                out.append((m["role"], block["text"]))
            elif block.get("type") == "tool_use":
                out.append(("call", block["id"]))
            elif block.get("type") == "tool_result":
                result = block["content"]
                out.append(("tool", result if isinstance(result, str) else result[0]["text"]))
        out += [("call", c["id"]) for c in m.get("tool_calls") or []]
    return out


async def test_five_turns_with_a_tool_round_across_providers_through_a_storm() -> None:
    """Five turns, each naming the one before; streamed and not; the fault plan makes a
    retry, three resumes and a fallback to the Anthropic route. Each turn's first upstream
    request carries exactly the conversation the client was given (its answers as it read
    them, the tool call and its result), the previous turn's instructions not carried on; the
    SDK reads every turn whole; retrieve, input_items and delete as typed."""
    plan = FaultPlan("503:retry-after-ms=50,reset@8,ok,error@6,ok,at-capacity,ok,reset@5,ok,ok")
    async with (
        Upstream(words=24, faults=plan) as up,
        running(_config(up), port=0) as run,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0) as sdk,
    ):
        seen: list[tuple[str, str]] = []  # the conversation as the client was given it

        async def turn(**kwargs: Any) -> Any:
            first = len(up.requests)
            if kwargs.get("stream"):
                stream = await sdk.responses.create(**kwargs)
                done = [ev async for ev in stream if ev.type == "response.completed"]
                response = done[0].response
            else:
                response = await sdk.responses.create(**kwargs)
            sent = _turns(up.requests[first].body)
            given = kwargs["input"]
            asked = (
                [("user", given)]
                if isinstance(given, str)
                else [("tool", i["output"]) for i in given]
            )
            assert sent == seen + asked  # all before it, exactly, and its own input
            seen.extend(asked)
            return response

        r1 = await turn(model="chat", input="My name is Ada. Say hello.", instructions="Be brief.")
        seen.append(("assistant", r1.output_text))
        r2 = await turn(model="claude", input="What is my name?", previous_response_id=r1.id)
        assert r2.previous_response_id == r1.id and r2.instructions is None
        seen.append(("assistant", r2.output_text))
        r3 = await turn(
            model="chat",
            input="What is the weather in Paris? Use the tool.",
            tools=[WEATHER_TOOL],
            previous_response_id=r2.id,
            stream=True,
        )
        calls = [o for o in r3.output if o.type == "function_call"]
        assert calls and r3.status == "completed"
        if r3.output_text:
            seen.append(("assistant", r3.output_text))
        seen += [("call", c.call_id) for c in calls]
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"}
            for c in calls
        ]
        r4 = await turn(
            model="chat", input=outputs, tools=[WEATHER_TOOL], previous_response_id=r3.id
        )
        assert r4.output_text and not [o for o in r4.output if o.type == "function_call"]
        seen.append(("assistant", r4.output_text))
        r5 = await turn(model="claude", input="Thank you.", previous_response_id=r4.id, stream=True)
        assert r5.output_text and r5.previous_response_id == r4.id
        faults = [r.fault for r in up.requests]
        assert {"503", "reset", "error", "at-capacity"} <= {re.split("[@:]", f)[0] for f in faults}
        assert any("claude" in r.model for r in up.requests[:8])  # the fallback ran

        got = await sdk.responses.retrieve(r4.id)
        assert got.id == r4.id and got.output_text == r4.output_text
        # every item the response was made from: the earlier turns' inputs and outputs too
        items = (await sdk.responses.input_items.list(r4.id, order="asc", limit=100)).data
        assert [(i.type, i.call_id) for i in items[-len(calls) :]] == [
            ("function_call_output", c.call_id) for c in calls
        ]
        assert items[0].type == "message" and items[0].role == "user"
        assert items[0].content[0].text == "My name is Ada. Say hello."
        assert [i.id for i in items if i.type == "function_call"] == [c.id for c in calls]
        assert sum(1 for i in items if i.type == "message" and i.role == "assistant") >= 2
        first = await sdk.responses.input_items.list(r1.id)
        assert first.data[0].type == "message" and first.data[0].role == "user"
        async with httpx.AsyncClient(timeout=30) as http:  # as the specification says
            raw = await http.get(f"{run.url}/v1/responses/{r2.id}")
            spec.ResponseResource.model_validate_json(raw.text, strict=True)
            assert raw.json()["previous_response_id"] == r1.id
        await sdk.responses.delete(r2.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(r2.id)
        with pytest.raises(openai.NotFoundError) as gone:
            await sdk.responses.create(model="chat", input="And?", previous_response_id=r2.id)
        assert gone.value.code == "previous_response_not_found"


async def test_the_agents_sdk_runs_its_tool_loop_on_the_proxys_state() -> None:
    """OpenAI's Agents SDK (``openai-agents``) with a function tool, on a model whose route
    speaks Anthropic, with the state kept by the server (``auto_previous_response_id``): its
    tool round sends only the tool's output and the previous response's id, and the upstream
    gets the whole turn; a second run on ``previous_response_id`` goes on from the first."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return "sunny, 21 C"

    question = "What is the weather in Paris? Use the tool."
    async with (
        Upstream(words=12) as up,
        running(_config(up), port=0) as run,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0) as client,
    ):
        model = OpenAIResponsesModel(model="claude", openai_client=client)
        agent = Agent(name="weather", instructions="Be brief.", tools=[get_weather], model=model)
        first = await Runner.run(agent, question, auto_previous_response_id=True)
        assert len(asked) == 1 and first.final_output
        assert len(up.requests) == 2  # the question, then the tool's output on stored state
        turn = _turns(up.requests[1].body)
        call = turn[-2][1]
        assert turn[0] == ("user", question) and turn[-2:] == [
            ("call", call),
            ("tool", "sunny, 21 C"),
        ]
        second = await Runner.run(agent, "Thank you.", previous_response_id=first.last_response_id)
        assert second.final_output
        assert _turns(up.requests[2].body) == [
            *turn,
            ("assistant", first.final_output),
            ("user", "Thank you."),
        ]


async def test_a_response_is_its_keys_and_store_false_keeps_nothing() -> None:
    """Another client key's response does not exist for this one (continue, retrieve,
    items, delete: 404), and it stays the owner's; ``store: false`` cannot be continued."""
    clients = [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key_env": "B_KEY"}]
    async with (
        Upstream(words=10) as up,
        running(_config(up, clients=clients), port=0) as run,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="key-a", max_retries=0) as a,
        AsyncOpenAI(base_url=run.url + "/v1", api_key="key-b", max_retries=0) as b,
    ):
        mine = await a.responses.create(model="chat", input="A secret: 42.")
        for attempt in (
            b.responses.create(model="chat", input="Go on.", previous_response_id=mine.id),
            b.responses.retrieve(mine.id),
            b.responses.input_items.list(mine.id),
            b.responses.delete(mine.id),
        ):
            with pytest.raises(openai.NotFoundError):
                await attempt
        on = await a.responses.create(model="chat", input="Go on.", previous_response_id=mine.id)
        assert on.previous_response_id == mine.id
        kept = await a.responses.create(model="claude", input="Keep it.", store=True)
        assert kept.store is True  # the proxy's own field: an Anthropic route takes it too
        unkept = await a.responses.create(model="chat", input="Forget it.", store=False)
        assert unkept.store is False
        with pytest.raises(openai.NotFoundError):
            await a.responses.create(model="chat", input="x", previous_response_id=unkept.id)


async def test_a_conversation_goes_on_at_another_replica_after_a_kill(
    redis_server: Any, tmp_path: Path
) -> None:
    """Two ``streamres proxy`` processes on one Redis. A turn answered by A (streamed, read to
    its end), then A killed (SIGKILL): the next turn, sent to B with ``previous_response_id``,
    carries the whole conversation; B can retrieve and list the turn A served."""
    async with Upstream(words=16) as up:
        config = tmp_path / "routes.toml"
        config.write_text(
            f'[[routes]]\nname = "m"\nmodel = "m"\nbase_url = "{up.openai_url}"\n',
            encoding="utf-8",
        )
        (a, a_url) = await proxy_process(config, redis_server.url)
        (b, b_url) = await proxy_process(config, redis_server.url)
        try:
            async with (
                AsyncOpenAI(base_url=a_url + "/v1", api_key="none", max_retries=0) as on_a,
                AsyncOpenAI(base_url=b_url + "/v1", api_key="none", max_retries=0) as on_b,
            ):
                r1 = await on_a.responses.create(model="m", input="Remember: blue.")
                stream = await on_a.responses.create(
                    model="m", input="And green.", previous_response_id=r1.id, stream=True
                )
                done = [ev async for ev in stream if ev.type == "response.completed"]
                r2 = done[0].response
                a.send_signal(signal.SIGKILL)
                await a.wait()
                first = len(up.requests)
                r3 = await on_b.responses.create(
                    model="m", input="Which colours?", previous_response_id=r2.id
                )
                assert r3.previous_response_id == r2.id and r3.output_text
                assert _turns(up.requests[first].body) == [
                    ("user", "Remember: blue."),
                    ("assistant", r1.output_text),
                    ("user", "And green."),
                    ("assistant", r2.output_text),
                    ("user", "Which colours?"),
                ]
                kept = await on_b.responses.retrieve(r2.id)
                assert kept.output_text == r2.output_text
                items = await on_b.responses.input_items.list(r2.id, order="asc")
                assert [i.content[0].text for i in items.data] == [
                    "Remember: blue.",
                    r1.output_text,
                    "And green.",
                ]
        finally:
            for p in (a, b):
                if p.returncode is None:
                    p.kill()
                    await p.wait()


async def test_stored_responses_are_written_again_after_redis_lost_them(
    redis_server: Any,
) -> None:
    """A turn answered by A (not streamed: nothing but its record keeps it), then Redis
    restarted empty: while the replicas write again what it lost, a continuation on B is a
    503 with Retry-After (never a 404); then it carries the conversation."""
    async with (
        Upstream(words=12) as up,
        running(shared_config(up), port=0, redis=redis_server.url) as a,
        running(shared_config(up), port=0, redis=redis_server.url) as b,
        httpx.AsyncClient(timeout=30) as http,
    ):
        first = await http.post(
            a.url + "/v1/responses", json={"model": "m", "input": "Hi, I am Ada."}
        )
        previous = first.json()["id"]
        redis_server.stop()
        redis_server.start()
        body = {"model": "m", "input": "Who am I?", "previous_response_id": previous}
        statuses = []
        with anyio.fail_after(30):
            while True:
                r = await http.post(b.url + "/v1/responses", json=body)
                statuses.append(r.status_code)
                if r.status_code != 503:
                    break
                assert r.headers["retry-after"]
                await anyio.sleep(0.2)  # as a client told to try again
        assert statuses[-1] == 200 and set(statuses[:-1]) <= {503}, statuses
        assert r.json()["previous_response_id"] == previous
        assert _turns(up.requests[-1].body)[:2] == [
            ("user", "Hi, I am Ada."),
            ("assistant", first.json()["output"][0]["content"][0]["text"]),
        ]


def test_a_record_is_plain_json_with_its_conversation() -> None:
    """A conversation record is plain JSON (what Redis holds)."""
    from streamres.proxy.answers.stored import Stored, stored_of
    from streamres.proxy.faces.inbound import parse as parse_call

    call = parse_call("responses", json.dumps({"model": "m", "input": "hi"}).encode())
    response = {
        "id": "resp_1",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello"}],
            }
        ],
    }
    record = stored_of(call, response, None)
    assert Stored.loads(record.dumps()) == record
    assert record.conversation == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


async def test_the_store_keeps_within_its_bytes_and_its_time() -> None:
    """In memory, past ``max_bytes`` the oldest record goes; past ``keep`` a record is not
    found; ``[responses]`` with a bad value is one line naming it."""
    from streamres.proxy.answers.stored import ResponseStore, Stored
    from streamres.proxy.config import ConfigError, StoreLimits

    now = [1000.0]
    store = ResponseStore(StoreLimits(keep=60, max_bytes=600), lambda: None, clock=lambda: now[0])

    def record(n: int) -> Stored:
        text = f"answer {n} " + "x" * 100
        conversation = [{"role": "assistant", "content": text}]
        return Stored(f"resp_{n}", "a", {"id": f"resp_{n}"}, [], conversation, now[0])

    for n in range(6):
        await store.put(record(n))
    assert store.bytes <= 600 and await store.get("resp_0", "a") is None
    assert await store.get("resp_5", "a") is not None
    assert await store.get("resp_5", "b") is None
    now[0] += 61
    assert await store.get("resp_5", "a") is None
    with pytest.raises(ConfigError, match=r"\[responses\]: responses.keep"):
        parse({"routes": [{"name": "m", "model": "m"}], "responses": {"keep": 0}}, {})


def test_input_items_page_as_the_api_pages_them() -> None:
    """``limit``, ``order`` (newest first by default) and ``after``, with ``has_more`` and the
    first and last ids; a bad parameter is a ``ValueError`` (the proxy's 400)."""
    from streamres.proxy.answers.stored import page

    items = [{"id": f"msg_{i}"} for i in range(5)]
    first = page(items, {"limit": "2"})
    assert [i["id"] for i in first["data"]] == ["msg_4", "msg_3"] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == ("msg_4", "msg_3")
    rest = page(items, {"limit": "2", "after": first["last_id"]})
    assert [i["id"] for i in rest["data"]] == ["msg_2", "msg_1"] and rest["has_more"]
    last = page(items, {"order": "asc", "after": "msg_3"})
    assert [i["id"] for i in last["data"]] == ["msg_4"] and not last["has_more"]
    assert page([], {})["data"] == [] and page([], {})["first_id"] is None
    for bad in ({"limit": "0"}, {"limit": "101"}, {"order": "up"}, {"after": "msg_9"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            page(items, bad)


@pytest.mark.parametrize("peeked", [False, True], ids=["alone", "after-another-keys-read"])
async def test_a_delete_on_one_replica_is_a_delete_on_every_replica(
    redis_server: Any, peeked: bool
) -> None:
    """A response made on replica one and deleted on replica two is gone on both: read,
    continued, its items — 404 everywhere, as for an id that never was; also when another key's
    refused read on replica two came first (it must not leave a copy there). Another response
    of the same key is untouched."""
    clients = [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key_env": "B_KEY"}]
    config = _config_for(clients)
    async with Upstream(words=10) as up:
        cfg = config(up)
        async with (
            running(cfg, port=0, redis=redis_server.url) as one,
            running(cfg, port=0, redis=redis_server.url) as two,
            AsyncOpenAI(base_url=one.url + "/v1", api_key="key-a", max_retries=0) as a1,
            AsyncOpenAI(base_url=two.url + "/v1", api_key="key-a", max_retries=0) as a2,
            AsyncOpenAI(base_url=two.url + "/v1", api_key="key-b", max_retries=0) as b2,
        ):
            made = await a1.responses.create(model="chat", input="A secret: 42.")
            other = await a1.responses.create(model="chat", input="Another.")
            assert (await a2.responses.retrieve(made.id)).id == made.id  # shared
            if peeked:
                with pytest.raises(openai.NotFoundError):
                    await b2.responses.retrieve(made.id)
            await a2.responses.delete(made.id)
            for client in (a1, a2):
                for attempt in (
                    client.responses.retrieve(made.id),
                    client.responses.input_items.list(made.id),
                    client.responses.create(
                        model="chat", input="Go on.", previous_response_id=made.id
                    ),
                ):
                    with pytest.raises(openai.NotFoundError):
                        await attempt
            for client in (a1, a2):
                assert (await client.responses.retrieve(other.id)).id == other.id


def _config_for(clients: list[dict[str, str]]) -> Any:
    return lambda up: _config(up, clients=clients)
