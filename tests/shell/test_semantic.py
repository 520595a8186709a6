"""The semantic cache: a question asked in other words answered from the cache — and a
different question not. The labelled pairs (English and Chinese) are decided by the bundled
model, offline; the rules around it are checked with a model of our own."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import streamres
from streamres._core.semantic import (
    Semantic,
    SemanticIndex,
    differs,
    normalise,
    numbers,
    split_question,
)
from streamres.upstream import Upstream
from tests.helpers.streams import collect

pytestmark = pytest.mark.anyio


def _ask(text: str, system: str | None = None) -> list[dict[str, Any]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": text}]


def _client(up: Upstream, semantic: Semantic) -> streamres.Client:
    """A client of one route on ``up`` with a semantic cache."""
    return streamres.Client(
        [streamres.Route("m", base_url=up.openai_url, api_key="k")],
        cache=streamres.Cache(semantic=semantic),
    )


async def _answer(
    client: streamres.Client, text: str, model: str = "m", **kw: Any
) -> streamres.DoneEvent:
    _, _, done = await collect(client.stream(_ask(text, kw.pop("system", None)), model=model, **kw))
    return done


# --- the rules, pure -------------------------------------------------------------------------


def test_normalising_folds_width_case_spacing_quotes_and_end_punctuation() -> None:
    assert normalise("  How do I   RESET my password?? ") == "how do i reset my password"
    assert normalise("用 Python 怎么读取文件？") == normalise("用Python怎么读取文件")
    assert normalise("ＨＴＴＰ　４２９") == "http 429"  # full-width letters, digits and space
    assert normalise("把“早上好”翻译成西班牙语。") == "把早上好翻译成西班牙语"
    assert normalise("What's 2+2?") == "whats 2+2"
    assert normalise("reset my password") != normalise("reset my router")


def test_only_a_last_user_text_is_a_question() -> None:
    context, question = split_question(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    ) or ([], "")
    assert question == "a\nb" and context[0]["content"] == "Be brief."
    assert context[-1] == {"role": "user", "content": None}
    image = {"type": "image_url", "image_url": {"url": "data:"}}
    assert split_question([{"role": "user", "content": [image]}]) is None
    assert split_question([{"role": "assistant", "content": "hi"}]) is None
    assert split_question([{"role": "user", "content": "  "}]) is None
    assert split_question([]) is None


def _vec(*xs: float) -> list[float]:
    return list(xs)


def test_the_index_matches_by_threshold_numbers_script_and_keeps_a_bound() -> None:
    index = SemanticIndex(max_entries=2)
    semantic = Semantic(threshold=0.9, threshold_cjk=0.99)
    always = lambda _key: True  # noqa: E731
    index.add("b", "k1", "What does HTTP 429 mean?", _vec(1, 0))
    close = _vec(1, 0.3)  # cosine 0.958
    assert index.closest("b", "What does HTTP 429 mean exactly?", close, semantic, always)
    # the same vector, another number: never the same question
    assert index.closest("b", "What does HTTP 503 mean?", close, semantic, always) is None
    # another bucket (another context) is never searched
    assert index.closest("other", "What does HTTP 429 mean?", _vec(1, 0), semantic, always) is None
    # an answer no longer kept is skipped
    assert index.closest("b", "What does HTTP 429 mean?", close, semantic, lambda _k: False) is None
    # CJK: its own (stricter) threshold
    index.add("b", "k2", "闰年有多少天？", _vec(0, 1))
    assert index.closest("b", "闰年一共有多少天？", _vec(0.3, 1), semantic, always) is None
    assert index.closest("b", "闰年一共有多少天？", _vec(0.1, 1), semantic, always)
    match = index.same("b", "闰年有多少天", always)
    assert match is not None and (match.key, match.score) == ("k2", 1.0)
    # bounded: the oldest goes first
    index.add("b", "k3", "Write a haiku.", _vec(1, 1))
    assert len(index) == 2 and index.same("b", "What does HTTP 429 mean?", always) is None


def test_semantic_settings_are_checked() -> None:
    for bad in ({"threshold": 0}, {"threshold": 1.5}, {"threshold_cjk": "high"}, {"routes": "m"}):
        with pytest.raises(ValueError, match="Semantic"):
            Semantic(**bad)
    with pytest.raises(ValueError, match="semantic"):
        streamres.Cache(semantic=0.93)  # type: ignore[arg-type]
    assert numbers("HTTP 429, 1,000 tokens, v3.11") == ("429", "1,000", "3.11")


# --- through a client, with a model of our own -----------------------------------------------

#: A toy model: each question's vector by hand (cosines chosen, not learned).
_TOY = {
    normalise("How do I reset my password?"): _vec(1, 0, 0),
    normalise("How can I reset my password?"): _vec(1, 0.2, 0),  # cosine 0.981
    normalise("How do I reset my router?"): _vec(1, 0.6, 0),  # cosine 0.857
}


def _toy(text: str) -> Sequence[float]:
    return _TOY.get(text, _vec(0, 0, 1))


async def test_a_question_in_other_words_is_answered_from_the_cache() -> None:
    """Above the threshold: the first question's answer, no request, the match and its score
    in the done event; below it: a request of its own."""
    async with (
        Upstream() as up,
        _client(up, Semantic(embed=_toy)) as client,
    ):
        assert await client.cache_ready()
        first = await _answer(client, "How do I reset my password?")
        again = await _answer(client, "How can I reset my password?")
        other = await _answer(client, "How do I reset my router?")
        assert len(up.requests) == 2
        assert again.text == first.text and again.cache == "semantic" and again.attempts == 0
        assert again.cache_match == "How do I reset my password?"
        assert math.isclose(again.cache_score, 1 / math.hypot(1, 0.2), abs_tol=1e-4)
        assert other.cache == "" and other.text == up.answer(_ask("How do I reset my router?"))
        stats = client.cache_stats()
        assert stats is not None
        assert (stats.semantic_hits, stats.misses, stats.requests_saved) == (1, 2, 1)
        from prometheus_client import CollectorRegistry, generate_latest

        from streamres.prometheus import register

        registry = CollectorRegistry()
        register(client, registry)
        assert "streamres_cache_semantic_hits_total 1.0" in generate_latest(registry).decode()


async def test_a_question_in_other_words_follows_one_in_flight() -> None:
    """Asked in other words while the first answer is still streaming: one upstream stream,
    both get the whole answer; the follower's done event names the question it followed."""
    async with (
        Upstream(token_delay=0.005) as up,
        _client(up, Semantic(embed=_toy)) as client,
    ):
        await client.cache_ready()
        done: dict[str, streamres.DoneEvent] = {}
        first_text = anyio.Event()

        async def ask(text: str) -> None:
            async for ev in client.stream(_ask(text), model="m"):
                if ev.type == "text":
                    first_text.set()
                if ev.type == "done":
                    done[text] = ev

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "How do I reset my password?")
            await first_text.wait()  # the first answer is streaming
            tg.start_soon(ask, "How can I reset my password?")
            tg.start_soon(ask, "How do I reset my router?")  # below the threshold: its own
        assert len(up.requests) == 2
        follower = done["How can I reset my password?"]
        assert follower.text == done["How do I reset my password?"].text
        assert follower.text == up.answer(_ask("How do I reset my password?"))
        assert (follower.cache, follower.cache_match) == ("joined", "How do I reset my password?")
        assert done["How do I reset my router?"].cache == ""


async def test_only_the_question_may_differ_and_only_on_routes_that_opted_in() -> None:
    """Another system prompt, other parameters, or a route not opted in: asked again."""
    async with (
        Upstream() as up,
        streamres.Client(
            [
                streamres.Route("m", base_url=up.openai_url, api_key="k"),
                streamres.Route("n", base_url=up.openai_url, api_key="k"),
            ],
            cache=streamres.Cache(semantic=Semantic(embed=_toy, routes=("m",))),
        ) as client,
    ):
        await client.cache_ready()
        await _answer(client, "How do I reset my password?", system="Be brief.", fallback=False)
        asked = len(up.requests)
        for kw in ({"system": "Be thorough."}, {"max_tokens": 50}, {}):
            done = await _answer(client, "How can I reset my password?", fallback=False, **kw)
            assert done.cache == ""
        assert len(up.requests) == asked + 3
        await _answer(client, "How do I reset my password?", model="n", fallback=False)
        done = await _answer(client, "How can I reset my password?", model="n", fallback=False)
        assert done.cache == "" and len(up.requests) == asked + 5


async def test_a_failing_model_costs_the_match_not_the_answer() -> None:
    def broken(text: str) -> Sequence[float]:
        raise RuntimeError("model exploded")

    async with (
        Upstream() as up,
        _client(up, Semantic(embed=broken)) as client,
    ):
        await client.cache_ready()
        first = await _answer(client, "How do I reset my password?")
        again = await _answer(client, "How can I reset my password?")
        same = await _answer(client, "how do I reset my password")  # normalised text: no model
        assert again.text == up.answer(_ask("How can I reset my password?"))
        assert same.text == first.text and len(up.requests) == 2
        assert (again.cache, same.cache, same.cache_score) == ("", "semantic", 1.0)


@pytest.fixture
def without_wordllama(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the semantic extra were not installed."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wordllama" else real(name, *a),
    )


@pytest.mark.usefixtures("without_wordllama")
def test_the_bundled_model_needs_its_package_said_plainly() -> None:
    with pytest.raises(streamres.InvalidRequest, match=r"pip install 'streamres\[semantic\]'"):
        streamres.Client(
            [streamres.Route("m", base_url="http://127.0.0.1:9/v1", api_key="k")],
            cache=streamres.Cache(semantic=Semantic()),
        )


def test_loading_the_bundled_model_leaves_the_applications_logging_alone() -> None:
    """wordllama configures the root logger when imported (basicConfig at INFO): in a fresh
    process, after the model is loaded, the root logger is as it was."""
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from streamres._shell.embedder import bundled_model\n"
        "bundled_model()('hello')\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), root.level)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", str(logging.WARNING)], out.stderr


@pytest.mark.usefixtures("without_wordllama")
def test_a_semantic_cache_without_its_package_is_one_line() -> None:
    from streamres.proxy.config import ConfigError, parse

    with pytest.raises(ConfigError, match=r"\[cache\]: .*pip install 'streamres\[semantic\]'"):
        parse({"routes": [{"model": "m"}], "cache": {"semantic": {}}}, {})


# --- the labelled pairs, with the bundled model (offline) ------------------------------------


async def test_a_model_answering_nonsense_costs_the_match_not_the_answer() -> None:
    """A user's model that answers something other than a vector (text, a matrix, NaN,
    zeros, another length than before): the question is matched by its text only, the
    answers are whole, nothing but the warning escapes."""
    answers: list[object] = [
        [1.0, 0.0],
        "vector",
        [[1.0, 0.0]],
        [float("nan"), 1.0],
        [0.0, 0.0],
        [1.0, 0.0, 0.0],
    ]

    def odd(text: str) -> Sequence[float]:
        return answers.pop(0) if answers else [1.0, 0.0]  # type: ignore[return-value]

    async with (
        Upstream() as up,
        _client(up, Semantic(embed=odd)) as client,
    ):
        await client.cache_ready()
        questions = [f"Question number {n} please" for n in "abcdef"]
        for q in questions:
            done = await _answer(client, q)
            assert done.text == up.answer(_ask(q)) and done.cache == ""
        assert len(up.requests) == len(questions)


GUARDED = [
    (
        "Is it safe to take ibuprofen with alcohol?",
        "Is it not safe to take ibuprofen with alcohol?",
    ),
    ("Is it safe to take ibuprofen with alcohol?", "Is it unsafe to take ibuprofen with alcohol?"),
    ("Convert 5 km to miles", "Convert 5 miles to km"),
    ("Give me a curry recipe with chicken", "Give me a curry recipe without chicken"),
    ("Should I stretch before running?", "Should I stretch after running?"),
    ("美元换人民币的汇率是多少", "人民币换美元的汇率是多少"),
    ("我能在飞机上带充电宝吗", "我不能在飞机上带充电宝吗"),
    ("价格含税吗", "价格不含税吗"),
]
REPEATS = [
    ("Why isn't my code working?", "Why is my code not working?"),
    ("Convert 5 km to miles", "Convert 5 km into miles"),
    ("Give me a curry recipe without chicken", "Give me a curry recipe that has no chicken"),
    ("How do I reset my password?", "How can I reset my password?"),
    ("为什么我的代码不工作", "为什么我的代码不能工作"),
]


@pytest.mark.parametrize(("a", "b"), GUARDED)
def test_a_negation_an_opposite_or_a_direction_is_another_question(a: str, b: str) -> None:
    assert differs(normalise(a), normalise(b)) and differs(normalise(b), normalise(a))


@pytest.mark.parametrize(("a", "b"), REPEATS)
def test_the_same_question_with_those_words_is_still_the_same(a: str, b: str) -> None:
    assert differs(normalise(a), normalise(b)) == ""


async def test_the_bundled_model_never_answers_the_opposite_question() -> None:
    """With the defaults and the bundled model: each question that differs in meaning from one
    asked before gets its own answer, and true repeats are still answered from the cache."""
    async with Upstream() as up, _client(up, Semantic()) as client:
        assert await client.cache_ready()
        for a, b in GUARDED:
            await _answer(client, a)
            assert (await _answer(client, b)).cache == "", (a, b)
        hits = 0
        for a, b in REPEATS:
            await _answer(client, a)
            hits += (await _answer(client, b)).cache in ("semantic", "hit")
    assert hits >= 4  # the bundled model's recall on these: the guards let them through
