"""The pure pieces behind hostile-upstream safety: bounded SSE, bounded inflate, redaction,
Retry-After parsing, the deadline in the policy, and quota cool-downs in the breaker."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamres import Backoff, ReadLimits, Route
from streamres._core.classify import Failure, classify_not_a_stream, parse_retry_after
from streamres._core.inflate import InflateError, Inflater
from streamres._core.policy import decide
from streamres._core.redact import Redactor, redact_url, url_secrets
from streamres._core.sse import SSEDecoder
from streamres._fleet.fleet import MAX_COOLDOWN, Fleet


def test_a_long_line_is_kept_as_pieces_and_joined_once() -> None:
    """A line arriving in many reads is not re-copied per read: the pieces wait, then one join."""
    d = SSEDecoder()
    for _ in range(1000):
        assert d.feed(b"x" * 100) == []
    assert len(d._pending) == 1000  # kept as pieces, never joined so far
    assert d.feed(b"\n\n") == []  # a line that is not a field: ignored, whole
    assert d._pending == [] and d.overflow is None


@given(st.lists(st.integers(1, 50), min_size=1, max_size=30))
def test_pieces_split_anywhere_give_the_same_events(cuts: list[int]) -> None:
    """However a long data line is split across reads, the same event comes out."""
    body = b"data: " + b"abc" * 200 + b"\n\ndata: [DONE]\n\n"
    d, out, i = SSEDecoder(), [], 0
    for c in cuts:
        out += d.feed(body[i : i + c])
        i += c
    out += d.feed(body[i:])
    assert out == [("", b"abc" * 200), ("", b"[DONE]")]


def test_a_line_past_the_bound_stops_the_decoder() -> None:
    """One line longer than max_line: overflow says so, and nothing more is returned."""
    d = SSEDecoder(max_line=1000)
    d.feed(b"data: ")
    for _ in range(20):
        d.feed(b"y" * 100)
    assert d.overflow is not None and "line longer than 1000" in d.overflow
    assert d.feed(b"\n\ndata: x\n\n") == []


def test_an_event_past_the_bound_stops_the_decoder_and_keeps_earlier_events() -> None:
    """data: lines that never end their event stop at max_event; complete events survive."""
    d = SSEDecoder(max_event=1000)
    out = d.feed(b"data: ok\n\n" + b"data: " + b"z" * 300 + b"\n" * 1)
    out += d.feed((b"data: " + b"z" * 300 + b"\n") * 5)
    assert out == [("", b"ok")]
    assert d.overflow is not None and "event's data longer than 1000" in d.overflow


def test_a_carriage_return_at_a_read_boundary_still_ends_the_line() -> None:
    """A lone CR held at the end of one read, then a read without line ends: still a line end."""
    d = SSEDecoder()
    assert d.feed(b"data: a\r\r") == []  # the second CR might be half of a CRLF: held
    assert d.feed(b"data: b") == [("", b"a")]  # it was not: a blank line, the event ends


def test_inflate_reads_gzip_in_pieces() -> None:
    """A gzip body split anywhere inflates to the original."""
    body = b"data: hello\n\n" * 1000
    packed = gzip.compress(body)
    inf = Inflater("gzip")
    out = b"".join(inf.feed(packed[i : i + 7]) for i in range(0, len(packed), 7))
    inf.close()
    assert out == body


def test_inflate_stops_a_bomb_at_the_bound() -> None:
    """One read expanding past the limit raises, having produced at most the limit."""
    bomb = gzip.compress(b"\0" * (8 << 20))
    with pytest.raises(InflateError, match="expands past 65536"):
        Inflater("gzip", limit=65536).feed(bomb)


def test_inflate_refuses_unknown_encodings_and_cut_bodies() -> None:
    """br is refused up front; a gzip body that ends early is corrupt at close."""
    with pytest.raises(InflateError, match="unsupported"):
        Inflater("br")
    inf = Inflater("gzip")
    inf.feed(gzip.compress(b"x" * 1000)[:20])
    with pytest.raises(InflateError, match="ended before"):
        inf.close()


def test_inflate_takes_raw_deflate_too() -> None:
    """ "deflate" sent as raw deflate (no zlib header), as some servers do, still reads."""
    z = zlib.compressobj(wbits=-15)
    assert Inflater("deflate").feed(z.compress(b"abc") + z.flush()) == b"abc"


def test_read_limits_refuse_tiny_or_odd_values() -> None:
    """Bounds below 1 KiB, or not integers, are a mistake."""
    with pytest.raises(ValueError, match=r"ReadLimits\.line"):
        ReadLimits(line=10)
    with pytest.raises(ValueError, match=r"ReadLimits\.event"):
        ReadLimits(event=True)  # type: ignore[arg-type]


def test_redactor_masks_keys_wherever_they_appear() -> None:
    """A key, whole or by its last 8 characters, and URL credentials are masked."""
    key = "sk-proj-0123456789abcdefghij"
    r = Redactor([key, None, "abc"])  # short values are not searched for
    out = r.redact(f"bad key {key}; shown as ...{key[-8:]}; see https://u:pw12345@h/v1?key=s3cret")
    assert key not in out and key[-8:] not in out
    assert "pw12345" not in out and "s3cret" not in out and "abc" in "abc"


@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=20, max_size=60),
    st.text(max_size=12),
)
def test_a_key_echoed_in_upper_case_or_base64_is_masked(key: str, before: str) -> None:
    """An echo of the key in upper case, or base64-encoded after any prefix (a rebuilt
    ``Authorization: Basic user:key``), never shows the key: what is left of the encoded text
    decodes to at most a couple of its characters."""
    import base64

    r = Redactor([key])
    assert key.upper() not in r.redact(f"Incorrect API key: {key.upper()}")
    encoded = base64.b64encode(f"{before}{key}".encode()).decode()
    masked = r.redact(f"Basic {encoded}")
    assert "[redacted]" in masked
    left = max(masked.removeprefix("Basic ").split("[redacted]"), key=len)
    assert len(left) <= len(base64.b64encode(before.encode())) + 4


def test_redact_url_and_its_secrets() -> None:
    """user:password@ and secret query parameters are found and masked; the rest stays."""
    url = "https://user:PW@host:8443/v1?api-version=2024&api-key=K123"
    assert redact_url(url) == "https://[redacted]@host:8443/v1?api-version=2024&api-key=[redacted]"
    assert set(url_secrets(url)) == {"user", "PW", "K123"}


@pytest.mark.parametrize(
    "value",
    [
        "Mon, 01 Jan 2024 00:00:00 +99999999999999",
        "Fri, 31 Dec 99999 23:59:59 GMT",
        "1e309",
        "nan",
        "-1",
        "soon",
    ],
)
def test_absurd_retry_after_values_are_no_hint(value: str) -> None:
    """Dates with absurd zones or years, infinities, NaN, negatives: ignored, never raised."""
    assert parse_retry_after({"retry-after": value}, now=1.7e9) is None


def test_a_redirect_names_its_target() -> None:
    """A 3xx is permanent and says where it pointed, and why it was not followed."""
    f = classify_not_a_stream(
        302, {"location": "https://evil.example/v1"}, "", url="http://h/v1", now=0
    )
    assert f.kind == "permanent" and "https://evil.example/v1" in f.message


def test_a_deadline_failure_is_a_deadline_even_at_the_attempt_cap() -> None:
    """With max_attempts reached, time running out is still reported as the deadline."""
    d = decide(
        Failure("deadline", "the deadline passed mid-stream"),
        attempt=1,
        max_attempts=1,
        model_index=0,
        failures=[1],
        time_left=0.0,
        backoff=Backoff(),
        rand=0.5,
        fallback_after=2,
    )
    assert (d.action, d.error) == ("give_up", "deadline")


def test_a_quota_429_with_a_hint_does_not_move_the_breaker() -> None:
    """429 + Retry-After: a cool-down (capped), the breaker untouched; without a hint it counts."""
    fleet = Fleet([Route("m", base_url="http://h/v1")], breaker_threshold=1)
    fleet.started(0, 10.0, resume=False)
    assert fleet.failed(0, 10.0, "rate_limit", ttft=None, retry_after=86_400) is None
    assert fleet.states[0].breaker.state == "closed"
    assert fleet.cooldown_left(0, 10.0) == MAX_COOLDOWN
    fleet.started(0, 11.0, resume=False)
    assert fleet.failed(0, 11.0, "rate_limit", ttft=None, retry_after=None) == "open"
