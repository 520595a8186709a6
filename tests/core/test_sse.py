"""The SSE decoder: bytes in any chunking -> the same events."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from streamres._core.sse import SSEDecoder

SAMPLE = (
    b"\xef\xbb\xbf: OPENROUTER PROCESSING\n\n"
    b'data: {"a": "h\xc3\xa9llo"}\n\n'
    b'event: message_start\r\ndata: {"type":"message_start"}\r\n\r\n'
    b"event: ping\rdata: {}\r\r"
    b"data: line1\ndata: line2\n\n"
    b"data:nospace\n\n"
    b"id: 7\nretry: 100\ndata: [DONE]\n\n"
)
EXPECTED = [
    ("", b'{"a": "h\xc3\xa9llo"}'),
    ("message_start", b'{"type":"message_start"}'),
    ("ping", b"{}"),
    ("", b"line1\nline2"),
    ("", b"nospace"),
    ("", b"[DONE]"),
]


def feed_all(chunks: list[bytes]) -> tuple[list[tuple[str, bytes]], int]:
    dec = SSEDecoder()
    out = []
    for c in chunks:
        out += dec.feed(c)
    out += dec.close()
    return out, dec.comments


def test_whole_body() -> None:
    """A body fed at once gives every event, with BOM, CR, CRLF and comments handled."""
    events, comments = feed_all([SAMPLE])
    assert events == EXPECTED
    assert comments == 1


def test_one_byte_at_a_time() -> None:
    """Feeding one byte at a time (every boundary, CRLF split included) changes nothing."""
    events, _ = feed_all([SAMPLE[i : i + 1] for i in range(len(SAMPLE))])
    assert events == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=20))
def test_any_chunking(cuts: list[int]) -> None:
    """Any split of the bytes into chunks yields the same events."""
    bounds = sorted({0, len(SAMPLE), *cuts})
    chunks = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(chunks)[0] == EXPECTED


def test_unterminated_event_is_dropped() -> None:
    """An event cut before its blank line was not delivered (the spec's rule)."""
    assert feed_all([b'data: {"x": 1}\n\ndata: {"cut'])[0] == [("", b'{"x": 1}')]


def test_lone_cr_at_end_still_ends_the_line() -> None:
    """A final CR is a line end once the body closes."""
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\r") == []  # might still be the CR of a CRLF
    assert dec.close() == [("", b"a")]
