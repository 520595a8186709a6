"""Against a real llama.cpp server (``llama-server``): an answer cut mid-stream is re-attached
to (the server kept generating it: ``GET /v1/stream``) or, with replay off, resumed with the
server's own continuation (``continue_final_message``), and comes out whole.

Opt-in — the server is built from source (see ``tests/recordings/llama-cpp/record.py``)::

    STREAMRES_LLAMA_SERVER=/path/to/llama-server \\
    STREAMRES_LLAMA_VOCAB=/path/to/llama.cpp/models/ggml-vocab-qwen2.gguf \\
    pytest tests/end_to_end/test_llama_server.py

The model is the recorder's tiny random-weight Qwen2 (its words are noise; the server, its
framing, its chat template and its continuation are real). Greedy decoding with a fixed seed
makes the uncut answer the reference; a loopback proxy cuts the first response's body after a
number of bytes, as a dropped connection would.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streamres
from streamres.upstream.real import cutting_proxy as _cutting_proxy

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not os.environ.get("STREAMRES_LLAMA_SERVER") or not os.environ.get("STREAMRES_LLAMA_VOCAB"),
        reason="set STREAMRES_LLAMA_SERVER and STREAMRES_LLAMA_VOCAB to run against llama-server",
    ),
]

ASK = [{"role": "user", "content": "Tell me a long story."}]


def _recorder() -> Any:
    spec = importlib.util.spec_from_file_location(
        "record", Path(__file__).parents[1] / "recordings" / "llama-cpp" / "record.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    record = _recorder()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny.gguf"
        record.make_model(Path(os.environ["STREAMRES_LLAMA_VOCAB"]), model)
        proc, url = record.serve(os.environ["STREAMRES_LLAMA_SERVER"], model)
        try:
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _answer(base: str, **kw: Any) -> tuple[str, list[Any], streamres.DoneEvent]:
    text, events = "", []
    stream = streamres.stream_resilient(
        ASK,
        model="tiny",
        base_url=f"{base}/v1",
        api_key="k",
        max_tokens=48,
        temperature=0,
        seed=7,
        deadline=60,
        **kw,
    )
    async with stream:
        async for ev in stream:
            events.append(ev)
            if ev.type == "text":
                text += ev.text
            if ev.type == "done":
                return text, events, ev
    raise AssertionError("no done event")


@pytest.mark.parametrize("cut_after", [900, 3000, 6000])
async def test_a_cut_answer_resumes_on_llama_server(llama: str, cut_after: int) -> None:
    """The answer cut after ``cut_after`` bytes and resumed with ``continue_final_message``
    is the uncut answer's own text, nothing repeated or skipped — up to where the token
    budget ends it: the budget left for the resumed request is counted with the ledger's
    encoding (cl100k_base), not the server's tokenizer, and the two count this noise in many
    scripts differently, so it may end early (or late): the same answer, cut elsewhere."""
    whole, _, reference = await _answer(llama)
    assert reference.attempts == 1 and reference.finish_reason == "length"
    async with _cutting_proxy(llama, cut_after) as base:
        text, events, done = await _answer(base, continuation="prefill", replay=False)
    resumes = [e for e in events if e.type == "resume"]
    assert done.attempts == 2 and len(resumes) == 1 and resumes[0].strategy == "prefill"
    assert resumes[0].chars_so_far > 0 and done.finish_reason == "length"
    shorter, longer = sorted((text, whole), key=len)
    assert longer.startswith(shorter), (whole, text)
    print(f"cut after {cut_after} bytes: {len(text)} of the uncut answer's {len(whole)} characters")


@pytest.mark.parametrize("cut_after", [900, 6000])
async def test_a_cut_answer_is_read_on_by_replay_on_llama_server(
    llama: str, cut_after: int
) -> None:
    """With replay on (the default), the cut stream is re-attached (``GET /v1/stream`` from the
    byte it reached) instead of continued: the uncut answer exactly, budget and all — it is the
    same generation, read to its end."""
    whole, _, reference = await _answer(llama)
    async with _cutting_proxy(llama, cut_after) as base:
        text, events, done = await _answer(base)
    assert [e.strategy for e in events if e.type == "resume"] == ["replay"]
    assert done.attempts == 2 and done.finish_reason == reference.finish_reason == "length"
    assert text == whole


def test_the_server_renders_a_continuation_as_the_same_turn(llama: str) -> None:
    """llama-server's template with ``continue_final_message``: the prompt ends with the
    partial answer itself (no end of turn, no new assistant turn)."""
    import httpx

    partial = "Once upon a time"
    body = {
        "messages": [*ASK, {"role": "assistant", "content": partial}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    prompt = httpx.post(f"{llama}/apply-template", json=body, timeout=10).json()["prompt"]
    assert prompt.endswith(partial), prompt[-80:]
