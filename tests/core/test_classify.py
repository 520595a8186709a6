"""Error classification, case by case, and Retry-After parsing."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from streamres._core.classify import classify_error_object, classify_response, parse_retry_after

NOW = 1_750_000_000.0


def _headers(**kw: str) -> httpx.Headers:
    return httpx.Headers({k.replace("_", "-"): v for k, v in kw.items()})


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (429, '{"error":{"message":"Rate limit reached","type":"requests"}}', "rate_limit"),
        (429, '{"error":{"message":"quota","type":"insufficient_quota"}}', "quota"),
        (503, "Service Unavailable", "capacity"),
        (
            529,
            '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            "capacity",
        ),
        (500, '{"type":"error","error":{"type":"api_error","message":"Overloaded"}}', "capacity"),
        (500, '{"error":{"message":"boom","type":"server_error"}}', "transient"),
        (502, "<html>bad gateway</html>", "transient"),
        (504, "", "transient"),
        (408, "", "transient"),
        (400, '{"error":{"message":"Our servers are currently overloaded"}}', "capacity"),
        (400, '{"error":{"message":"bad field","type":"invalid_request_error"}}', "permanent"),
        (
            401,
            '{"error":{"message":"Incorrect API key","type":"invalid_request_error"}}',
            "permanent",
        ),
        (403, "", "permanent"),
        (404, '{"type":"error","error":{"type":"not_found_error","message":"model"}}', "permanent"),
        (422, "", "permanent"),
        (
            400,
            '{"type":"error","error":{"type":"invalid_request_error","message":'
            '"This model does not support assistant message prefill."}}',
            "prefill_rejected",
        ),
        (
            400,
            '{"type":"error","error":{"type":"invalid_request_error","message":'
            '"messages: final assistant content cannot end with trailing whitespace"}}',
            "prefill_rejected",
        ),
        (
            503,
            '{"error":{"message":"Selected model is at capacity. Please try a different model."}}',
            "capacity",
        ),
    ],
)
def test_response_kinds(status: int, body: str, kind: str) -> None:
    """Each status/body pair gets the kind the retry loop needs."""
    assert classify_response(status, _headers(), body, now=NOW).kind == kind


def test_a_real_llama_server_context_refusal_is_a_context_limit() -> None:
    """Recorded from llama.cpp's ``llama-server`` (the source llama-cpp-python 0.3.36 vendors,
    as ``.ci/run`` builds it; SmolLM2-135M-Instruct with ``-c 128``) asked with a 431-token
    prompt: the refusal is a context limit, for the next model, not a permanent error."""
    body = (
        '{"error":{"code":400,"message":"request (431 tokens) exceeds the available context '
        'size (256 tokens), try increasing it","type":"exceed_context_size_error",'
        '"n_prompt_tokens":431,"n_ctx":256}}'
    )
    got = classify_response(400, httpx.Headers({"content-type": "application/json"}), body, now=0)
    assert got.kind == "context_length" and "context size" in got.message


def test_at_capacity_asks_to_switch_model() -> None:
    """'Selected model is at capacity' says: try another model now."""
    got = classify_response(
        429, _headers(), '{"error":{"message":"Selected model is at capacity."}}', now=NOW
    )
    assert got.kind == "capacity"
    assert got.switch_model


def test_x_should_retry_overrides() -> None:
    """x-should-retry, as the official SDKs honour it, overrides the status."""
    assert classify_response(500, _headers(x_should_retry="false"), "", now=NOW).kind == "permanent"
    assert classify_response(400, _headers(x_should_retry="true"), "", now=NOW).kind == "transient"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, "capacity"),
        ({"type": "api_error", "message": "Internal server error"}, "transient"),
        ({"type": "rate_limit_error", "message": "slow down"}, "rate_limit"),
        ({"message": "The server had an error", "type": "server_error"}, "transient"),
        ({"code": "server_error", "message": "Provider disconnected unexpectedly"}, "transient"),
        ({"code": "server_is_overloaded", "message": "busy"}, "capacity"),
        ({"message": "Selected model is at capacity. Please try a different model."}, "capacity"),
        ({"type": "invalid_request_error", "message": "bad"}, "permanent"),
        ("something odd", "transient"),
        (None, "transient"),
    ],
)
def test_in_band_errors(error: object, kind: str) -> None:
    """Errors inside a 200 stream are classified by type, code and message."""
    assert classify_error_object(error).kind == kind


def test_retry_after_forms() -> None:
    """retry-after-ms wins; Retry-After in seconds or as an HTTP date; junk is ignored."""
    assert parse_retry_after(_headers(retry_after_ms="1500", retry_after="9"), now=NOW) == 1.5
    assert parse_retry_after(_headers(retry_after="2"), now=NOW) == 2.0
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert parse_retry_after(_headers(retry_after=date), now=NOW) == pytest.approx(30, abs=1)
    past = email.utils.formatdate(NOW - 30, usegmt=True)
    assert parse_retry_after(_headers(retry_after=past), now=NOW) == 0.0
    for junk in ("soon", "-5", "nan", "99999999"):
        assert parse_retry_after(_headers(retry_after=junk), now=NOW) is None
    assert parse_retry_after(_headers(), now=NOW) is None


def test_retry_after_reaches_the_failure() -> None:
    """A classified response carries the server's hint."""
    got = classify_response(529, _headers(retry_after="3"), "", now=NOW)
    assert got.retry_after == 3.0
    assert got.retryable
