"""Overlap de-duplication: joining a resumed stream onto the text already delivered.

Theory of operation. ``D`` is the text the caller already has. A resumed stream's head ``h``
can be, depending on the server and the continuation strategy:

* an exact continuation (prefill honoured): ``D + h`` is the answer;
* a repeat of ``D``'s tail, then new text (instruct: "…the quick brown" → "quick brown fox");
* a restart from the beginning (a server that ignored the partial answer);
* any of those behind a preamble ("Sure, continuing: …").

The de-duplicator holds the head back only while it is still *consistent with a repeat*: while
``h`` occurs inside ``D`` with room to grow, it may be the model re-reading ``D``. As soon as no
such position is left, it decides, once:

1. ``h`` begins with a suffix of ``D`` that is long enough (``min_overlap`` characters, or a
   whole-word suffix, or the whitespace a prefill had to strip): drop that suffix, emit the rest;
2. ``h`` repeated at least ``commit_chars`` of ``D`` and then drifted (a restart that diverged):
   drop the repeated part, emit from the divergence;
3. otherwise emit all of ``h``. Dropping real text is worse than showing a duplicate, so short
   or coincidental matches never cause a drop.

After the decision every chunk passes straight through. The hold is bounded: new text is only
held while it keeps matching ``D``; past ``max_hold_seconds`` a short ambiguous head is released.
A long exact repeat (``commit_chars`` or more) is held without a time bound: it is text the user
already has, so holding it delays nothing new. In *prefill* mode only two alignments are
possible (exact continuation after the stripped whitespace, or a full restart), so an exact
continuation is released at its first character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DedupStats", "Deduplicator"]

_PREAMBLE = re.compile(
    r"\s*(?:(?:sure|okay|ok|certainly|of course|alright|absolutely|no problem)[,.!]?\s+)?"
    r"(?:(?:here(?:'s| is) the (?:rest|continuation)(?: of (?:the|my) (?:answer|response))?)"
    r"|(?:(?:i'll|i will|let me) )?continu(?:e|ing)"
    r"(?: (?:from )?(?:where|right where) (?:i|we) left off)?(?: exactly)?"
    r"(?: (?:from|with) there)?)"
    r"\s*(?::|\.\.\.|…|—|-|\.)+[ \t]*"
    r"|\s*(?:\.\.\.|…)",
    re.IGNORECASE,
)
_OPENERS = (
    "sure",
    "okay",
    "ok",
    "certainly",
    "of course",
    "alright",
    "absolutely",
    "no problem",
    "here",
    "continu",
    "i'll",
    "i will",
    "let me",
    "...",
    "…",
)
_PREAMBLE_WINDOW = 48


@dataclass(slots=True)
class DedupStats:
    """What the de-duplicator did, for metrics and the done event."""

    #: Text generated again and removed (the tokens a resume wasted).
    dropped: str = ""
    held_chars: int = 0
    hold_seconds: float = 0.0
    preamble: str = ""
    diverged: bool = False


def _word_start(d: str, k: int) -> bool:
    """Does position ``k`` of ``d`` start a word (after whitespace: "🚀", "¿", "(a" count)?"""
    return k == 0 or (d[k - 1].isspace() and not d[k].isspace())


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
    ) -> None:
        """``stripped``: how many trailing characters of ``delivered`` the prefill left out
        (Anthropic rejects a prefill ending in whitespace)."""
        self._d = delivered
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
        if self.resolved or self._since is None or len(self._held) >= self._commit:
            return None
        return self._since + self._max_hold

    def feed(self, text: str, *, now: float) -> str:
        """Next piece of the resumed stream -> text to pass on (possibly empty)."""
        if self.resolved:
            return text
        if self._since is None:
            self._since = now
        if not self._preamble_done:
            self._raw += text
            text = self._strip_preamble()
            if not self._preamble_done:
                self.stats.held_chars = max(self.stats.held_chars, len(self._raw))
                return ""
        self._held += text
        if self._open() and (now - self._since < self._max_hold or len(self._held) >= self._commit):
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
        if self.resolved:
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
        if self._open() and len(self._held) >= self._commit:
            # A long exact repeat of delivered text, then the end: nothing new in it.
            self.stats.dropped += self._held
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
        ended = any(c in raw.rstrip() for c in ":.…—-\n") and not match
        plausible = (
            len(raw) < _PREAMBLE_WINDOW
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
            if h.startswith(d[k:]):
                m = len(d) - k
                if m >= self._min_overlap or _word_start(d, k) or d[k:].strip(" \t") == "":
                    return m
            k += 1

    def _decide(self, now: float) -> str:
        h = self._held
        m = self._overlap() if h else 0
        if m:
            out = h[m:]
            self.stats.dropped += h[:m]
        else:
            j = self._repeated_prefix()
            if j >= self._commit:
                self.stats.diverged = True
                self.stats.dropped += h[:j]
                out = h[j:]
            else:
                out = h
        self._held = ""
        self._done(now)
        return out

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
