"""What the caller is told after a failed attempt: the event for the policy's decision, or the
error it gives up with. Pure."""

from __future__ import annotations

from streamres._core.classify import Failure
from streamres._core.errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from streamres._core.events import FallbackEvent, ResumeEvent, RetryEvent
from streamres._core.policy import Decision
from streamres._core.wording import fallback_message, plural, resume_message, retry_message

__all__ = ["LOG_EVENT", "after_failure", "giving_up"]

#: The log event of each decision, by whether text was delivered.
LOG_EVENT = {
    ("retry", False): "streamres.retry_scheduled",
    ("retry", True): "streamres.resume_scheduled",
    ("switch", False): "streamres.fallback_scheduled",
    ("switch", True): "streamres.fallback_scheduled",
    ("give_up", False): "streamres.attempt_failed",
    ("give_up", True): "streamres.attempt_failed",
}
_GIVE_UP: dict[str, type[StreamError]] = {
    "rejected": RequestRejected,
    "attempts": AttemptsExhausted,
    "unreachable": UpstreamUnreachable,
}


def giving_up(
    decision: Decision, fail: Failure, model: str, attempt: int
) -> tuple[type[StreamError], str]:
    """The error an answer gives up with, and its message."""
    cls = _GIVE_UP.get(decision.error, DeadlineExceeded)
    if cls is RequestRejected and fail.kind == "context_length":
        message = f"{model} refused the request ({fail.message}): {decision.why}; not retried"
    elif cls is RequestRejected:
        message = f"{model} refused the request ({fail.message}); not retried"
    elif cls is UpstreamUnreachable:
        message = (
            f"{decision.why}. Check that the server is running and reachable from "
            "here, and that base_url (and provider) are right."
        )
    else:
        message = f"gave up after {plural(attempt, 'attempt')}: {decision.why}"
    return cls, message


def after_failure(
    decision: Decision,
    fail: Failure,
    *,
    attempt: int,
    model: str,
    to_model: str,
    chars: int,
    tokens: int,
    strategy: str,
    max_attempts: int | None,
) -> FallbackEvent | ResumeEvent | RetryEvent:
    """The event for a retry, a resume (text was delivered) or a switch to ``to_model``."""
    if decision.action == "switch":
        return FallbackEvent(
            message=fallback_message(model, to_model, "unreachable" if fail.connect else fail.kind),
            attempt=attempt + 1,
            from_model=model,
            to_model=to_model,
            reason=fail.kind,
            tokens_so_far=tokens,
        )
    if chars:
        return ResumeEvent(
            message=resume_message(fail, delay=decision.delay, tokens=tokens),
            attempt=attempt + 1,
            delay=decision.delay,
            reason=fail.kind,
            model=model,
            strategy=strategy,
            tokens_so_far=tokens,
            chars_so_far=chars,
        )
    return RetryEvent(
        message=retry_message(fail, delay=decision.delay, attempt=attempt + 1, cap=max_attempts),
        attempt=attempt + 1,
        delay=decision.delay,
        reason=fail.kind,
        model=model,
        status_code=fail.status_code,
    )
