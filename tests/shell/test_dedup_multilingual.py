"""De-duplication that reads Chinese, Japanese, Korean, Thai, emoji and code as well as English."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import streamres
from streamres._core.dedup import Deduplicator, hold_back, seam
from streamres._core.tokens import token_starts
from streamres.upstream import Upstream
from tests.helpers.streams import FAST, collect

pytestmark = pytest.mark.anyio


def run(delivered: str, pieces: list[str]) -> str:
    dd = Deduplicator(delivered, mode="instruct", token_starts=token_starts("m", delivered))
    out = "".join(dd.feed(p, now=0.0) for p in pieces)
    return out + dd.finish(now=0.0)


# -- the cases users saw ----------------------------------------------------------------------


def test_chinese_restart_at_a_token_inside_a_clause() -> None:
    """The model restarted at 条直线摆动 (mid-clause, no spaces): shown once."""
    d = "蜜蜂用舞蹈传递方向。采蜜归来的工蜂沿着一条直线摆动"
    assert run(d, ["条直线", "摆动", "，角度表示", "太阳的方向。"]) == "，角度表示太阳的方向。"


def test_chinese_restart_at_the_sentence_start() -> None:
    """这是一张 → 这是一张用动作画成的地图: the sentence restarted, shown once."""
    assert run("这是一张", ["这是", "一张", "用动作画成的地图"]) == "用动作画成的地图"


def test_restart_after_a_full_stop_with_an_emoji() -> None:
    """蜜蜂用舞蹈传递方向。🐝 → 🐝 采蜜…: the sentence after 。 restarted, shown once."""
    assert run("蜜蜂用舞蹈传递方向。🐝 ", ["🐝 ", "采蜜归来"]) == "采蜜归来"


def test_short_repeat_at_a_sentence_start_is_strong_evidence() -> None:
    """A one-word repeat that starts exactly at a sentence start is dropped."""
    assert run("The window halves. Then", ["Then", " it grows."]) == " it grows."
    assert run("窗口减半。然后", ["然后", "再次增长。"]) == "再次增长。"


@pytest.mark.parametrize(
    "preamble",
    [
        "好的，我继续：",
        "接着上文：",
        "好的，继续：",
        "下面继续：",
        "続けます：",
        "はい、続けます。",
        "계속하겠습니다: ",
        "네, 이어서 작성하겠습니다: ",
        "Bien sûr, je continue : ",
        "Gerne, ich fahre fort: ",
        "Claro, continúo: ",
        "Конечно, продолжаю: ",
    ],
)
def test_preambles_in_many_languages(preamble: str) -> None:
    """Continuation preambles in Chinese, Japanese, Korean and European languages go."""
    d = "蜜蜂用舞蹈传递方向。采蜜归来的工蜂沿着一条直线摆动"
    assert run(d, [preamble, "一条直线摆动", "，角度表示太阳。"]) == "，角度表示太阳。"


@pytest.mark.parametrize(
    "text", ["好的问题，先说窗口。", "はい、そうです。", "Okay, so that is it."]
)
def test_an_opener_alone_is_the_answers_own_text(text: str) -> None:
    """ "好的" or "はい、" without a continuation phrase is text, kept whole."""
    assert run("蜜蜂用舞蹈传递方向。", [text]) == text


def test_whitespace_alone_is_no_repeat() -> None:
    """A cut inside an indentation continues with the rest of it: nothing dropped."""
    d = "def f():\n    if x:\n        return 1\n   "
    assert run(d, [" return 2\n"]) == " return 2\n"


def test_seams_by_script() -> None:
    """Sentence, clause and word seams in several scripts; none inside a word or a number."""
    assert seam("慢启动。然后", 4) == "sentence"
    assert seam("慢启动，然后", 4) == "clause"
    assert seam("ゆっくり、そして", 5) == "clause"
    assert seam("a b", 2) == "word"
    assert seam("- item", 2) == "sentence"  # after a list marker
    assert seam("pi is 3.14", 9) == ""
    assert seam("拥塞窗口", 2) == ""


# -- properties over generated multilingual text --------------------------------------------

VOCAB = [
    "蜜蜂", "舞蹈", "方向", "工蜂", "直线", "摆动", "窗口", "翻倍", "的", "了",
    "ミツバチ", "ダンス", "方向を", "伝えます", "꿀벌은", "춤으로", "방향을",
    "ผึ้ง", "การเต้น", "the", "window", "grows", "🐝", "🚀", "TCP", "2",
]  # fmt: skip
PUNCT = ["", "", "", "，", "。", " ", " ", "、", ". ", "！", "\n"]

pieces = st.lists(st.tuples(st.sampled_from(VOCAB), st.sampled_from(PUNCT)), min_size=1)
texts = pieces.map(lambda ps: "".join(w + p for w, p in ps))


def chunked(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def repeats_the_end(d: str, new: str) -> bool:
    """``new`` itself begins by repeating the end of ``d``: the same bytes as a restart, which
    no de-duplicator can tell apart from one."""
    return any(d[k:].strip() and new.startswith(d[k:]) for k in range(len(d)))


def restarts_and_stops(d: str, new: str) -> bool:
    """``new`` is wholly a copy of ``d`` from its start or a seam: a restart that stopped before
    it caught up, which adds nothing (the machine asks again), whatever the bytes meant."""
    return any(d.startswith(new, k) for k in range(len(d)) if k == 0 or seam(d, k))


@given(texts, texts, st.lists(st.integers(min_value=0), max_size=6), st.data())
def test_never_drops_new_text_that_shares_words_and_phrases(
    d: str, new: str, cuts: list[int], data: st.DataObject
) -> None:
    """New text built from the same words (and sometimes a phrase copied from D) passes whole
    (with its space put back when it starts a capitalised word right after a word or a stop),
    however it is chunked."""
    if len(d) > 4 and data.draw(st.booleans()):
        a = data.draw(st.integers(0, len(d) - 2))
        b = data.draw(st.integers(a + 1, min(len(d), a + 40)))
        new = d[a:b] + new  # a coincidental near-repeat of an earlier phrase
    assume(not repeats_the_end(d, new) and not restarts_and_stops(d, new))
    out = run(d, chunked(new, cuts))
    assert out == run(d, [new])
    assert out == new or (out == " " + new and not d[-1].isspace() and new[0].isalnum())


@given(texts, texts, st.integers(min_value=0), st.lists(st.integers(min_value=0), max_size=6))
def test_exact_on_repeats_that_start_at_a_seam(d: str, new: str, k: int, cuts: list[int]) -> None:
    """Head = D from a sentence, clause or word start, or from a token start 2+ tokens back,
    then new text: exactly the new text comes out."""
    tokens = token_starts("m", d)
    seams = [
        i
        for i in range(1, len(d))
        if d[i:].strip()
        and (seam(d, i) or (i in tokens and len([t for t in tokens if t >= i]) >= 2))
    ]
    assume(seams)
    k = seams[k % len(seams)]
    head = d[k:] + new
    assume(not repeats_the_end(d, new))
    assume(not any(head.startswith(d[j:]) for j in range(k)))  # one reading only
    assert run(d, chunked(head, cuts)) == new


@given(texts, texts, st.lists(st.integers(min_value=0), max_size=8))
def test_chunking_never_changes_the_result(d: str, head: str, cuts: list[int]) -> None:
    """However the head is split into reads, the output is the same."""
    assert run(d, chunked(head, cuts)) == run(d, [head])


# -- end to end: a Chinese answer resumed through the embedded upstream -----------------------

ZH = [{"role": "user", "content": "解释蜜蜂的舞蹈和TCP慢启动。"}]


@pytest.mark.parametrize("instruct", ["overlap", "preamble"])
async def test_a_chinese_answer_resumed_shows_no_repeats(instruct: str) -> None:
    """The embedded upstream answers in Chinese and backs up at varied seams (with Chinese
    preambles): every resume joins exactly."""
    async with Upstream(faults="reset@15,error@40,reset@70", instruct=instruct) as up:
        text, _, done = await collect(
            streamres.stream_resilient(
                ZH,
                model="m",
                base_url=up.openai_url,
                api_key="k",
                continuation="instruct",
                backoff=FAST,
            )
        )
        answer = up.answer(ZH)
    assert "。" in answer and text == answer
    assert done.resumes == 3 and done.deduplicated_chars > 0


# -- a cut at the very end, resumed slowly (a storm on a busy machine) -------------------------


@given(
    st.sampled_from(["en", "zh", "ja", "ko", "th"]),
    st.integers(min_value=3, max_value=40),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=1, max_value=6),
    st.booleans(),
    st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=12),
)
def test_a_cut_at_the_very_end_resumed_slowly_adds_nothing(
    lang: str, words: int, seed: int, overlap: int, preamble: bool, sizes: list[int]
) -> None:
    """The whole answer was delivered, then the stream broke before its end: the model asked
    to continue backs up as the embedded upstream's does (words, tokens, a clause or a sentence
    back, behind a preamble or not) and sends its repeat in small chunks 3 s apart, polled in
    between — nothing is passed on (the end is never shown twice)."""
    import random

    from streamres.upstream._answers import PREAMBLES, answer_for, restart_point

    full = answer_for([{"role": "user", "content": f"Q{seed}"}], words=words, lang=lang)  # type: ignore[arg-type]
    draw = random.Random(seed)
    head = draw.choice(PREAMBLES[lang]) if preamble else ""  # type: ignore[index]
    h = head + full[restart_point(full, len(full), draw, overlap) :]
    dd = Deduplicator(full, mode="instruct", token_starts=token_starts("m", full))
    out, now, i = "", 0.0, 0
    for size in itertools.cycle(sizes):
        if i >= len(h):
            break
        out += dd.feed(h[i : i + size], now=now)
        out += dd.poll(now=now + 2.5)
        i, now = i + size, now + 3.0
    assert out + dd.finish(now=now) == ""


# -- the last token held back, so that a one-token repeat is proven ---------------------------


def test_the_last_token_is_held_back_only_where_its_repeat_is_unprovable() -> None:
    """A few letters of a script without spaces, not at a seam: held back. A spaced script, a
    seam (a repeat from there is accepted anyway), or a long last token: sent whole."""
    zh = "蜜蜂沿着一条直线摆动"
    assert hold_back(zh, token_starts("m", zh)) == 1
    assert hold_back("ミツバチのダンス", token_starts("m", "ミツバチのダンス")) >= 1
    assert hold_back("the quick brown", token_starts("m", "the quick brown")) == 0
    assert hold_back("一，二", [0, 1, 2]) == 0  # the last token starts a clause
    assert hold_back("TCP窗口", [0, 3]) == 2  # a last token of two characters
    assert hold_back("数据窗口翻倍了", [0, 2]) == 0  # 5 characters: too long to hold back
    assert hold_back("数据", []) == 0  # no encoding: nothing known of the tokens


@pytest.mark.parametrize(
    ("delivered", "head", "new"),
    [
        # The model repeated the last token (the bytes that used to stay doubled: "摆动动").
        ("沿着一条直线摆动", ["动，角度", "表示太阳。"], "，角度表示太阳。"),
        # It went on exactly from what it was shown: the held-back token, then the rest.
        ("沿着一条直线摆动", ["摆动，角度", "表示太阳。"], "，角度表示太阳。"),
        # A real doubled character at the cut: 他说谢谢 + 你 — shown once, never dropped.
        ("他说谢谢", ["谢你。"], "你。"),
        ("他说谢谢", ["谢谢你。"], "你。"),
    ],
)
def test_a_repeat_of_what_the_request_left_out_is_removed(
    delivered: str, head: list[str], new: str
) -> None:
    """The request left the last character out: a head that writes it again is a repeat by
    construction, whether it backs up one more character or not — and a real doubled
    character is kept, since the model never saw the second one."""
    dd = Deduplicator(
        delivered, mode="instruct", token_starts=token_starts("m", delivered), withheld=1
    )
    out = "".join(dd.feed(piece, now=i * 0.1) for i, piece in enumerate(head))
    assert out + dd.finish(now=1.0) == new
    assert not dd.missed


def test_a_repeat_of_the_last_token_stays_doubled_without_the_hold_back() -> None:
    """What the hold-back is for: shown the whole text, a one-character repeat and a real
    doubled character are the same bytes, and the repeat is kept (real text is never dropped)."""
    d = "沿着一条直线摆动"
    dd = Deduplicator(d, mode="instruct", token_starts=token_starts("m", d))
    assert dd.feed("动，角度表示太阳。", now=0.0) + dd.finish(now=1.0) == "动，角度表示太阳。"


def test_a_head_that_writes_none_of_what_was_left_out_is_not_joined() -> None:
    """Shown "…摆", the model went another way: joined to "…摆动" it would read wrong, so
    nothing of it is passed on and ``missed`` tells the machine to ask again."""
    d = "沿着一条直线摆动"
    dd = Deduplicator(d, mode="instruct", token_starts=token_starts("m", d), withheld=1)
    out = dd.feed("放在桌上，", now=0.0) + dd.feed("然后离开。", now=0.1)
    assert out + dd.finish(now=1.0) == "" and dd.missed
    assert dd.release_at is None and dd.abandon() == "放在桌上，"


@pytest.mark.parametrize(
    "question",
    [
        "解释蜜蜂的舞蹈和TCP慢启动。",
        "ミツバチのダンスを説明してください。",
        "อธิบายการเต้นรำของผึ้ง",
    ],
)
async def test_a_model_that_repeats_the_last_token_joins_exactly(question: str) -> None:
    """The embedded upstream's ``stutter``: asked to continue, it writes the last token it was
    shown once more, then goes on — in Chinese, Japanese and Thai; cut three times, the answer
    is exact (without the hold-back, each cut left a character doubled)."""
    messages = [{"role": "user", "content": question}]
    async with Upstream(faults="reset@11,error@29,reset@47", instruct="stutter") as up:
        text, _, done = await collect(
            streamres.stream_resilient(
                messages,
                model="m",
                base_url=up.openai_url,
                api_key="k",
                continuation="instruct",
                backoff=FAST,
            )
        )
        answer = up.answer(messages)
    assert text == answer
    assert done.resumes == 3 and done.deduplicated_chars >= 3


def test_a_thai_mark_is_never_held_back_without_its_letter() -> None:
    """A token that begins with a combining mark goes with the letter before it."""
    text = "ผึ้ง"  # ผ, ึ (a vowel mark), ้ (a tone mark), ง
    assert hold_back(text, [0, 1, 2, 3]) == 1  # ง alone
    assert hold_back(text[:3], [0, 1, 2]) == 0  # only marks after ผ: nothing to hold
