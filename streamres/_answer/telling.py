"""What the caller is told: the event for the policy's decision after a failed attempt, the
wait for a model, the done event, or the error the answer gives up with. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamres._answer.delivery import Delivery
from streamres._core.classify import Failure
from streamres._core.errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from streamres._core.events import (
    Attempt,
    DoneEvent,
    FallbackEvent,
    ResumeEvent,
    RetryEvent,
    Usage,
)
from streamres._core.logs import Log
from streamres._core.policy import Decision
from streamres._core.wording import (
    busy_message,
    fallback_message,
    plural,
    resume_message,
    retry_message,
)
from streamres._fleet.routes import Route

__all__ = [
    "LOG_EVENT",
    "Closing",
    "after_failure",
    "busy",
    "done",
    "error",
    "fallback",
    "giving_up",
    "log_decision",
    "unreachable",
]

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


def log_decision(
    log: Log, decision: Decision, fail: Failure, route: Route, *, attempt: int, chars: int
) -> None:
    """Tell the log what the policy decided after ``attempt`` failed."""
    log.info(
        LOG_EVENT[decision.action, bool(chars)],
        model=route.key,
        attempt=attempt,
        reason=fail.kind,
        status_code=fail.status_code,
        error=fail.message,
        chars=chars,
        delay=round(decision.delay, 3),
    )


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


def unreachable(why: str, wait: float) -> str:
    """Why an answer is refused at once: its models have never answered and cannot be
    reached, and each one's circuit stays open for ``wait`` seconds."""
    return (
        f"{why}; not tried again for {wait:.0f} s (its circuit is open). Check that the "
        "server is running and reachable from here, and that base_url (and provider) are right."
    )


def fallback(
    model: str, to_model: str, reason: str, why: str, *, attempt: int, tokens: int
) -> FallbackEvent:
    """The event for a move from ``model`` to ``to_model`` (``why``: the words' reason)."""
    return FallbackEvent(
        message=fallback_message(model, to_model, why),
        attempt=attempt,
        from_model=model,
        to_model=to_model,
        reason=reason,
        tokens_so_far=tokens,
    )


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
        why = "unreachable" if fail.connect else fail.kind
        return fallback(model, to_model, fail.kind, why, attempt=attempt + 1, tokens=tokens)
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


def busy(wait: float, *, probing: bool, capacity: bool, attempt: int, model: str) -> RetryEvent:
    """The event for a wait of ``wait`` seconds for a model that will take the request."""
    return RetryEvent(
        message=busy_message(wait, probing=probing, capacity=capacity),
        attempt=attempt,
        delay=wait,
        reason="circuit_open",
        model=model,
    )


@dataclass(frozen=True, slots=True)
class Closing:
    """How the answer ends, while its done event waits for a count: the finish reason, the
    refusal, whether the body's end is still to be read (``Finish.drain``), and the id the
    server gave the response that finished it."""

    finish_reason: str
    refusal: str = ""
    drain: bool = False
    response_id: str = ""


def done(
    delivery: Delivery,
    closing: Closing,
    model: str,
    history: Sequence[Attempt],
    resumes: int,
    usage: Usage,
    elapsed: float,
) -> DoneEvent:
    """The done event: the whole answer as delivered, its usage and history."""
    return DoneEvent(
        text=delivery.text,
        finish_reason=closing.finish_reason,
        model=model,
        attempts=len(history),
        resumes=resumes,
        usage=usage,
        history=tuple(history),
        deduplicated_chars=delivery.deduplicated,
        elapsed=elapsed,
        tool_calls=delivery.tool_calls,
        thinking="".join(delivery.thinking),
        refusal=closing.refusal,
        join=delivery.join,
        response_id=closing.response_id,
    )


def error(
    cls: type[StreamError],
    message: str,
    last: Failure | None,
    partial_text: str,
    history: Sequence[Attempt],
    model: str,
    retry_after: float | None = None,
) -> StreamError:
    """The error an answer ends with (``message`` masked already), the partial answer in it."""
    return cls(
        message,
        partial_text=partial_text,
        history=tuple(history),
        model=model,
        status_code=last.status_code if last else None,
        reason=last.kind if last else None,
        retry_after=retry_after,
    )
