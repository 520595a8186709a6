"""Near-repeats: a question asked in other words finds the answer kept for it. Pure.

Theory of operation. Seed §4.2: in one Q&A app about 30 % of the requests were repeats or
near-repeats, and a cache matching questions by embedding similarity (threshold 0.92-0.95:
lower returns wrong answers, higher misses) cut model calls by about a third at peak.

Only the **last user message** is matched by meaning; everything else (the system prompt,
earlier turns, the model chain, the parameters) must be identical, so a question is only ever
compared with questions asked in the same context — that context's hash is the *bucket*. The
question is normalised first (Unicode NFKC, case folded, whitespace collapsed and dropped next
to CJK characters, quotes and trailing punctuation removed): two questions equal after that
are the same question, with or without an embedding model. Otherwise the embeddings' cosine
(vectors are normalised here) must reach the threshold — a stricter one when either question
has CJK characters, where the bundled model reads less well (README: precision and recall per
language on a labelled set) — and both questions must hold the same numbers ("HTTP 429" is not
"HTTP 503", however close their vectors) and must not differ in the words that turn a meaning
round, whatever their vectors say (:func:`differs`): a negation one has and the other lacks
("safe" / "not safe", "能" / "不能"), one of a pair of opposites ("with" / "without", "include" /
"exclude", "before" / "after", "more" / "less"…), or the same words in another order around a
direction ("5 km to miles" / "5 miles to km", "美元换人民币" / "人民币换美元").

This module keeps the index (buckets of questions with their vectors, bounded, oldest first
out) and answers "which kept question is this one's match, and how close". The shell embeds
(off the event loop when it would block) and keeps the answers themselves
(``_core.cache.AnswerStore``); an index entry whose answer has gone is skipped.
"""

from __future__ import annotations

import re
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy comes with the semantic extra; the settings (Semantic) need none
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]

__all__ = [
    "Match",
    "Semantic",
    "SemanticIndex",
    "differs",
    "has_cjk",
    "normalise",
    "numbers",
    "split_question",
]

_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_CJK_RE = re.compile(f"[{_CJK}]")
_SPACE_NEAR_CJK = re.compile(f"(?<=[{_CJK}]) +| +(?=[{_CJK}])")
_QUOTES = re.compile("[\"'\u201c\u201d\u2018\u2019\u300c\u300d\u300e\u300f`]")
_TRAILING = re.compile("[\\s?!.,;:\u3002\uff1f\uff01\uff0c\uff1b\uff1a\u3001\u2026~]+$")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass(frozen=True)
class Semantic:
    """Match questions by meaning (``Cache(semantic=Semantic())``; needs
    ``pip install 'streamres[semantic]'`` for the bundled model).

    ``threshold``: cosine similarity a question must reach (the seed's range is 0.92-0.95);
    ``threshold_cjk``: the same when either question has Chinese, Japanese or Korean characters
    (the top of the seed's range: the bundled model, an English-trained static embedding,
    scores Chinese near-misses high — "today's weather" against "tomorrow's" 0.94).
    ``routes``: route names whose requests may be answered this way (a request's first route
    decides); ``None``: every route. ``embed``: your own model, a function from text to a
    vector (called in a worker thread); default: the bundled WordLlama model, offline.
    """

    threshold: float = 0.93
    threshold_cjk: float = 0.95
    routes: tuple[str, ...] | None = None
    embed: Callable[[str], Sequence[float]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("threshold", "threshold_cjk"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(
                    f"Semantic: {name} is a cosine similarity in (0, 1], not {value!r}"
                )
        if self.routes is not None:
            if isinstance(self.routes, str) or not all(isinstance(r, str) for r in self.routes):
                raise ValueError("Semantic: routes is a tuple of route names (or None for all)")
            object.__setattr__(self, "routes", tuple(self.routes))
        if self.embed is not None and not callable(self.embed):
            raise ValueError("Semantic: embed is a function from text to a vector")

    def applies_to(self, first_route: str) -> bool:
        return self.routes is None or first_route in self.routes

    def threshold_for(self, a: str, b: str) -> float:
        return self.threshold_cjk if has_cjk(a) or has_cjk(b) else self.threshold


def has_cjk(text: str) -> bool:
    return _CJK_RE.search(text) is not None


def normalise(text: str) -> str:
    """The question as matched: width, case, spacing, quotes and end punctuation folded."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    text = _SPACE_NEAR_CJK.sub("", text)
    text = _QUOTES.sub("", text)
    return _TRAILING.sub("", text)


def numbers(text: str) -> tuple[str, ...]:
    """The numbers a question holds, in order (a match must hold the same)."""
    return tuple(_NUMBER.findall(text))


_WORD = re.compile(f"[{_CJK}]|[^\\W\\d_]+|\\d+(?:[.,]\\d+)*")
#: Negations, as normalised text has them (quotes dropped: "isn't" is "isnt").
_CONTRACTED = (
    "is",
    "are",
    "was",
    "were",
    "do",
    "does",
    "did",
    "ca",
    "could",
    "wo",
    "would",
    "should",
    "has",
    "have",
    "had",
    "must",
    "need",
    "ai",
)
_NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot"}
    | {f"{w}nt" for w in _CONTRACTED}
)
_NEGATIONS_CJK = ("不", "没", "無", "无", "非", "别", "別", "未", "勿", "莫")
#: Words whose opposite turns a question round (either way).
_OPPOSITES = {
    frozenset(pair)
    for pair in (
        ("with", "without"),
        ("include", "exclude"),
        ("including", "excluding"),
        ("add", "remove"),
        ("before", "after"),
        ("above", "below"),
        ("more", "less"),
        ("most", "least"),
        ("increase", "decrease"),
        ("maximum", "minimum"),
        ("max", "min"),
        ("first", "last"),
        ("safe", "unsafe"),
        ("possible", "impossible"),
        ("legal", "illegal"),
        ("true", "false"),
        ("enable", "disable"),
        ("import", "export"),
        ("buy", "sell"),
        ("upload", "download"),
        ("encrypt", "decrypt"),
        ("encode", "decode"),
        ("含", "除"),
        ("加", "减"),
        ("前", "后"),
        ("多", "少"),
        ("大", "小"),
        ("买", "卖"),
        ("上", "下"),
    )
}
_OPPOSITE_OF = {w: next(iter(pair - {w})) for pair in _OPPOSITES for w in pair}
#: Words around which order is meaning: "X to Y", "X into Y", "X than Y", "从X到Y", "X换Y".
_DIRECTED = frozenset(
    ("to", "into", "from", "than", "vs", "versus", "per", "in", "到", "换", "转", "比", "成", "对")
)


def _negations(words: list[str]) -> tuple[int, ...]:
    latin = sum(w in _NEGATIONS for w in words)
    cjk = sum(w in _NEGATIONS_CJK for w in words)
    return latin, cjk


def differs(a: str, b: str) -> str:
    """Why two questions alike in their words differ in meaning ("" when nothing says so); both
    normalised (:func:`normalise`)."""
    wa, wb = _WORD.findall(a), _WORD.findall(b)
    if _negations(wa) != _negations(wb):
        return "a negation one has and the other lacks"
    sa, sb = set(wa), set(wb)
    for w in sa - sb:
        opposite = _OPPOSITE_OF.get(w)
        if opposite is not None and opposite in sb - sa:
            return f"{w!r} against {opposite!r}"
    if _DIRECTED & sa and _DIRECTED & sb:
        shared = sa & sb - _DIRECTED
        order_a = [w for w in wa if w in shared]
        order_b = [w for w in wb if w in shared]
        if sorted(order_a) == sorted(order_b) and order_a != order_b:
            return "the same words in another order around a direction"
    return ""


def split_question(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], str] | None:
    """(the context with the question taken out, the question), or ``None`` when the last
    message is not a user's text (images, tool results: matched exactly only)."""
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        question = content
    elif (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    ):
        question = "\n".join(p["text"] for p in content)
    else:
        return None
    if not question.strip():
        return None
    context = [dict(m) for m in messages[:-1]]
    context.append({**last, "content": None})
    return context, question


@dataclass(frozen=True)
class Match:
    """A kept question close enough to the one asked."""

    key: str
    question: str
    score: float


@dataclass
class _Kept:
    bucket: str
    question: str
    normal: str
    numbers: tuple[str, ...]
    vector: Vector | None


@dataclass
class SemanticIndex:
    """Kept questions by bucket, at most ``max_entries`` (the oldest dropped first)."""

    max_entries: int
    _kept: OrderedDict[str, _Kept] = field(default_factory=OrderedDict)
    _buckets: dict[str, dict[str, None]] = field(default_factory=dict)

    def add(
        self, bucket: str, key: str, question: str, vector: Sequence[float] | Vector | None
    ) -> None:
        """Keep ``question`` (asked in ``bucket``, its answer kept under ``key``)."""
        self.discard(key)
        normal = normalise(question)
        self._kept[key] = _Kept(bucket, question, normal, numbers(normal), _unit(vector))
        self._buckets.setdefault(bucket, {})[key] = None
        while len(self._kept) > self.max_entries:
            self.discard(next(iter(self._kept)))

    def discard(self, key: str) -> None:
        kept = self._kept.pop(key, None)
        if kept is None:
            return
        keys = self._buckets[kept.bucket]
        del keys[key]
        if not keys:
            del self._buckets[kept.bucket]

    def same(self, bucket: str, question: str, alive: Callable[[str], bool]) -> Match | None:
        """A kept question equal to this one once normalised (no model needed), whose answer
        is ``alive``."""
        normal = normalise(question)
        for key in reversed(self._buckets.get(bucket, {})):
            kept = self._kept[key]
            if kept.normal == normal and alive(key):
                return Match(key, kept.question, 1.0)
        return None

    def closest(
        self,
        bucket: str,
        question: str,
        vector: Sequence[float] | Vector,
        semantic: Semantic,
        alive: Callable[[str], bool],
    ) -> Match | None:
        """The kept question most like this one whose answer is ``alive``, if it reaches its
        threshold, holds the same numbers and does not differ in meaning (:func:`differs`)."""
        normal = normalise(question)
        wanted = numbers(normal)
        unit = _unit(vector)
        assert unit is not None
        best: Match | None = None
        for key in self._buckets.get(bucket, {}):
            kept = self._kept[key]
            if (
                kept.vector is None
                or kept.vector.shape != unit.shape  # another model's vector
                or kept.numbers != wanted
            ):
                continue
            score = float(kept.vector @ unit)
            if (
                score >= semantic.threshold_for(kept.normal, normal)
                and (best is None or score > best.score)
                and not differs(kept.normal, normal)  # read only for a candidate match
                and alive(key)
            ):
                best = Match(key, kept.question, score)
        return best

    def __len__(self) -> int:
        return len(self._kept)


def _unit(vector: Vector | Sequence[float] | None) -> Vector | None:
    if vector is None:
        return None
    import numpy as np

    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
