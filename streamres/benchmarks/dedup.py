"""The de-duplication benchmark: how exactly resumed answers join, per language.

Pure and seeded (no network): answers of the embedded upstream in English, Chinese, Japanese,
Korean, Thai, mixed CJK + Latin + emoji, and code are cut at a token, and the "model" resumes
the way instruct continuations do — backing up 0–60 tokens from the end of what it was shown
(the request leaves the last token out in scripts without spaces, as the library's does) to a
token start, a word start, a clause start or a sentence start, with or without a preamble in
the answer's language — or continues with a coincidental near-repeat of an earlier phrase,
which must be kept. Each head is
fed token by token, 20 ms apart, as a server streams it.

Reported per language: exact joins (all cases; overlaps of 2 tokens or more that start at a
seam; sentence starts), characters shown twice, new characters wrongly dropped (must be 0), and
the hold-back of new text (the most tokens of new text held back, and that many tokens at 50
tokens/s in ms; a repeat being held delays nothing the user does not already have).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from streamres._core.dedup import Deduplicator, hold_back
from streamres._core.tokens import counter_for, token_starts
from streamres.upstream._answers import PREAMBLES, Lang, answer_for, split_tokens

__all__ = ["LANGUAGES", "run"]

_QUESTIONS: dict[str, tuple[Lang, str]] = {
    "English": ("en", "Explain TCP slow start."),
    "Chinese": ("zh", "解释蜜蜂的舞蹈和TCP慢启动。"),
    "Japanese": ("ja", "ミツバチのダンスを説明してください。"),
    "Korean": ("ko", "꿀벌의 춤을 설명해 주세요."),
    "Thai": ("th", "อธิบายการเต้นของผึ้ง"),
}
LANGUAGES = (*_QUESTIONS, "mixed CJK+Latin+emoji", "code")
_TICK = 0.02  # seconds between streamed tokens
_SENTENCE = re.compile(r"(?:[。！？]|[.!?](?=\s)|\n)\s*")
_CLAUSE = re.compile(r"[，、；：,;:]\s*")


def _answer(language: str, seed: int) -> tuple[str, Lang]:
    if language in _QUESTIONS:
        lang, q = _QUESTIONS[language]
        return answer_for([{"role": "user", "content": f"{q} #{seed}"}], words=120, lang=lang), lang
    if language == "code":
        rng = random.Random(seed)
        lines = []
        for i in range(30):
            name = rng.choice(["window", "rate", "retry", "deadline", "tokens", "拥塞窗口"])
            lines.append(
                rng.choice(
                    [
                        f"    {name}_{i} = min({name}_{i - 1} * 2, limit)  # 翻倍 🚀",
                        f"    if {name}_{i} > threshold:\n        return {name}_{i} // 2",
                        f"def step_{i}({name}: int) -> int:",
                        f'    log.info("step {i}: %s", {name})',
                    ]
                )
            )
        return "```python\n" + "\n".join(lines) + "\n```", "en"
    en = answer_for([{"role": "user", "content": f"q {seed}"}], words=60, lang="en")
    zh = answer_for([{"role": "user", "content": f"问 {seed}"}], words=60, lang="zh")
    parts = [p for pair in zip(en.split(". "), zh.split("。"), strict=False) for p in pair]
    return "。".join(parts) + "🐝", "zh"


def _token_offsets(text: str) -> list[int]:
    offsets, at = [], 0
    for piece, _ in split_tokens(text):
        offsets.append(at)
        at += len(piece)
    return offsets


def _repeats_the_end(delivered: str, new: str) -> bool:
    """Does ``new`` begin with the last characters of ``delivered`` (beyond whitespace)?"""
    tail = delivered[-40:]
    return any(tail[k:].strip() and new.startswith(tail[k:]) for k in range(len(tail)))


@dataclass
class _Row:
    cases: int = 0
    exact: int = 0
    duplicated: int = 0
    dropped: int = 0
    held_tokens: int = 0
    boundary_cases: int = 0
    boundary_exact: int = 0
    sentence_cases: int = 0
    sentence_exact: int = 0
    near_repeat_cases: int = 0
    held_back: int = 0
    missed: int = 0


def _case(
    answer: str, lang: Lang, rng: random.Random, *, hold: bool
) -> tuple[str, str, str, int, str, int]:
    """(delivered, head, expected new text, tokens backed up, kind, characters held back).

    ``hold``: the request leaves the delivered text's last token out where the library does
    (:func:`~streamres._core.dedup.hold_back`), so the model backs up from the shorter text
    it was shown, and writes the held-back characters again."""
    offsets = _token_offsets(answer)
    lo, hi = len(offsets) // 4, len(offsets) * 3 // 4
    cut = offsets[rng.randrange(lo, hi)]
    delivered, rest = answer[:cut], answer[cut:]
    held = hold_back(delivered, token_starts("m", delivered)) if hold else 0
    shown = cut - held  # the end of what the model was shown
    kind = rng.choice(["token", "word", "clause", "sentence", "near-repeat"])
    before = [o for o in offsets if o < shown]
    if kind == "near-repeat":
        # The continuation starts with a phrase said earlier (not the delivered text's end).
        phrase_at = rng.randrange(0, max(1, len(before) - 12))
        phrase = answer[
            before[phrase_at] : before[min(phrase_at + rng.randint(2, 8), len(before) - 1)]
        ]
        if not phrase or _repeats_the_end(delivered, phrase + rest):
            # A text that itself repeats what was just said reads exactly like a restart (the
            # same bytes): no de-duplicator can tell them apart, so it is not a near-repeat.
            phrase = ""
        if held:
            # The held-back characters are the model's to write first, then its new text.
            return delivered, delivered[shown:] + phrase + rest, phrase + rest, 0, kind, held
        return delivered, phrase + rest, phrase + rest, 0, kind, held
    if kind == "token":
        n = rng.randint(0, 60)
        start = before[-n] if n and len(before) >= n else shown
    elif kind == "word":
        words = re.finditer(r"(?<=\s)\S", delivered[:shown])
        starts = [m.start() for m in words][-rng.randint(1, 12) :]
        start = starts[0] if starts else shown
    else:
        pattern = _SENTENCE if kind == "sentence" else _CLAUSE
        ends = [m.end() for m in pattern.finditer(delivered) if m.end() < shown]
        start = ends[-1] if ends else 0
    n = len([o for o in before if o >= start])
    if n > 60:  # backs up at most 60 tokens
        start, n = before[-60], 60
    head = answer[start:]
    if n and rng.random() < 0.3:
        # After a preamble a model restarts at a seam (with "continuing: " an exact continuation
        # would lose the space it began with, which nobody can know it had).
        head = rng.choice(PREAMBLES[lang]) + head.lstrip(" ")
    return delivered, head, rest, n, kind, held


def run(
    cases_per_language: int = 400, seed: int = 2026, *, hold: bool = True
) -> list[dict[str, Any]]:
    """The benchmark table: one row per language (``hold``: with the library's hold-back of the
    last token in scripts without spaces; ``False``: the whole delivered text shown)."""
    _, count = counter_for("m")
    rows: dict[str, _Row] = defaultdict(_Row)
    for language in LANGUAGES:
        rng = random.Random(f"{seed}:{language}")
        row = rows[language]
        for i in range(cases_per_language):
            answer, lang = _answer(language, seed * 1000 + i // 8)
            delivered, head, expected, backed, kind, held = _case(answer, lang, rng, hold=hold)
            dd = Deduplicator(
                delivered,
                mode="instruct",
                token_starts=token_starts("m", delivered),
                withheld=held,
            )
            out, t = "", 0.0
            for piece, _ in split_tokens(head):
                out += dd.feed(piece, now=t)
                t += _TICK
            out += dd.finish(now=t)
            row.cases += 1
            row.held_back += bool(held)
            row.missed += dd.missed
            ok = out == expected
            row.exact += ok
            if not ok:
                if out.endswith(expected):
                    row.duplicated += len(out) - len(expected)
                else:
                    row.dropped += max(1, len(expected) - len(out))
            # New text held back: what was held beyond the repeat and the preamble (a repeat
            # being held delays nothing the user does not already have).
            repeat = len(dd.stats.dropped) + len(dd.stats.preamble)
            held_new = head[repeat : max(repeat, dd.stats.held_chars)]
            row.held_tokens = max(row.held_tokens, count(held_new))
            if kind == "near-repeat":
                row.near_repeat_cases += 1
            elif backed >= 2:
                row.boundary_cases += 1
                row.boundary_exact += ok
                if kind == "sentence":
                    row.sentence_cases += 1
                    row.sentence_exact += ok
    return [
        {
            "language": language,
            "cases": r.cases,
            "exact_pct": round(100 * r.exact / r.cases, 1),
            "exact_boundary_2tok_pct": round(100 * r.boundary_exact / max(1, r.boundary_cases), 1),
            "exact_sentence_pct": round(100 * r.sentence_exact / max(1, r.sentence_cases), 1),
            "near_repeats_kept": r.near_repeat_cases,
            "duplicated_chars": r.duplicated,
            "wrongly_dropped_chars": r.dropped,
            "max_new_tokens_held": r.held_tokens,
            "max_hold_ms_at_50_tok_s": round(r.held_tokens * 1000 * _TICK),
            "last_token_held_back": r.held_back,
            "asked_again_whole": r.missed,
        }
        for language, r in rows.items()
    ]
