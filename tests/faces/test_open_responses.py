"""The proxy's Responses face against the Open Responses specification: every response object
and every streamed event it sends validates against the specification's published types
(``openresponses-types`` 2.4.0: mozilla-ai's models generated from openresponses/openresponses
``public/openapi/openapi.json``, spec version 2026-04-24), strictly, from the JSON on the wire
— with faults and without — and the request's settings come back as asked."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openresponses_types import types as spec

from streamres.proxy.config import parse
from streamres.proxy.server.serve import running
from streamres.upstream import Upstream
from tests.helpers.answers import WEATHER_TOOL, Q

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


#: A streamed event's type -> the specification's model of it.
EVENTS: dict[str, Any] = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.queued": spec.ResponseQueuedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.reasoning.delta": spec.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning.done": spec.ResponseReasoningDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
    "error": spec.ErrorStreamingEvent,
}

SETTINGS: dict[str, Any] = {
    "instructions": "Answer briefly.",
    "temperature": 0.3,
    "top_p": 0.9,
    "max_output_tokens": 400,
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "metadata": {"ticket": "42"},
    "text": {"format": {"type": "text"}},
    "store": True,
}


def _strict(model: Any, data: str) -> Any:
    return model.model_validate_json(data, strict=True)


def _events(raw: str) -> list[tuple[str, str]]:
    """(event type, data) of each SSE event with data."""
    out = []
    for block in raw.split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            out.append((json.loads(data[0])["type"], data[0]))
    return out


def _check_stream(raw: str) -> list[dict[str, Any]]:
    """Every event validated; the response objects the lifecycle events carry."""
    responses = []
    for kind, data in _events(raw):
        assert kind in EVENTS, kind
        _strict(EVENTS[kind], data)
        obj = json.loads(data)
        if "response" in obj:
            responses.append(obj["response"])
    return responses


def _echoes(response: dict[str, Any]) -> None:
    """The request's settings, as asked."""
    for name, value in SETTINGS.items():
        assert response[name] == value, (name, response[name])


async def test_response_objects_and_events_are_as_specified() -> None:
    """Streamed and not, the response objects (created, in progress, completed; the whole
    response; a retrieved background one) and every event validate strictly, and echo the
    request's settings; ``completed_at`` is set once completed, ``null`` before."""
    async with Upstream(words=40) as up:
        config = parse({"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}, {})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            body = {"model": "m", "input": Q[0]["content"], **SETTINGS}
            whole = await http.post(run.url + "/v1/responses", json=body)
            assert whole.status_code == 200
            _strict(spec.ResponseResource, whole.text)
            _echoes(whole.json())
            assert isinstance(whole.json()["completed_at"], int)
            streamed = await http.post(run.url + "/v1/responses", json={**body, "stream": True})
            lifecycle = _check_stream(streamed.text)
            assert [r["status"] for r in lifecycle] == ["in_progress", "in_progress", "completed"]
            for r in lifecycle:
                _echoes(r)
            assert lifecycle[0]["completed_at"] is None
            assert lifecycle[-1]["completed_at"] >= lifecycle[-1]["created_at"]
            queued = await http.post(run.url + "/v1/responses", json={**body, "background": True})
            _strict(spec.ResponseResource, queued.text)
            await run.proxy.answers.settled()
            kept = await http.get(f"{run.url}/v1/responses/{queued.json()['id']}")
            _strict(spec.ResponseResource, kept.text)
            assert kept.json()["status"] == "completed" and kept.json()["background"] is True


@pytest.mark.parametrize("strict", [False, None])
async def test_tools_are_echoed_and_their_calls_are_as_specified(strict: bool | None) -> None:
    """A function tool offered: echoed as given — with ``strict`` always, ``null`` when the
    request did not say (the specification requires the key) — and the call's items and
    argument events validate."""
    tool = {k: v for k, v in WEATHER_TOOL.items() if k != "strict" or strict is not None}
    async with Upstream(words=20) as up:
        config = parse({"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}, {})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            body = {
                "model": "m",
                "input": "What is the weather in Paris? Use the tool.",
                "tools": [tool],
                "stream": True,
            }
            r = await http.post(run.url + "/v1/responses", json=body)
            lifecycle = _check_stream(r.text)
            assert lifecycle[-1]["tools"] == [{**tool, "strict": strict}]
            kinds = {kind for kind, _ in _events(r.text)}
            assert "response.function_call_arguments.done" in kinds


@pytest.mark.parametrize("seed", range(6))
async def test_as_specified_through_the_storm(seed: int) -> None:
    """Through the embedded upstream's storm (retries, resumes, fallbacks; some answers
    failing), every event of every answer validates — failed ones included."""
    async with (
        running(port=0, faults="storm", token_delay=0) as run,
        httpx.AsyncClient(timeout=60) as http,
    ):
        for i in range(3):
            body = {"model": "demo", "input": f"Question {seed}-{i}: why?", "stream": True}
            r = await http.post(run.url + "/v1/responses", json=body)
            if r.status_code == 200:
                lifecycle = _check_stream(r.text)
                assert lifecycle[-1]["status"] in ("completed", "incomplete", "failed")
            else:
                assert r.status_code >= 400 and "error" in r.json()


async def test_a_continued_response_is_as_specified() -> None:
    """A response that continues another (``previous_response_id``), streamed and in the
    background: every event and object validates, and names the response it continues."""
    async with Upstream(words=20) as up:
        config = parse({"routes": [{"name": "m", "model": "m", "base_url": up.openai_url}]}, {})
        async with running(config, port=0) as run, httpx.AsyncClient(timeout=30) as http:
            first = await http.post(run.url + "/v1/responses", json={"model": "m", "input": "Hi."})
            previous = first.json()["id"]
            body = {"model": "m", "input": "And then?", "previous_response_id": previous}
            streamed = await http.post(run.url + "/v1/responses", json={**body, "stream": True})
            lifecycle = _check_stream(streamed.text)
            assert lifecycle and all(r["previous_response_id"] == previous for r in lifecycle)
            queued = await http.post(run.url + "/v1/responses", json={**body, "background": True})
            _strict(spec.ResponseResource, queued.text)
            await run.proxy.answers.settled()
            kept = await http.get(f"{run.url}/v1/responses/{queued.json()['id']}")
            _strict(spec.ResponseResource, kept.text)
            assert kept.json()["previous_response_id"] == previous
            assert kept.json()["status"] == "completed"
