"""Overlap de-duplication: joining a resumed stream onto the text already delivered.

Theory of operation. ``D`` is the text the caller already has. A resumed stream's head ``h``
can be, depending on the server and the continuation strategy:

* an exact continuation (prefill honoured): ``D + h`` is the answer;
* a repeat of ``D``'s tail, then new text (instruct: "…the quick brown" → "quick brown fox";
  "…沿着一条直线摆动" → "条直线摆动，…");
* a restart from the beginning (a server that ignored the partial answer);
* any of those behind a preamble ("Sure, continuing: …", "好的，我继续：", "続けます：").

The de-duplicator holds the head back only while it is still *consistent with a repeat*: while
``h`` occurs inside ``D`` with room to grow, it may be the model re-reading ``D``. As soon as no
such position is left, it decides, once:

1. ``h`` begins with a suffix ``D[k:]`` that models really restart at: drop it, emit the rest.
   Models restart where text has seams, so the evidence is the *seam at k*, in every script,
   not a count of Latin characters:

   ======================  ==============================================  ==================
   seam at k               examples                                        suffix accepted
   ======================  ==============================================  ==================
   sentence or line start  after 。！？.!?… (and closing quotes), a          any length
                           newline, a list marker, or k = 0
   clause start            after ，、；：,;: (full-width or Latin)          any length
   word start              after whitespace (spaced scripts)               any length
   token start             a token boundary of ``D`` (the ledger's          2 tokens or more
                           encoding: CJK, Thai, mid-word cuts)
   anywhere                —                                               ``min_overlap`` (12)
   ======================  ==============================================  ==================

   Whitespace alone is never a repeat in instruct mode (a cut inside an indentation continues
   with the rest of it); in prefill mode the whitespace the request had to strip is.

2. ``h`` repeated at least ``commit_chars`` of ``D`` and then drifted (a restart that diverged):
   drop the repeated part, emit from the start of the word where it drifted (never from
   inside a word), and say so (``stats.diverged``);
3. otherwise emit all of ``h``. Dropping real text is worse than showing a duplicate, so short
   or coincidental matches at no seam never cause a drop. A new turn drops the space the next
   token would have carried ("…known as" + "Ray"): in a spaced script, outside a code block,
   a space goes back before a head that begins a capitalised word after a lower-case letter
   (not "HT" + "TP"), or any word after a stop or a comma (decided on the head's first
   character and the delivered text's last, so chunking cannot change it).

When the stream ends while ``h`` is still a possible repeat, it is dropped whole if it is long
(``commit_chars``), if it is ``D``'s own beginning (``min_overlap`` or more): the answer begun
again and stopped short of the cut, which small instruct models do (``stats.restarted``), or if
it is the start of a repeat of ``D``'s last stretch from a seam. The continuation then added
nothing; the machine does not take that for a finished answer.

A preamble is removed only when it says it is one: a continuation phrase ("continuing", "here
is the rest", "我继续", "接着上文", "続けます", "계속하겠습니다", "je continue", "ich fahre fort",
"continúo"…), optionally behind an opener ("Sure,", "好的，", "はい、"), ended by a colon, a
stop or a dash. An opener alone ("Okay, so…", "好的问题") is the answer's own text.

After the decision every chunk passes straight through. The hold is bounded: new text is only
held while it keeps matching ``D``; past ``max_hold_seconds`` a short ambiguous head is released.
A long exact repeat (``commit_chars`` or more) is held without a time bound: it is text the user
already has, so holding it delays nothing new. So is a possible preamble (48 characters at
most), and the start of a repeat of ``D``'s last stretch (a sentence or so) from a point a
model restarts at: a model streaming its overlap slowly (a busy machine, a storm) would
otherwise have it released half-way, and the rest of the repeat — the answer's own end, after
a cut at the very end — shown twice; such a head waits only for the model's next words. In
*prefill* mode only two alignments are
possible (exact continuation after the stripped whitespace, or a full restart), so an exact
continuation is released at its first character.

**Held back, so a repeat is proven.** In a script written without spaces (Chinese, Japanese,
Thai…), a model that repeats only the last token of ``D`` ("…一条直线摆动" → "动，角度…") writes the
same bytes as a real doubled character at the cut (谢谢, 看看, 慢慢), so rule 1 cannot drop it.
There the instruct request leaves ``D``'s last token out (:func:`hold_back`: a few characters,
not a seam): the model never saw them, so its continuation must write them again, and a head
that begins with ``D[k:]`` for any ``k`` at or before the held-back characters is a repeat by
construction (``withheld``). A head that writes none of them — the model went another way
after the shorter text — is not joined at all: ``missed`` is set and nothing is emitted, and
the machine asks again with the whole of ``D`` (today's request), so the worst case costs one
round trip and shows nothing wrong.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["DedupStats", "Deduplicator", "ends_a_sentence", "hold_back"]

# Openers that may stand before a continuation phrase ("Sure, continuing: …").
_OPENER = (
    r"(?:sure|okay|ok|certainly|of course|alright|absolutely|no problem|"
    r"好的|好|当然|没问题|嗯|はい|承知しました|わかりました|네|물론이죠|알겠습니다|"
    r"bien sûr|d'accord|claro|por supuesto|certo|certamente|gerne|natürlich|klar|конечно|хорошо)"
)
# Phrases that say "I am continuing the previous answer", in the languages users write in.
_CONTINUE = (
    r"(?:here(?:'s| is) the (?:rest|continuation)(?: of (?:the|my) (?:answer|response))?"
    r"|(?:(?:i'll|i will|let me) )?continu(?:e|ing)"
    r"(?: (?:from )?(?:where|right where) (?:i|we) left off)?(?: exactly)?"
    r"(?: (?:from|with) there)?"
    r"|(?:我|下面|接下来)?(?:继续|接着)(?:上文|写|说|回答|往下写)?(?:如下)?"
    r"|以下是(?:续写|后续内容|剩余部分)"
    r"|続けます|続きです|続きを(?:書きます|お書きします)|以下、続きです"
    r"|계속(?:하겠습니다|합니다|해서 작성하겠습니다)|이어서 (?:작성하겠습니다|계속합니다)"
    r"|je (?:continue|poursuis)|voici la suite|ich (?:fahre fort|mache weiter)"
    r"|hier ist die fortsetzung|contin[uú]o|continuando|aquí está la continuación"
    r"|продолжаю|продолжим)"
)
_PREAMBLE = re.compile(
    rf"\s*(?:{_OPENER}\s*[,.!，。！、]?\s*)?{_CONTINUE}"
    r"\s*(?::|：|\.\.\.|…|—|-|\.|。|，|,)+[ \t]*"
    r"|\s*(?:\.\.\.|…)",
    re.IGNORECASE,
)
_OPENERS = (
    "sure", "okay", "ok", "certainly", "of course", "alright", "absolutely", "no problem",
    "here", "continu", "i'll", "i will", "let me", "...", "…",
    "好", "当然", "没问题", "嗯", "我继续", "继续", "接着", "下面", "接下来", "以下",
    "はい", "承知", "わかり", "続", "以下、",
    "네", "물론", "알겠", "계속", "이어서",
    "bien", "d'accord", "je ", "voici", "claro", "por supuesto", "aquí", "contin",
    "certo", "gerne", "natürlich", "klar", "ich ", "hier ist", "конечно", "хорошо", "продолж",
)  # fmt: skip
_PREAMBLE_WINDOW = 48
#: How far back from the end of the delivered text (in ``commit_chars``) a repeat of its last
#: stretch may begin and still be held past the time bound.
_END_STRETCH = 4

#: Characters that end a sentence, in any script; what may follow them before the next one.
_SENTENCE_END = frozenset("。！？!?.…｡؟।")
_CLOSERS = frozenset("\"'”’」』）)]】》 \t\u3000")
#: Characters that end a clause.
_CLAUSE_END = frozenset("，、；：,;:﹐﹑﹔﹕")
_LIST_MARKER = re.compile(r"[ \t]*(?:[-*•·]|\d{1,3}[.)、]|[（(]?\d{1,3}[）)])[ \t\u3000]+")


@dataclass(slots=True)
class DedupStats:
    """What the de-duplicator did, for metrics and the done event."""

    #: Text generated again and removed (the tokens a resume wasted).
    dropped: str = ""
    held_chars: int = 0
    hold_seconds: float = 0.0
    preamble: str = ""
    #: Rule 2: a restart that repeated delivered text and then drifted from it.
    diverged: bool = False
    #: The head began again from the very start of the delivered text (a restart, removed).
    restarted: bool = False
    #: A space was put between the delivered text and a head that began a new word without one.
    spaced: bool = False


def _width(text: str) -> int:
    """Length with CJK, kana, Hangul and Thai counted 3 each: a preamble is a few words, which
    takes about three times fewer of those characters than of Latin ones."""
    return sum(3 if ord(c) >= 0x0E00 and not 0x2000 <= ord(c) < 0x3000 else 1 for c in text)


def _word_start(d: str, k: int) -> bool:
    """Does position ``k`` of ``d`` start a word (after whitespace: "🚀", "¿", "(a" count)?"""
    return k == 0 or (d[k - 1].isspace() and not d[k].isspace())


def seam(d: str, k: int) -> str:
    """What kind of seam position ``k`` of ``d`` is: ``sentence``, ``clause``, ``word`` or ``""``.

    >>> seam("蜜蜂跳舞。🐝 采蜜", 5), seam("一，二", 2), seam("a b", 2), seam("数据", 1)
    ('sentence', 'clause', 'word', '')
    """
    if k <= 0:
        return "sentence"
    j = k - 1
    while j >= 0 and d[j] in _CLOSERS:
        if d[j] == "\n":
            return "sentence"
        j -= 1
    if j < 0 or d[j] == "\n":
        return "sentence"
    line_start = d.rfind("\n", 0, k) + 1
    if _LIST_MARKER.fullmatch(d, line_start, k):
        return "sentence"  # just after "- ", "1. ", "（2） " at the start of a line
    c = d[j]
    if c in _SENTENCE_END:
        # "3.14" or "e.g.x" is not a sentence end: a Latin stop needs a space after it.
        if c in ".!?" and j == k - 1:
            return ""
        return "sentence"
    if c in _CLAUSE_END:
        return "clause"
    if _word_start(d, k):
        return "word"
    return ""


#: The longest last token an instruct request leaves out (characters).
HOLD_BACK_MAX = 4


def _unspaced(c: str) -> bool:
    """Is ``c`` a letter of a script written without spaces between words (Han, kana, Thai,
    Lao, Myanmar, Khmer)? Hangul is written with spaces."""
    o = ord(c)
    return (
        0x3040 <= o <= 0x30FF  # hiragana, katakana
        or 0x3400 <= o <= 0x4DBF  # CJK extension A
        or 0x4E00 <= o <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= o <= 0xFAFF  # CJK compatibility ideographs
        or 0x0E00 <= o <= 0x0EFF  # Thai, Lao
        or 0x1000 <= o <= 0x109F  # Myanmar
        or 0x1780 <= o <= 0x17FF  # Khmer
    ) and not unicodedata.category(c).startswith(("P", "S", "Z", "N"))


def hold_back(delivered: str, token_starts: Iterable[int]) -> int:
    """How many trailing characters of ``delivered`` an instruct continuation leaves out of its
    request, so that the model's repeat of them is proven (the module docstring): its last
    token, when that is a few letters of a script without spaces and not at a seam (a repeat
    from a seam is accepted without it). 0 otherwise — spaced scripts are left as they are.

    >>> hold_back("沿着一条直线摆动", [0, 2, 4, 6, 7]), hold_back("the quick brown", [0, 3, 9])
    (1, 0)
    """
    # A token that begins with a combining mark (a Thai vowel or tone mark) is held with the
    # letter it sits on: a model is never shown a letter without its marks.
    starts = [
        k
        for k in token_starts
        if 0 < k < len(delivered) and not unicodedata.category(delivered[k]).startswith("M")
    ]
    if not starts:
        return 0
    k = max(starts)
    tail = delivered[k:]
    if len(tail) > HOLD_BACK_MAX or not all(map(_unspaced, tail)) or seam(delivered, k):
        return 0
    return len(tail)


def _seam_before(h: str, j: int) -> int:
    """The last word start at or before ``j`` in ``h`` (its whitespace kept with what
    follows), so that a cut at ``j`` never splits a word."""
    while 0 < j < len(h) and not h[j - 1].isspace() and not h[j].isspace():
        j -= 1
    while j > 0 and h[j - 1].isspace():
        j -= 1
    return j


def ends_a_sentence(text: str) -> bool:
    """Does ``text`` end where an answer may end: after a sentence end (any script), a
    closing code fence, or a line break? "…known as Ray" does not.

    >>> ends_a_sentence("It halves.  "), ends_a_sentence("蜜蜂跳舞。"), ends_a_sentence("known as")
    (True, True, False)
    """
    t = text.rstrip(" \t\u3000")
    if not t or t.endswith(("\n", "```")):
        return True
    t = t.rstrip("".join(_CLOSERS))
    return bool(t) and t[-1] in _SENTENCE_END


class Deduplicator:
    """Feed the resumed stream's text; get back only what is new.

    >>> dd = Deduplicator("The quick brown", mode="instruct")
    >>> dd.feed("quick brown", now=0.0) + dd.feed(" fox", now=0.1)
    ' fox'
    """

    def __init__(
        self,
        delivered: str,
        *,
        mode: Literal["instruct", "prefill"],
        stripped: int = 0,
        min_overlap: int = 12,
        commit_chars: int = 64,
        max_hold_seconds: float = 2.0,
        token_starts: Iterable[int] = (),
        withheld: int = 0,
    ) -> None:
        """``stripped``: how many trailing characters of ``delivered`` the prefill left out
        (Anthropic rejects a prefill ending in whitespace). ``token_starts``: offsets in
        ``delivered`` where its tokens begin (the ledger's encoding; the tail is enough).
        ``withheld``: how many trailing characters of ``delivered`` the instruct request left
        out (:func:`hold_back`), which the model must write again."""
        self._d = delivered
        self._withheld = withheld if mode == "instruct" else 0
        #: The head wrote none of the withheld characters: nothing was joined (ask again).
        self.missed = False
        self._tokens = sorted(set(token_starts))
        self.mode = mode
        self._stripped = stripped
        self._min_overlap = min_overlap
        self._commit = commit_chars
        self._max_hold = max_hold_seconds
        self._raw = ""  # text before the preamble check is done
        self._held = ""
        self._preamble_done = mode == "prefill"
        self._since: float | None = None
        self._last_k = -1
        self.resolved = not delivered
        self.stats = DedupStats()

    @property
    def release_at(self) -> float | None:
        """When a held ambiguous head will be released even without new text."""
        if self.resolved or self.missed or self._since is None or len(self._held) >= self._commit:
            return None
        if not self._preamble_done or self._repeating_the_end():
            return None  # a possible preamble (48 characters at most), or the end repeated
        return self._since + self._max_hold

    def feed(self, text: str, *, now: float) -> str:
        """Next piece of the resumed stream -> text to pass on (possibly empty)."""
        if self.resolved:
            return text
        if self.missed:
            return ""  # nothing of this stream is joined; the machine ends it
        if self._since is None:
            self._since = now
        if not self._preamble_done:
            self._raw += text
            text = self._strip_preamble()
            if not self._preamble_done:
                self.stats.held_chars = max(self.stats.held_chars, len(self._raw))
                return ""
        self._held += text
        if self._open() and (
            now - self._since < self._max_hold
            or len(self._held) >= self._commit
            or self._repeating_the_end()
        ):
            # Held back, not yet shown: this is the hold-back a user can notice.
            self.stats.held_chars = max(self.stats.held_chars, len(self._held))
            return ""
        return self._decide(now)

    def poll(self, *, now: float) -> str:
        """Release a held head whose hold time ran out (call when ``release_at`` passes)."""
        at = self.release_at
        if at is None or now < at:
            return ""
        return self._force(now)

    def finish(self, *, now: float) -> str:
        """The resumed stream ended normally: decide with what is held."""
        if self.resolved or self.missed:
            return ""
        return self._force(now)

    def abandon(self) -> str:
        """The resumed stream broke while text was held: return the held text, undelivered.

        Nothing is lost by discarding it: the next attempt continues from the delivered text.
        """
        held, self._held, self._raw = self._held + self._raw, "", ""
        self.resolved = True
        return held

    def _force(self, now: float) -> str:
        if not self._preamble_done:
            self._preamble_done = True
            self._held += self._raw
            self._raw = ""
        h = self._held
        restart = self.mode == "instruct" and len(h) >= self._min_overlap and self._d.startswith(h)
        end = self._repeating_the_end(seams_only=True)
        if self._open() and (len(h) >= self._commit or restart or end):
            # A long exact repeat of delivered text, the answer begun again from its first
            # word and stopped short of the cut, or a repeat of its last stretch stopped short
            # of its end, then the end: nothing new in it.
            self.stats.dropped += h
            self.stats.restarted = self.stats.restarted or restart
            self._held = ""
            self._done(now)
            return ""
        return self._decide(now)

    # -- internals ---------------------------------------------------------------------------

    def _strip_preamble(self) -> str:
        raw = self._raw
        match = _PREAMBLE.match(raw)
        if match and match.end() < len(raw) and match.group().strip():
            self._preamble_done = True
            self.stats.preamble = match.group()
            self._raw = ""
            return raw[match.end() :]
        head = raw.lstrip().lower()
        # Still possibly a preamble: short, opening like one, and not past a preamble's end
        # (a colon, stop or dash with text after it that the pattern did not take).
        ended = any(c in raw.rstrip() for c in ":.…—-\n：。！？!?") and not match
        plausible = (
            _width(raw) < _PREAMBLE_WINDOW
            and not ended
            and any(o.startswith(head) or head.startswith(o) for o in _OPENERS)
        )
        if plausible:
            return ""
        self._preamble_done = True
        self._raw = ""
        return raw

    def _starts(self) -> tuple[int, ...] | None:
        """Allowed alignments of the head in ``D`` (None: anywhere)."""
        if self.mode == "prefill":
            return (0, len(self._d) - self._stripped)
        return None

    def _open(self) -> bool:
        """Is the held head still a possible repeat of ``D`` with room to grow?"""
        d, h = self._d, self._held
        if not h:
            return True
        starts = self._starts()
        if starts is not None:
            return any(k + len(h) < len(d) and d.startswith(h, k) for k in starts)
        k = self._last_k
        if k >= 0 and k + len(h) < len(d) and d.startswith(h, k):
            return True
        k = d.find(h, 0, len(d) - 1)
        self._last_k = k
        return k >= 0

    def _repeating_the_end(self, *, seams_only: bool = False) -> bool:
        """Is the held head the start of a repeat of ``D``'s last stretch (``_END_STRETCH``
        times ``commit_chars``: a sentence or so), from a point a model restarts at ("…Résumé
        at whileño." + " Résumé", " at"…)? Then it is held past the time bound: released
        early, the rest of the repeat would follow it and show the end twice; held, it waits
        only for the model's next words, which either go on repeating or part from ``D``.
        From a sentence, clause or word start, or a token start two tokens or more from the
        end; ``seams_only``: not a token start — the evidence to drop a head the stream ended
        in (a token start alone may be a coincidence)."""
        if self.mode != "instruct" or not self._held:
            return False
        d, h = self._d, self._held
        k = d.find(h, max(0, len(d) - _END_STRETCH * self._commit))
        while k >= 0 and k + len(h) < len(d):
            at_seam = bool(seam(d, k) or (d[k].isspace() and seam(d, k + 1)))  # " word"
            if not seams_only and not at_seam:
                i = bisect.bisect_left(self._tokens, k)  # a token start, 2+ tokens to the end
                at_seam = i < len(self._tokens) and self._tokens[i] == k
                at_seam = at_seam and len(self._tokens) - i >= 2
            if at_seam and d[k:].strip():
                return True
            k = d.find(h, k + 1)
        return False

    def _overlap(self) -> int:
        """Length of the longest acceptable suffix of ``D`` that the head begins with."""
        d, h = self._d, self._held
        starts = self._starts()
        if starts is not None:
            # Prefill: the stripped whitespace, or a full restart.
            for k in sorted(starts):
                if h.startswith(d[k:]) and k < len(d):
                    return len(d) - k
            return 0
        k = max(0, len(d) - len(h))
        while True:
            k = d.find(h[0], k)
            if k < 0:
                return 0
            if h.startswith(d[k:]) and self._restart_point(k):
                return len(d) - k
            k += 1

    def _restart_point(self, k: int) -> bool:
        """Is ``D[k:]`` a repeat a model would make (rule 1's table)?"""
        d = self._d
        if not d[k:].strip():
            # Whitespace alone is no evidence of a repeat here (a cut inside an indentation
            # continues with the rest of it); prefill's stripped whitespace is handled apart.
            return False
        if self._withheld and k <= len(d) - self._withheld:
            return True  # it covers what the request left out: a repeat by construction
        if len(d) - k >= self._min_overlap or seam(d, k):
            return True
        i = bisect.bisect_left(self._tokens, k)
        # A token start, and at least two tokens from there to the end.
        return i < len(self._tokens) and self._tokens[i] == k and len(self._tokens) - i >= 2

    def _decide(self, now: float) -> str:
        h = self._held
        m = self._overlap() if h else 0
        if m:
            out = h[m:]
            self.stats.dropped += h[:m]
            self.stats.restarted = m == len(self._d)
        else:
            j = self._repeated_prefix()
            if j >= self._commit:
                # Cut where a word (or sentence) begins, never inside one: the drifted text
                # is emitted from the seam at or before the first differing character.
                j = _seam_before(h, j)
                self.stats.diverged = True
                self.stats.dropped += h[:j]
                out = h[j:]
            elif self._withheld:
                # The model never wrote what the request left out: it went on from the
                # shorter text another way, and joined to ``D`` that would read wrong.
                self.missed = True
                return ""
            else:
                out = self._spaced(h)
        self._held = ""
        self._done(now)
        return out

    def _spaced(self, h: str) -> str:
        """A new turn drops the space the next token would have carried: "…known as" +
        "Ray" must not read "asRay". Put one back where the seam is plain (rule 3 in the module
        docstring) — never inside a word cut mid-way ("compu" + "ter") nor in a code block."""
        d = self._d
        if self.mode != "instruct" or not d or not h or d[-1].isspace() or h[0].isspace():
            return h
        if d.count("```") % 2:
            return h  # inside a code block: "get" + "Value()" is one identifier
        latin = d[-1].isascii() and h[0].isascii()
        # Only the head's first character decides (the same however the stream is chunked).
        if (
            latin
            and h[0].isalnum()
            # "as" + "Ray": a new word; "HT" + "TP": an acronym cut mid-way, left whole.
            and (d[-1] in ".,;:!?)" or (d[-1].islower() and h[0].isupper()))
        ):
            self.stats.spaced = True
            return " " + h
        return h

    def _repeated_prefix(self) -> int:
        """Length of the longest prefix of the head that occurs in ``D`` (binary search)."""
        d, h = self._d, self._held
        lo, hi = 0, len(h)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if h[:mid] in d:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _done(self, now: float) -> None:
        self.resolved = True
        if self._since is not None:
            self.stats.hold_seconds = now - self._since
