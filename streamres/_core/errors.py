"""The error tree. Every failure of the public API is one of these::

    StreamError                    every error; .partial_text is what the caller already got
    ├── InvalidRequest (ValueError)    bad arguments, refused before any request was made
    │   └── MissingExtra (ImportError)  an optional part was asked for but its package is not
    │                                  installed; the message names the ``pip install`` line
    ├── RequestRejected                the upstream refused the request for good (400/401/403/
    │                                  404/422…): retrying cannot help, so it was not retried
    ├── DeadlineExceeded (TimeoutError)  the overall deadline ran out, or a Retry-After would
    │                                  outlast it
    ├── UpstreamUnreachable (ConnectionError)  no connection could be made to the server(s):
    │                                  refused, DNS, TLS, connect timeout — after a few quick
    │                                  tries, since the URL never answered
    └── AttemptsExhausted              the optional ``max_attempts`` cap was reached

Each carries ``partial_text`` (exactly the text already yielded as ``text`` events, so nothing
is lost), ``history`` (one :class:`~streamres.Attempt` per request), ``attempts`` (how many:
the same name and meaning as on the done event) and ``model``. No bare httpx exception escapes
the public API.
"""

from __future__ import annotations

from streamres._core.events import Attempt

__all__ = [
    "AttemptsExhausted",
    "DeadlineExceeded",
    "InvalidRequest",
    "MissingExtra",
    "RequestRejected",
    "StreamError",
    "UpstreamUnreachable",
]


class StreamError(Exception):
    """Base of every streamres error. ``partial_text`` is never lost."""

    def __init__(
        self,
        message: str,
        *,
        partial_text: str = "",
        history: tuple[Attempt, ...] = (),
        model: str | None = None,
        status_code: int | None = None,
        reason: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.partial_text = partial_text
        #: Every request made for the answer, in order.
        self.history = history
        self.model = model
        self.status_code = status_code
        #: The failure kind behind the error (``capacity``, ``permanent``, ``stall``…).
        self.reason = reason
        #: Seconds before asking again is worth it, where streamres knows (an unreachable
        #: server's circuit stays open that long); ``None`` otherwise.
        self.retry_after = retry_after

    @property
    def attempts(self) -> int:
        """How many requests were made (``len(history)``), as on the done event."""
        return len(self.history)

    def __str__(self) -> str:
        if self.partial_text:
            return f"{self.message} ({len(self.partial_text)} characters were delivered first)"
        return self.message


class InvalidRequest(StreamError, ValueError):
    """The arguments cannot make a valid request; nothing was sent."""


class MissingExtra(InvalidRequest, ImportError):
    """An optional part (the proxy's server, shared state, the semantic cache, Prometheus…) was
    asked for, and the package it runs on is not installed. ``extra`` names the streamres extra
    that brings it: the message ends with ``pip install 'streamres[<extra>]'``."""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message, reason="missing_extra")
        self.extra = extra


class RequestRejected(StreamError):
    """The upstream refused the request permanently (a 4xx that retrying cannot fix)."""


class DeadlineExceeded(StreamError, TimeoutError):
    """The overall deadline ran out before the answer was complete."""


class AttemptsExhausted(StreamError):
    """``max_attempts`` requests were made without completing the answer."""


class UpstreamUnreachable(StreamError, ConnectionError):
    """No connection could be made to the server: refused, DNS failure, TLS failure or a
    connect timeout, tried a few times in quick succession because the URL had never answered.
    The message names the URL, the cause and what to check."""
