"""How a resumed answer is joined, and what the done event says about it: ``auto`` resumes a
server that continues a final assistant message by prefill (learned from the server itself); an
instruct continuation that ends at the seam is asked again and, failing that, never reported as
a plain complete answer; a drifting restart is cut at a word seam; a new turn that dropped the
space before its first word gets it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import streamres
from streamres import Client, Route
from streamres._answer.machine import SEAM_TRIES
from streamres._core.continuation import choose, continues_prefill, instruction
from streamres._core.dedup import Deduplicator, ends_a_sentence
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.hostile import END, chunk, head, hostile, openai_chunk
from tests.helpers.streams import FAST, USER, collect

pytestmark = pytest.mark.anyio


def cut_then(first: list[str], second: list[str], *, server: str | None) -> list[Any]:
    """Two responses: ``first`` then a reset; ``second`` complete (stop)."""
    extra = [("server", server)] if server else []
    return [
        [head(extra=extra), *(chunk(openai_chunk(w)) for w in first), "reset"],
        [
            head(extra=extra),
            *(chunk(openai_chunk(w)) for w in second),
            chunk(openai_chunk(finish="stop")),
            chunk(b"data: [DONE]\n\n"),
            END,
        ],
    ]


def body_of(request: tuple[bytes, bytes]) -> dict[str, Any]:
    return dict(json.loads(request[1]))


@pytest.mark.parametrize(("server", "strategy"), [("llama.cpp", "prefill"), (None, "instruct")])
async def test_auto_resumes_a_llama_cpp_server_by_prefill(
    server: str | None, strategy: str
) -> None:
    """`server: llama.cpp` on the first response: the resume is a prefill (the partial answer
    as the final assistant turn, continue_final_message); an unknown server gets instruct."""
    first = ["The", " quick", " brown"]
    second = [" fox", " jumps."] if server else ["quick brown", " fox", " jumps."]
    async with hostile(*cut_then(first, second, server=server)) as srv:
        text, events, done = await collect(
            streamres.stream_resilient(
                USER, model="m", base_url=srv.url, backoff=FAST, replay=False
            )
        )
    assert text == "The quick brown fox jumps."
    assert [e.strategy for e in events if e.type == "resume"] == [strategy]
    resumed = body_of(srv.requests[1])
    if strategy == "prefill":
        assert resumed["continue_final_message"] is True
        assert resumed["messages"][-1] == {"role": "assistant", "content": "The quick brown"}
        assert done.join == "prefill"
    else:
        assert "continue_final_message" not in resumed
        assert resumed["messages"][-1]["role"] == "user"
        assert done.join == "deduplicated"


@pytest.mark.parametrize(("server", "left"), [("llama.cpp", 20 - 3), (None, None)])
async def test_the_budget_left_is_counted_in_the_servers_tokens(
    server: str | None, left: int | None
) -> None:
    """llama.cpp sends one token per event: after a prefill resume, the request asks for the
    budget less the events delivered (its own tokens), not less a count in another encoding.
    Elsewhere the ledger's encoding counts."""
    from streamres._shell.stream import _load_counter_now

    first = ["Photosynthesis", " is", " remarkable"]  # 3 events; more tokens in cl100k
    async with hostile(*cut_then(first, ["!"], server=server)) as srv:
        await collect(
            streamres.stream_resilient(
                USER,
                model="m",
                base_url=srv.url,
                backoff=FAST,
                max_tokens=20,
                continuation="prefill",
                replay=False,
            )
        )
    asked = body_of(srv.requests[1])["max_tokens"]
    cl100k = _load_counter_now("m")[1]("".join(first))
    assert cl100k != 3  # the two counts differ, so the test tells them apart
    assert asked == (left if left is not None else 20 - cl100k)


async def test_a_server_that_restarts_a_prefill_is_remembered_as_instruct() -> None:
    """Asked for prefill, a server that starts the answer over (llama-cpp-python ignores
    continue_final_message): the restart is removed whole, and the next resume is instruct."""
    first = ["The", " quick", " brown"]
    restart = ["The", " quick", " brown", " fox", " jumps."]
    responses = cut_then(first, restart, server="llama.cpp")  # says it continues; does not
    async with hostile(responses[0], responses[0], responses[1]) as srv:
        text, events, done = await collect(
            streamres.stream_resilient(
                USER, model="m", base_url=srv.url, backoff=FAST, replay=False
            )
        )
    assert text == "The quick brown fox jumps."
    assert [e.strategy for e in events if e.type == "resume"] == ["prefill", "instruct"]
    assert done.join == "restart_removed"


def _instruct(up: Upstream) -> streamres.ResilientStream:
    """The question, resumed by instruct on the embedded upstream."""
    return streamres.stream_resilient(
        USER, model="m", base_url=up.openai_url, api_key="k", continuation="instruct", backoff=FAST
    )


async def test_an_instruct_continuation_that_ends_at_the_seam_is_not_a_complete_answer() -> None:
    """A model that only ever restarts and stops short of the cut: asked again (the other
    wording), then the answer ends as it stands — and the done event says it is incomplete."""
    async with Upstream(faults=FaultPlan("reset@20"), instruct="shorter") as up:
        text, _events, done = await collect(_instruct(up))
        full = up.answer(USER)
    assert text and full.startswith(text) and text != full
    assert not ends_a_sentence(text)
    assert done.finish_reason == "stop"
    assert done.join == "ended_at_seam" and not done.complete
    assert done.attempts == 2 + SEAM_TRIES
    wordings = [r.body["messages"][-1]["content"] for r in up.requests[1:]]
    assert wordings[0] == streamres.CONTINUE_INSTRUCTION
    assert "It ended with: «" in wordings[1]


async def test_a_restart_that_stops_at_a_sentence_end_is_not_passed_off_as_complete() -> None:
    """Cut after a whole sentence, the model (asked to continue) says that sentence again and
    stops: nothing was added. That is no finished answer either: asked again, and reported."""
    first = ["Plants", " make", " food.", " They", " use"]
    cut = [head(), *(chunk(openai_chunk(w)) for w in first[:3]), "reset"]
    again = [
        head(),
        *(chunk(openai_chunk(w)) for w in first[:3]),
        chunk(openai_chunk(finish="stop")),
        chunk(b"data: [DONE]\n\n"),
        END,
    ]
    async with hostile(cut, again) as srv:
        text, _events, done = await collect(
            streamres.stream_resilient(
                USER, model="m", base_url=srv.url, continuation="instruct", backoff=FAST
            )
        )
        requests = len(srv.requests)
    assert text == "Plants make food."
    assert done.join == "ended_at_seam" and not done.complete
    assert requests == 2 + SEAM_TRIES


async def test_the_quoting_wording_recovers_a_continuation_that_stopped_at_the_seam() -> None:
    """The plain wording gets a short restart; asked again quoting the partial's last words,
    the model continues: the answer is whole, and joined by de-duplication."""
    async with Upstream(faults=FaultPlan("reset@20"), instruct="quoted") as up:
        text, events, done = await collect(_instruct(up))
        assert text == up.answer(USER)
    assert done.complete and done.join == "deduplicated"
    assert [e.reason for e in events if e.type == "resume"] == ["connection", "ended_at_seam"]


async def test_after_two_seams_the_next_model_is_asked() -> None:
    """One model keeps stopping at the seam; the next model of the chain continues it."""
    models = {
        "big": ModelSpec(faults=FaultPlan("reset@20"), instruct="shorter"),
        "small": ModelSpec(instruct="exact"),
    }
    async with Upstream(models=models) as up:
        routes = [
            Route(name, base_url=up.openai_url, api_key="k", continuation="instruct")
            for name in models
        ]
        async with Client(routes, backoff=FAST) as client:
            text, events, done = await collect(client.stream(USER, model=["big", "small"]))
        assert text == up.answer(USER)
        asked = [(r.model, r.body["messages"][-1]["content"]) for r in up.requests]
    assert done.model == "small" and done.complete
    steps = [(e.type, e.reason) for e in events if e.type in ("resume", "fallback")]
    assert steps == [
        ("resume", "connection"),
        ("resume", "ended_at_seam"),  # asked again, quoting its last words
        ("fallback", "ended_at_seam"),
    ]
    assert [m for m, _ in asked] == ["big", "big", "big", "small"]
    assert "It ended with: «" in asked[2][1]


def test_a_drifting_restart_is_cut_at_a_word_seam() -> None:
    """Rule 2 cuts at the start of the word where the restart drifted, never inside it."""
    delivered = (
        "Ray tracing follows light backwards from the eye into the scene, bouncing it off "
        "each surface it meets until it reaches a lamp, which is known as"
    )
    dd = Deduplicator(delivered, mode="instruct")
    drift = delivered[:102] + "ys of light and then stops."  # drifts inside "until"
    out = dd.feed(drift, now=0.0) + dd.finish(now=0.1)
    assert dd.stats.diverged
    dropped = dd.stats.dropped
    assert dropped + out == drift
    assert out[0].isspace() and out.lstrip()[0].isalpha()
    assert drift[len(dropped) - 1].isalpha() or drift[len(dropped) - 1] in ",."


@pytest.mark.parametrize(
    ("delivered", "head", "joined"),
    [
        ("It is known as", "Ray tracing.", "It is known as Ray tracing."),
        ("The window halves.", "Then it grows.", "The window halves. Then it grows."),
        ("The window grows", " slowly.", "The window grows slowly."),
        ("It computes the compu", "ter's answer.", "It computes the computer's answer."),
        ("```js\nconst v = obj.get", "Value();", "```js\nconst v = obj.getValue();"),
        ("It speaks HT", "TP/1.1 only.", "It speaks HTTP/1.1 only."),
    ],
)
def test_a_new_turn_that_dropped_its_space_gets_it_back(
    delivered: str, head: str, joined: str
) -> None:
    """A capitalised word or a word after a stop gets its space back; a word cut mid-way
    ("compu" + "ter"), an acronym cut mid-way and an identifier in a code block are left
    whole."""
    dd = Deduplicator(delivered, mode="instruct")
    out = dd.feed(head, now=0.0) + dd.finish(now=0.1)
    assert delivered + out == joined


def test_sentence_ends_in_every_script() -> None:
    """What may end an answer: a stop in any script, a closing fence, a line break."""
    assert all(map(ends_a_sentence, ["Done.", "好。", "「好。」", "x\n", "```py\nx\n```", "Why?"]))
    assert not any(map(ends_a_sentence, ["known as Ray", "return n * factor", "蜜蜂跳舞，"]))


def test_continues_prefill_is_learned_from_the_server_header() -> None:
    """llama.cpp names itself; other servers (uvicorn, none) do not count as evidence."""
    assert continues_prefill({"server": "llama.cpp"})
    assert not continues_prefill({"server": "uvicorn"}) and not continues_prefill({})
    assert choose("openai", "http://h/v1", "auto", server_continues=True) == "prefill"
    assert choose("openai", "http://h/v1", "auto") == "instruct"
    assert choose("openai", "http://h/v1", "instruct", server_continues=True) == "instruct"


def test_the_quoting_wording_quotes_from_a_word_start() -> None:
    """The second wording quotes the partial answer's tail, from a word start."""
    partial = "word " * 100 + "the last words"
    said = instruction(partial, 1)
    quoted = said.split("«", 1)[1].split("»", 1)[0]
    assert partial.endswith(quoted) and quoted.startswith("word") and len(quoted) <= 160
    assert instruction(partial, 0) == streamres.CONTINUE_INSTRUCTION


# -- what a real instruct model sends (recorded from SmolLM2 on llama-server) ------------------

SMOL = Path(__file__).parents[1] / "recordings" / "smollm2"


def _deltas(name: str) -> list[str]:
    """The text pieces of a recorded stream, one per event, as they came."""
    pieces = []
    for line in (SMOL / f"chat-{name}.sse").read_bytes().split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    pieces.append(choice["delta"]["content"])
    return pieces


def test_the_recorded_prefill_continues_the_same_turn_exactly() -> None:
    """Recorded: the partial code answer sent back with continue_final_message; the real
    model's reply is exactly the rest of its uncut answer."""
    partial = json.loads((SMOL / "cuts.json").read_text("utf-8"))["code"]
    whole = "".join(_deltas("answer-code"))
    dd = Deduplicator(partial, mode="prefill")
    out = "".join(dd.feed(piece, now=0.0) for piece in _deltas("prefill-continues"))
    assert partial + out + dd.finish(now=0.0) == whole


def test_a_recorded_real_restart_is_never_shown_twice() -> None:
    """Recorded: asked in a new turn to continue, the real model begins the answer again.
    Fed as it came, the de-duplicator removes the repeat: no run of the delivered text comes
    back to the caller."""
    from streamres.upstream.real import longest_common

    partial = json.loads((SMOL / "cuts.json").read_text("utf-8"))["code"]
    reply = _deltas("instruct-restarts")
    assert "".join(reply)[:20] == partial[:20]  # what the model really does: a restart
    dd = Deduplicator(partial, mode="instruct")
    out = "".join(dd.feed(piece, now=0.0) for piece in reply) + dd.finish(now=0.0)
    assert dd.stats.restarted or dd.stats.diverged
    assert longest_common(partial, out) < 20, out[:120]
