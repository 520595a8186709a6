"""The semantic benchmark's labelled pairs, asked through a client: the benchmark's rule is the
cache's."""

from __future__ import annotations

import math

import pytest

from streamres import Semantic
from streamres._shell.embedder import bundled_model
from streamres.benchmarks import semantic as semantic_eval
from streamres.upstream import Upstream
from tests.shell.test_semantic import _answer, _ask, _client

pytestmark = pytest.mark.anyio


async def test_labelled_pairs_hit_above_the_threshold_and_miss_below() -> None:
    """Every labelled pair asked through a client with the bundled model: the second question is
    answered from the cache exactly when the cache's rule says its score reaches the threshold
    — and at the defaults no different question is answered with another's answer on the
    held-out pairs (written before their scores were seen)."""
    model = bundled_model()
    semantic = Semantic()
    pairs = semantic_eval.load_pairs()
    async with (
        Upstream() as up,
        _client(up, semantic) as client,
    ):
        assert await client.cache_ready()
        seen: dict[tuple[str, bool], int] = {}
        for i, pair in enumerate(pairs):
            system = f"pair {i}"  # each pair in its own context
            first = await _answer(client, pair["a"], system=system)
            second = await _answer(client, pair["b"], system=system)
            expected = semantic_eval.decide(model, semantic, pair["a"], pair["b"])
            assert (second.cache == "semantic") == (expected is not None), pair
            if expected is not None:
                assert second.text == first.text and second.cache_match == pair["a"]
                assert math.isclose(second.cache_score, expected, abs_tol=1e-3)
                seen[(pair["set"], pair["same"])] = seen.get((pair["set"], pair["same"]), 0) + 1
            else:
                assert second.text == up.answer(_ask(pair["b"], system))
    assert seen.get(("held-out", False), 0) == 0  # precision 1.0 on the held-out pairs
    assert seen.get(("held-out", True), 0) > 0 and seen.get(("tuning", True), 0) > 0
