"""Overlap de-duplication: never repeat delivered text, never drop new text."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from streamres._core.dedup import Deduplicator

D = "TCP slow start doubles the congestion window every round trip until the threshold"


def run(delivered: str, pieces: list[str], mode: str = "instruct", **kw: object) -> str:
    dd = Deduplicator(delivered, mode=mode, **kw)  # type: ignore[arg-type]
    out = "".join(dd.feed(p, now=0.0) for p in pieces)
    return out + dd.finish(now=0.0)


def test_tail_overlap_removed() -> None:
    """A repeated tail (the instruct case) is dropped."""
    assert run(D, ["until the", " threshold", " is reached."]) == " is reached."


def test_partial_word_overlap_removed() -> None:
    """A cut mid-word, repeated from the word's start, joins cleanly."""
    assert run("the quick bro", ["brown", " fox"]) == "wn fox"


def test_restart_removed() -> None:
    """A restart from the beginning is dropped up to where the answer stopped."""
    assert run(D, [D[:30], D[30:], " is reached."]) == " is reached."


def test_preamble_stripped() -> None:
    """'Sure, continuing: …' is not part of the answer."""
    assert run(D, ["Sure, continuing from where I left off: ", "the threshold is hit."]) == (
        " is hit."
    )


def test_real_text_that_starts_like_a_preamble_is_kept() -> None:
    """'Okay, so…' is text, not a preamble (and a new sentence after a word gets its space)."""
    assert run(D, ["Okay, so", " that is it."]) == " Okay, so that is it."


def test_exact_continuation_passes() -> None:
    """New text with no overlap passes whole."""
    assert run(D, [" is reached", "."]) == " is reached."


def test_short_coincidence_is_not_dropped() -> None:
    """A short match that is not a word-aligned tail is kept: a duplicate beats a loss."""
    assert run("value: 10", ["0 items"]) == "0 items"


def test_prefill_stripped_whitespace_absorbed() -> None:
    """Prefill with trailing whitespace removed: the re-emitted space is dropped."""
    assert run("Hello world \n", [" \nnext"], mode="prefill", stripped=2) == "next"


def test_prefill_exact_continuation_is_not_held() -> None:
    """An exact prefill continuation is released at its first character."""
    dd = Deduplicator("Hello world", mode="prefill")
    assert dd.feed(", and", now=0.0) == ", and"


def test_prefill_restart_detected() -> None:
    """A server that ignored the prefill and restarted is de-duplicated too."""
    assert run("Hello world", ["Hello", " world", ", again"], mode="prefill") == ", again"


def test_hold_time_bound() -> None:
    """A short ambiguous head that matches the delivered text far from its end (a model
    restarts near the end: a sentence or so back) is released after max_hold_seconds, even
    with no new text."""
    long = D + ". " + " ".join(f"then round {i} of the exchange" for i in range(12))
    dd = Deduplicator(long, mode="instruct", max_hold_seconds=1.0)
    assert dd.feed("slow start", now=0.0) == ""
    assert dd.release_at == 1.0
    assert dd.poll(now=0.5) == ""
    assert dd.poll(now=1.0) == "slow start"


E = "Slow start grows the window. Résumé at whileño."


def test_a_slow_repeat_of_the_answer_s_end_is_not_released_half_way() -> None:
    """Cut at the very end, the model repeats the last words, a chunk every 3 s (a storm on a
    busy machine): the time bound does not release the repeat half-way — the end is not shown
    twice (it once was: " Résumé at whileño." after the answer's true end)."""
    dd = Deduplicator(E, mode="instruct", max_hold_seconds=2.0)
    assert dd.feed(" Résumé", now=0.0) == ""
    assert dd.release_at is None
    assert dd.poll(now=2.5) == ""
    out = dd.feed(" at", now=3.0) + dd.feed(" whileño.", now=6.0) + dd.finish(now=6.1)
    assert out == ""


def test_a_slow_repeat_of_the_end_then_new_text_shows_the_new_text() -> None:
    dd = Deduplicator(E, mode="instruct", max_hold_seconds=2.0)
    out = dd.feed(" Résumé at", now=0.0) + dd.feed(" whileño.", now=3.0)
    assert out + dd.feed(" And then", now=6.0) + dd.finish(now=6.1) == " And then"


def test_a_repeat_of_the_end_that_stops_short_adds_nothing() -> None:
    dd = Deduplicator(E, mode="instruct")
    assert dd.feed(" Résumé at", now=0.0) + dd.finish(now=0.1) == ""


def test_new_text_that_only_begins_like_the_end_is_shown_whole() -> None:
    """Held while it matched the end's words, released whole when it parts from them."""
    dd = Deduplicator(E, mode="instruct", max_hold_seconds=2.0)
    out = dd.feed(" Résumé", now=0.0) + dd.poll(now=2.5) + dd.feed(" writing is", now=3.0)
    assert out + dd.finish(now=3.1) == " Résumé writing is"


def test_abandon_returns_held_text() -> None:
    """If the resumed stream breaks while holding, the held text is handed back undelivered."""
    dd = Deduplicator(D, mode="instruct")
    dd.feed("the thr", now=0.0)
    assert dd.abandon() == "the thr"
    assert dd.resolved


def test_diverged_restart_emits_from_divergence() -> None:
    """A long restart that drifts is dropped up to the drift, then passes."""
    assert run(D, [D[:70] + " XYZ"]) == " XYZ"


# -- properties ------------------------------------------------------------------------------

words = st.lists(
    st.sampled_from(["ab", "ba", "abb", "a", "b", "ab\n", "数据", "é", "🚀?", "(b"]), min_size=1
)
delivered_text = words.map(" ".join)
# New text starts with a character that never occurs in delivered text.
new_text = st.text(alphabet="xyz .\n", min_size=1).map(lambda s: "Z" + s)


def chunked(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(delivered_text, new_text, st.integers(min_value=0), st.lists(st.integers(min_value=0)))
def test_never_repeats_a_long_overlap(d: str, new: str, k: int, cuts: list[int]) -> None:
    """A resumed head = (a suffix of D of >= min_overlap chars) + new text -> exactly new text."""
    k = k % (len(d) + 1)
    assume(len(d) - k >= 12 or k == 0)
    assert run(d, chunked(d[k:] + new, cuts)) == new


def test_short_overlap_starting_with_a_symbol() -> None:
    """A repeated tail of whole words is removed even when it starts with an emoji."""
    assert run("loss 🚀? Again ☕", ["🚀? Again ☕", " then"]) == " then"


@given(delivered_text, new_text, st.integers(min_value=0), st.lists(st.integers(min_value=0)))
def test_word_aligned_overlap_of_any_length(d: str, new: str, k: int, cuts: list[int]) -> None:
    """A head that repeats D from any word start (the instruct case) joins exactly."""
    starts = [i for i in range(1, len(d)) if d[i - 1] == " " and d[i] != " "]
    assume(starts)
    k = starts[k % len(starts)]
    assert run(d, chunked(d[k:] + " " + new, cuts)) == " " + new


@given(delivered_text, new_text, st.lists(st.integers(min_value=0)))
def test_never_drops_new_text(d: str, new: str, cuts: list[int]) -> None:
    """A head with no overlap passes whole, however it is chunked (with its space put back
    when it starts a capitalised word right after a word or a stop)."""
    out = run(d, chunked(new, cuts))
    assert out == run(d, [new])
    assert out == new or (out == " " + new and not d[-1].isspace() and new[0].isalnum())


@given(delivered_text, new_text, st.lists(st.integers(min_value=0)), st.sampled_from([0, 1, 2]))
def test_prefill_joins_exactly(d: str, new: str, cuts: list[int], strip: int) -> None:
    """Prefill: the stripped whitespace re-emitted plus new text -> exactly new text."""
    d = d + " " * strip
    assert run(d, chunked(" " * strip + new, cuts), mode="prefill", stripped=strip) == new


@pytest.mark.parametrize(
    "preamble", ["Sure, continuing: ", "Continuing…", "...", "Okay, here's the rest: "]
)
def test_preambles(preamble: str) -> None:
    """Common continuation preambles are removed."""
    assert run(D, [preamble + "Next part."]) == " Next part."  # D ends "…the threshold"


def test_text_opening_like_a_preamble_is_released_early() -> None:
    """'Here. …' is not a preamble: it passes as soon as that is clear, not after 48 chars."""
    dd = Deduplicator(D, mode="instruct")
    assert dd.feed("Here", now=0.0) == ""
    assert dd.feed(". Next", now=0.0) == " Here. Next"
