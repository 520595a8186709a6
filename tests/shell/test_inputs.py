"""Nothing a request says is dropped: parameters and content parts (images, documents) reach
the upstream in its provider's shape, or are refused by name before any request; and they are
part of what the cache tells apart.

The proxy is checked with the official SDKs as clients and a recording server as the upstream
(it answers every request with one fixed stream and keeps what it was sent).
"""

from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import anthropic
import httpx
import openai
import pytest

from streamres._providers import fields
from streamres._providers.params import for_provider, for_route
from streamres._providers.parts import content_for
from streamres.proxy import running
from streamres.proxy.config import parse
from tests.helpers.hostile import hostile, openai_answer, streamed

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()


# -- the tables, without sockets ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "given", "sent"),
    [
        ("anthropic", {"stop": "END"}, {"stop_sequences": ["END"]}),
        ("anthropic", {"user": "u1"}, {"metadata": {"user_id": "u1"}}),
        ("anthropic", {"top_k": 5, "n": 1, "presence_penalty": 0}, {"top_k": 5}),
        ("anthropic", {"store": False, "logprobs": False}, {}),
        ("openai", {"stop_sequences": ["a"]}, {"stop": ["a"]}),
        (
            "openai",
            {"thinking": {"type": "enabled", "budget_tokens": 3000}},
            {"reasoning_effort": "medium"},
        ),
        (
            "openai",
            {"text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}},
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}},
                }
            },
        ),
        ("openai", {"reasoning": {"effort": "high"}}, {"reasoning_effort": "high"}),
        (
            "openai-responses",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}},
                }
            },
            {"text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}},
        ),
        ("openai-responses", {"reasoning_effort": "low"}, {"reasoning": {"effort": "low"}}),
        ("openai-responses", {"verbosity": "low"}, {"text": {"verbosity": "low"}}),
        # effort and thinking, every way (Claude Code sends adaptive thinking and an effort)
        (
            "anthropic",
            {"reasoning_effort": "high"},
            {"output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}},
        ),
        (
            "anthropic",
            {"reasoning": {"effort": "xhigh"}},
            {"output_config": {"effort": "max"}, "thinking": {"type": "adaptive"}},
        ),
        (
            "openai",
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
            {"reasoning_effort": "high"},
        ),
        ("openai", {"thinking": {"type": "adaptive"}}, {}),
        (
            "openai-responses",
            {"output_config": {"effort": "max"}},
            {"reasoning": {"effort": "xhigh"}},
        ),
        (
            "openai",
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "object"}, "name": "output"},
                }
            },
        ),
        (
            "anthropic",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}},
                }
            },
            {"output_config": {"format": {"type": "json_schema", "schema": {}}}},
        ),
        # fields that ask nothing of the answer on another API: left out
        (
            "openai",
            {"context_management": {"edits": []}, "metadata": {"user_id": "u"}, "top_k": 4},
            {"top_k": 4},
        ),
        ("openai", {"client_metadata": {"a": "b"}, "include": ["reasoning.encrypted_content"]}, {}),
        ("anthropic", {"prompt_cache_key": "k", "service_tier": "flex", "include": []}, {}),
        ("anthropic", {"metadata": {"user_id": "u", "tag": "t"}}, {"metadata": {"user_id": "u"}}),
        (
            "openai-responses",
            {"include": ["x"], "client_metadata": {"a": "b"}},
            {"include": ["x"], "client_metadata": {"a": "b"}},
        ),
    ],
)
def test_parameters_are_converted_for_each_provider(
    provider: str, given: dict[str, Any], sent: dict[str, Any]
) -> None:
    assert for_provider(provider, given) == sent


@pytest.mark.parametrize(
    ("provider", "given", "named"),
    [
        ("anthropic", {"seed": 7}, "seed"),
        ("anthropic", {"response_format": {"type": "json_object"}}, "response_format"),
        ("anthropic", {"presence_penalty": 0.5}, "presence_penalty"),
        ("anthropic", {"logit_bias": {"50256": -100}}, "logit_bias"),
        ("anthropic", {"text": {"format": {"type": "json_object"}}}, "response_format"),
        ("anthropic", {"store": True}, "store"),
        ("openai-responses", {"stop": ["x"]}, "stop"),
        ("openai-responses", {"top_k": 3}, "top_k"),
    ],
)
def test_a_parameter_a_provider_lacks_is_refused_by_name(
    provider: str, given: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{named} cannot be sent to this model: "):
        for_provider(provider, given)


def test_what_is_left_out_is_said_and_effort_goes_only_to_a_model_that_reasons() -> None:
    """Claude Code's fields on a Chat route: its effort becomes ``reasoning_effort`` on a
    model that reasons; on one that does not, it is left out and said, like its context
    management and metadata."""
    claude_code = {
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "device"},
    }
    sent, left = for_route("openai", claude_code, reasons=True)
    assert sent == {"reasoning_effort": "high"}
    assert sorted(name for name, _ in left) == ["context_management", "metadata"]
    sent, left = for_route("openai", claude_code, reasons=False)
    assert sent == {}
    assert sorted(name for name, _ in left) == [
        "context_management",
        "metadata",
        "output_config.effort",
    ]
    assert all(why for _, why in left)
    # the route's own API's fields pass as they are, whatever the model
    assert for_route("openai", {"reasoning_effort": "low"}, reasons=False) == (
        {"reasoning_effort": "low"},
        [],
    )


#: Codex's tools (0.171.0, default features), shortened: functions, a namespace of functions,
#: and the Responses API's hosted web search.
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": False},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Agents",
        "tools": [
            {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
            {"type": "function", "name": "wait_agent", "parameters": {"type": "object"}},
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "openai-responses"])
def test_namespaces_are_flattened_and_hosted_tools_go_only_where_they_run(provider: str) -> None:
    """Every route gets Codex's namespace as functions named ``<namespace>__<name>``; web
    search goes only to a Responses route, and is left out (said) elsewhere."""
    sent, left = for_route(provider, {"tools": CODEX_TOOLS, "tool_choice": "auto"})
    names = [t["function"]["name"] if "function" in t else t.get("name") for t in sent["tools"]]
    names = [n for n in names if n]
    assert names == ["exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]
    hosted = [t for t in sent["tools"] if t.get("type") == "web_search"]
    if provider == "openai-responses":
        assert hosted == [CODEX_TOOLS[2]] and left == []
    else:
        assert hosted == [] and [n for n, _ in left] == ["tools: web_search"]
    # …and the request each provider builds carries only what its API defines
    for tool in (_anthropic_body if provider == "anthropic" else _chat_body)(sent)["tools"]:
        assert tool.get("type") != "namespace"


def _chat_body(params: dict[str, Any]) -> dict[str, Any]:
    from streamres._providers.tools import openai_tools

    return openai_tools(params)


def _anthropic_body(params: dict[str, Any]) -> dict[str, Any]:
    from streamres._providers.tools import anthropic_tools

    return anthropic_tools(params)


def test_the_field_tables_are_whole_and_in_the_docs() -> None:
    """Each table names only the other APIs; the documentation (docs/agents.md) carries them
    as rendered from the code."""
    fields.check()
    docs = (pathlib.Path(__file__).parents[2] / "docs" / "agents.md").read_text(encoding="utf-8")
    assert fields.markdown() in docs


def test_images_and_documents_convert_every_way() -> None:
    """An image (by URL and as data) and a PDF, from each shape to each, and back."""
    anthropic_parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
            "title": "a.pdf",
        },
    ]
    chat = content_for("openai", anthropic_parts)
    assert chat == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {
            "type": "file",
            "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"},
        },
    ]
    assert content_for("anthropic", chat) == anthropic_parts
    responses = content_for("openai-responses", chat)
    assert [p["type"] for p in responses] == [
        "input_text",
        "input_image",
        "input_image",
        "input_file",
    ]
    assert responses[1]["image_url"] == f"data:image/png;base64,{PNG}"
    assert content_for("openai", responses) == [
        chat[0],
        {"type": "image_url", "image_url": {"url": chat[1]["image_url"]["url"], "detail": "auto"}},
        {"type": "image_url", "image_url": {"url": chat[2]["image_url"]["url"], "detail": "auto"}},
        chat[3],
    ]
    assert content_for("anthropic", "plain text") == "plain text"


# -- through the proxy -------------------------------------------------------------------------

pytestmark_proxy = pytest.mark.parametrize("anyio_backend", ["asyncio"])
ANSWER = streamed(openai_answer(["It is ", "a picture."]))


def proxy_config(url: str, **extra: Any) -> Any:
    raw: dict[str, Any] = {"routes": [{"name": "m", "model": "m", "base_url": url}]}
    raw.update(extra)
    return parse(raw, {})


def sent(server: Any, i: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(server.requests[i][1])
    return body


@pytestmark_proxy
@pytest.mark.anyio
async def test_an_anthropic_client_s_image_and_parameters_reach_an_openai_model() -> None:
    """Anthropic SDK → proxy → OpenAI-shaped upstream: the image as an image_url data part, the
    text beside it, top_k and stop sequences in the upstream's names."""
    async with hostile(ANSWER) as up, running(proxy_config(up.url), port=0) as run:
        async with anthropic.AsyncAnthropic(base_url=run.url, api_key="k", max_retries=0) as sdk:
            msg = await sdk.messages.create(
                model="m",
                max_tokens=50,
                stop_sequences=["END"],
                extra_body={"top_k": 5},
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": PNG,
                                },
                            },
                        ],
                    }
                ],
            )
        assert msg.content[0].text == "It is a picture."  # type: ignore[union-attr]
        body = sent(up)
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]
    assert (body["top_k"], body["stop"]) == (5, ["END"])


@pytestmark_proxy
@pytest.mark.anyio
async def test_openai_and_responses_parameters_reach_the_upstream() -> None:
    """response_format, penalties, logit_bias, reasoning_effort (Chat) and text.format and an
    input_image (Responses) all arrive, converted to the route's API."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    async with (
        hostile(ANSWER) as up,
        running(proxy_config(up.url), port=0) as run,
        openai.AsyncOpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0) as sdk,
    ):
        await sdk.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            response_format=fmt,  # type: ignore[arg-type]
            presence_penalty=0.5,
            logit_bias={"50256": -100},
            reasoning_effort="low",
        )
        chat = sent(up)
        await sdk.responses.create(
            model="m",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png"},
                    ],
                }
            ],
            text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
        )
        responses = sent(up)
    assert chat["response_format"] == fmt
    assert (chat["presence_penalty"], chat["logit_bias"], chat["reasoning_effort"]) == (
        0.5,
        {"50256": -100},
        "low",
    )
    assert responses["response_format"] == fmt
    assert responses["messages"][-1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://example.com/a.png"},
    }


@pytestmark_proxy
@pytest.mark.anyio
async def test_a_parameter_a_fallback_route_lacks_is_a_400_naming_it() -> None:
    """seed, with an Anthropic route in the model's chain: 400 before any request, naming the
    parameter and the route; state on one server (a ``conversation``) is refused too, and a
    ``previous_response_id`` the proxy does not hold is a 404 — none of it sent upstream."""
    async with hostile(ANSWER) as up:
        config = proxy_config(
            up.url,
            routes=[
                {"name": "m", "model": "m", "base_url": up.url},
                {"name": "c", "model": "c", "provider": "anthropic", "base_url": up.url},
            ],
            models={"chat": ["m", "c"]},
        )
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            r = await http.post(
                run.url + "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "seed": 1},
            )
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            assert "seed cannot be sent" in message and "'c'" in message
            r = await http.post(
                run.url + "/v1/responses",
                json={"model": "m", "input": "hi", "conversation": "conv_1"},
            )
            assert r.status_code == 400 and "conversation" in r.json()["error"]["message"]
            r = await http.post(
                run.url + "/v1/responses",
                json={"model": "m", "input": "hi", "previous_response_id": "resp_1"},
            )
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "previous_response_not_found"
        assert up.requests == []


@pytestmark_proxy
@pytest.mark.anyio
async def test_requests_differing_only_in_a_parameter_or_an_image_do_not_share_the_cache() -> None:
    """A JSON-mode request never gets a cached free-text answer, nor one image another's."""
    async with hostile(ANSWER) as up:
        config = proxy_config(up.url, cache={"ttl": 600})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            url = run.url + "/v1/chat/completions"
            base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            json_mode = {**base, "response_format": {"type": "json_object"}}

            def picture(name: str) -> dict[str, Any]:
                part = {"type": "image_url", "image_url": {"url": f"https://example.com/{name}"}}
                return {"model": "m", "messages": [{"role": "user", "content": [part]}]}

            for body in (base, base, json_mode, json_mode, picture("a.png"), picture("b.png")):
                assert (await http.post(url, json=body)).status_code == 200
    assert len(up.requests) == 4  # base, json_mode, a.png, b.png: each once


@pytestmark_proxy
@pytest.mark.anyio
@pytest.mark.parametrize(
    "field",
    [
        {"deadline": 1e9},
        {"headers": {"x-api-key": "someone-else"}},
        {"cache_scope": "another-team"},
        {"priority": 100},
        {"base_url": "http://elsewhere.test/v1"},
    ],
)
async def test_a_field_named_as_the_library_s_own_argument_is_refused(
    field: dict[str, Any],
) -> None:
    """Body fields go to the library as extra fields, so one named as its own argument would
    set it (a longer deadline, headers to the upstream, another key's cache, a higher lane):
    a 400 naming it, and nothing sent upstream."""
    async with (
        hostile(ANSWER) as up,
        running(proxy_config(up.url), port=0) as run,
        httpx.AsyncClient(timeout=30) as http,
    ):
        r = await http.post(
            run.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], **field},
        )
    assert r.status_code == 400, r.text
    assert f"{next(iter(field))!r} is not a field of this API" in r.json()["error"]["message"]
    assert up.requests == []


#: A value for each field that asks something of the answer (not a default, not off).
SAMPLES: dict[str, Any] = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "stop": ["END"],
    "stop_sequences": ["END"],
    "reasoning_effort": "high",
    "reasoning": {"effort": "high"},
    "thinking": {"type": "enabled", "budget_tokens": 9000},
    "output_config": {"effort": "high"},
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}},
    "verbosity": "low",
    "user": "u1",
    "safety_identifier": "s1",
    "seed": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 3,
    "n": 2,
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy"},
    "prediction": {"type": "content", "content": "x"},
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "store": True,
    "metadata": {"tag": "t"},
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "service_tier": "flex",
    "web_search_options": {},
    "context_management": {"edits": []},
    "inference_geo": "us",
    "container": "c1",
    "mcp_servers": [{"type": "url", "url": "https://example.com"}],
    "background": True,
    "truncation": "auto",
    "include": ["reasoning.encrypted_content"],
    "max_tool_calls": 3,
    "client_metadata": {"a": "b"},
    "conversation": "conv_1",
    "prompt": {"id": "p1"},
}


def _every_field() -> list[tuple[str, str, str]]:
    return [
        (api, name, target)
        for api, table in (
            ("openai", fields.CHAT),
            ("anthropic", fields.MESSAGES),
            ("openai-responses", fields.RESPONSES),
        )
        for name, fates in table.items()
        if fates[next(iter(fates))].kind != "read"
        for target in fates
    ]


@pytest.mark.parametrize(("api", "name", "target"), _every_field())
def test_every_field_of_every_api_meets_its_fate_on_every_other(
    api: str, name: str, target: str
) -> None:
    """Each field of each API's table, sent to a route of each other API: passed as it is,
    translated (its name gone, something in the route's own names in its place), left out and
    said, or refused by name — as the table says; never passed as given where the table says
    otherwise."""
    fate = fields.fate(name, target)
    assert fate is not None
    value = SAMPLES[name]
    if fate.kind == "no":
        with pytest.raises(ValueError, match=rf"^{name} cannot be sent to this model: "):
            for_route(target, {name: value}, reasons=True)
        return
    sent, left = for_route(target, {name: value}, reasons=True)
    if name == "parallel_tool_calls" and target == "anthropic":  # the request's tool_choice
        from streamres._providers.anthropic import build_request

        body = build_request(
            base_url="http://x",
            api_key=None,
            model="m",
            messages=[],
            max_tokens=9,
            extra_body=sent,
            extra_headers={},
        ).body
        assert "parallel_tool_calls" not in body
        assert body["tool_choice"]["disable_parallel_tool_use"] is True
        return
    if fate.kind == "same":
        if name in ("tools", "tool_choice"):
            assert sent, (name, target)
        else:
            assert name in sent or name in ("metadata", "service_tier"), (name, target, sent)
    elif fate.kind == "to":
        assert sent and (name not in sent or name in ("tools", "tool_choice")), (name, sent)
        assert not any(n == name for n, _ in left)
    else:
        assert fate.kind == "out"
        assert name not in sent and [n for n, _ in left] == [name]
