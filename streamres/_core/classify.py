"""Error classification: what went wrong, and whether trying again can help.

Everything here is pure. The shell hands over what it saw (a status code, headers and body; an
in-band error object from inside a 200 stream; a broken connection) and gets a :class:`Failure`
back. The decision is made on the error's *type, code and message*, never on which exception
class carried it: a 200 response can carry an overload, and "Our servers are currently
overloaded" has arrived as HTTP 400.

Kinds, and what the retry loop does with them:

=================  ==========================================================  ===========
kind               seen as                                                     retried?
=================  ==========================================================  ===========
capacity           429/503/529, ``overloaded_error``, "at capacity", 500 +     yes
                   "overloaded", OpenRouter ``finish_reason: "error"``
rate_limit         429 without an overload message, ``rate_limit_error``       yes
transient          502/504/408/409, other 5xx, ``api_error``/``server_error``  yes
connection         connect refused/reset, body cut mid-transfer                yes
stall              no content for ``stall_timeout`` (keep-alives don't count)  yes
truncated          stream ended without its terminal event                     yes
malformed          a chunk that is not the JSON the protocol promises          yes
prefill_rejected   400 saying assistant prefill is unsupported                 yes, instruct
context_length     400 ``context_length_exceeded``, "maximum context length",  on the next
                   "prompt is too long", "exceeds the available context size"  model only
permanent          other 4xx: bad request, auth, not found                     no
quota              ``insufficient_quota``, ``billing_error``: the account is   on another
                   out of credit                                               account only
deadline           the overall deadline ran out (not the model's fault)        no time left
replay_unavailable a background response cannot be re-attached to             yes, continue
client_busy        a connect timed out while this process's event loop ran    yes, not the
                   late: the client was too busy to see the server answer     server's fault
slow               the stream kept producing below its pace floor (opt-in:    on the next
                   ``PaceFloor``)                                             model
=================  ==========================================================  ===========
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Failure",
    "FailureKind",
    "classify_error_object",
    "classify_not_a_stream",
    "classify_response",
    "failure",
    "is_event_stream",
    "parse_retry_after",
]

FailureKind = Literal[
    "capacity",
    "rate_limit",
    "transient",
    "connection",
    "stall",
    "truncated",
    "malformed",
    "prefill_rejected",
    "context_length",
    "permanent",
    "deadline",
    "replay_unavailable",
    "ended_at_seam",
    "client_busy",
    "quota",
    "slow",
]


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, classified."""

    kind: FailureKind
    message: str
    status_code: int | None = None
    error_type: str | None = None
    #: Seconds the server asked us to wait (``retry-after-ms`` / ``Retry-After``), if any.
    retry_after: float | None = None
    #: The server told us this model is full right now: try another model at once.
    switch_model: bool = False
    #: No connection was ever made for this attempt (refused, DNS, TLS, connect timeout).
    connect: bool = False

    @property
    def retryable(self) -> bool:
        return self.kind not in ("permanent", "quota")


def failure(kind: FailureKind, message: str) -> Failure:
    """A failure the shell observed itself (stall, truncation, dropped connection…)."""
    return Failure(kind=kind, message=message)


_AT_CAPACITY = re.compile(r"at capacity", re.IGNORECASE)
_OVERLOADED = re.compile(r"overload", re.IGNORECASE)
_PREFILL = re.compile(
    r"(?:does not support|doesn't support|not supported)[^.]*prefill"
    r"|prefill[^.]*(?:not supported|unsupported)"
    r"|final assistant content cannot end with trailing whitespace",
    re.IGNORECASE,
)

_CAPACITY_TYPES = frozenset(
    {"overloaded_error", "server_is_overloaded", "overloaded", "model_overloaded", "capacity"}
)
#: In-band errors about what the model generated, not the request (Groq's ``tool_use_failed``):
#: retried, even under an ``invalid_request_error`` type.
_MODEL_SLIPS = frozenset({"tool_use_failed", "output_parse_failed"})
#: A request longer than the model's context window, in the words of OpenAI, vLLM and SGLang
#: ("maximum context length"), Anthropic ("prompt is too long"), llama.cpp ("exceeds the
#: available context size") and Gemini ("input token count … exceeds the maximum"): another
#: model, with a larger window, may take it; this one never will.
_CONTEXT = re.compile(
    r"maximum context length|context[ _]length[ _]exceeded|prompt is too long|"
    r"exceeds? the (available )?context (size|window)|input token count .{0,40}exceeds",
    re.I,
)
_CONTEXT_TYPES = frozenset({"context_length_exceeded", "exceed_context_size_error"})


def _too_long(kind: FailureKind, message: str, names: set[str]) -> bool:
    """Is this refusal about the request's length, past the model's context window? (Never a
    capacity or rate limit: "request too large … tokens per min" is a quota.)"""
    if kind in ("capacity", "rate_limit"):
        return False
    return bool(names & _CONTEXT_TYPES) or bool(_CONTEXT.search(message))


#: The account is out of credit: no retry on it helps, another account's key may.
_QUOTA_TYPES = frozenset({"insufficient_quota", "billing_error"})
_RATE_TYPES = frozenset({"rate_limit_error", "rate_limit_exceeded", "rate_limited", "tokens"})
_PERMANENT_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "billing_error",
        "insufficient_quota",
        "invalid_api_key",
        "model_not_found",
        "context_length_exceeded",
        "request_too_large",
    }
)


def _by_message(message: str) -> FailureKind | None:
    if _AT_CAPACITY.search(message) or _OVERLOADED.search(message):
        return "capacity"
    if _PREFILL.search(message):
        return "prefill_rejected"
    return None


def _describe(error: Any) -> tuple[str, str | None, set[str]]:
    """(message, error type, lower-cased type and code) of a provider's error object."""
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, Mapping):
        error = {}
    message = str(error.get("message") or "")
    etype, code = error.get("type"), error.get("code")
    names = {str(v).lower() for v in (etype, code) if v}
    error_type = str(etype or code) if (etype or code) else None
    return message, error_type, names


def classify_error_object(error: Any) -> Failure:
    """Classify an error object that arrived *inside* a stream (after HTTP 200).

    Accepts OpenAI's ``{"message", "type", "code"}``, Anthropic's ``{"type", "message"}`` and
    anything close to them. Unknown shapes count as transient: mid-stream, retrying is the only
    way to save the answer, and a permanent problem would have been refused before the 200.
    """
    message, error_type, names = _describe(error)
    kind = _by_message(message)
    if kind is None and names & _MODEL_SLIPS:
        kind = "transient"  # the model wrote a malformed call: generating again can succeed
    if kind is None:
        if names & _CAPACITY_TYPES:
            kind = "capacity"
        elif names & _QUOTA_TYPES:
            kind = "quota"
        elif names & _PERMANENT_TYPES:
            kind = "permanent"
        elif names & _RATE_TYPES:
            kind = "rate_limit"
        else:
            kind = "transient"
    if _too_long(kind, message, names):
        kind = "context_length"
    return Failure(
        kind=kind,
        message=message or error_type or "upstream error",
        error_type=error_type,
        switch_model=bool(_AT_CAPACITY.search(message)),
    )


def _by_status(status: int) -> FailureKind:
    if status in (503, 529):
        return "capacity"
    if status == 429:
        return "rate_limit"
    if status in (408, 409) or status >= 500:
        return "transient"
    return "permanent"


def _parse_body(body: str) -> Any:
    """The body as JSON when it is a JSON object, else ``None``."""
    try:
        return json.loads(body) if body.lstrip().startswith("{") else None
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return None


def _error_of(parsed: Any, body: str) -> Any:
    """The error object of a parsed body (or the body's text as its message)."""
    if isinstance(parsed, Mapping):
        error = parsed.get("error", parsed)
        return {"message": error} if isinstance(error, str) else error
    return {"message": body.strip()[:500]}


def _error_of_body(body: str) -> Any:
    return _error_of(_parse_body(body), body)


#: Statuses that mean "no such endpoint here" when no API error object comes with them.
_NOT_AN_API = frozenset({404, 405, 501})


def _is_html(headers: Mapping[str, str]) -> bool:
    return _media_type(headers) in ("text/html", "application/xhtml+xml")


def classify_response(
    status: int, headers: Mapping[str, str], body: str, *, now: float, url: str = ""
) -> Failure:
    """Classify a non-2xx HTTP response.

    The message wins (an overload sent as 400 is still an overload), then an explicit quota or
    capacity type, then the status. ``x-should-retry`` (sent by OpenAI and Anthropic) overrides
    as it does in their SDKs. ``headers`` must be case-insensitive (httpx's are); ``now`` is the
    wall-clock time (Unix seconds) for a ``Retry-After`` given as an HTTP date. With ``url``,
    a 404/405/501 (or an HTML 4xx page) without an LLM API's error object is read as a URL that
    does not lead to an LLM API, and said so.
    """
    parsed = _parse_body(body)
    message, error_type, names = _describe(_error_of(parsed, body))
    kind = _by_message(message)
    if kind is None:
        if names & _QUOTA_TYPES:
            kind = "quota"
        elif names & _CAPACITY_TYPES:
            kind = "capacity"
        else:
            kind = _by_status(status)
    # Every LLM API, Ollama's included, reports an error under an "error" key.
    no_api = not names and not (isinstance(parsed, Mapping) and "error" in parsed)
    if url and no_api and (status in _NOT_AN_API or (status < 500 and _is_html(headers))):
        # No error object of any LLM API: a web server, a proxy, a wrong path.
        kind = "permanent"
        shown = f" ({message[:120]})" if message and not _is_html(headers) else ""
        message = (
            f"{url} answered HTTP {status}{shown}, which is not what an LLM API answers: check "
            "base_url (OpenAI-compatible servers usually end in /v1) and provider"
        )
    if status in (400, 413, 422) and kind == "permanent" and _too_long(kind, message, names):
        kind = "context_length"
    should_retry = headers.get("x-should-retry")
    if should_retry == "false" and kind not in ("prefill_rejected", "context_length"):
        kind = "permanent"
    elif should_retry == "true" and kind == "permanent":
        kind = "transient"
    return Failure(
        kind=kind,
        message=message or f"HTTP {status}" + (f" {error_type}" if error_type else ""),
        status_code=status,
        error_type=error_type,
        retry_after=parse_retry_after(headers, now=now),
        switch_model=bool(_AT_CAPACITY.search(message)),
    )


_MAX_HINT = 24 * 3600.0


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds to wait according to the server, or ``None`` when it gave no usable hint.

    ``retry-after-ms`` (OpenAI) wins over ``Retry-After``, which may be seconds or an HTTP date
    (RFC 9110). Negative, unparsable and absurd (over a day) values are ignored.
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = -1.0
        if 0 <= ms / 1000 <= _MAX_HINT:
            return ms / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
            if when.tzinfo is None:
                return None
            seconds = max(0.0, when.timestamp() - now)
        except (TypeError, ValueError, IndexError, OverflowError):  # absurd zones and years
            return None
    if seconds != seconds or not 0 <= seconds <= _MAX_HINT:  # NaN, negative, absurd
        return None
    return seconds


def _media_type(headers: Mapping[str, str]) -> str:
    return (headers.get("content-type") or "").split(";")[0].strip().lower()


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Does a 2xx response announce an event stream? (No content type at all is given the
    benefit of the doubt: some servers omit it and stream anyway.)"""
    media = _media_type(headers)
    return media in ("", "text/event-stream")


def classify_not_a_stream(
    status: int, headers: Mapping[str, str], body: str, *, url: str, now: float
) -> Failure:
    """A 2xx or 3xx answer that is not the event stream a streaming request asked for.

    A redirect is never followed (it could carry the key to another origin): it fails for good,
    naming the target. A JSON body is an error object (an invalid key, a quota) and is classified
    like any error body; a JSON body without one means the server does not stream. Anything
    else (a CDN's HTML page, plain text) means the URL does not lead to an LLM API.
    """
    media = _media_type(headers) or "no content type"
    if 300 <= status < 400:
        target = headers.get("location") or "an unnamed location"
        return Failure(
            "permanent",
            f"{url} redirected (HTTP {status}) to {target}; redirects are not followed, so "
            "that a key never goes to another origin: use the target as base_url",
            status_code=status,
        )
    if media == "application/json" or media.endswith("+json"):
        error = _error_of_body(body)
        if isinstance(error, Mapping) and (error.get("type") or error.get("code")):
            got = classify_response(400, headers, body, now=now)
            return Failure(
                got.kind,
                got.message,
                status_code=status,
                error_type=got.error_type,
                retry_after=got.retry_after,
                switch_model=got.switch_model,
            )
        if isinstance(error, Mapping) and error.get("message") and '"error"' in body:
            return classify_error_object(error)
        return Failure(
            "permanent",
            f"{url} answered HTTP {status} with JSON, not an event stream: does this server "
            "support streaming?",
            status_code=status,
        )
    return Failure(
        "permanent",
        f"{url} answered HTTP {status} with {media}, not an event stream: is this the URL "
        "of an LLM API?",
        status_code=status,
    )
