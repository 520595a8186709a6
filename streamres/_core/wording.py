"""The one-line status messages a UI can show as they are (seed section 6: say something
friendly and neutral, never a stack trace)."""

from __future__ import annotations

from streamres._core.classify import Failure

__all__ = [
    "busy_message",
    "fallback_message",
    "plural",
    "reason_phrase",
    "resume_message",
    "retry_message",
]

_REASONS = {
    "capacity": "Model busy (at capacity)",
    "rate_limit": "Rate limited",
    "transient": "Server error",
    "connection": "Connection dropped",
    "stall": "No output for a while",
    "truncated": "The stream ended early",
    "malformed": "Garbled data from the server",
    "prefill_rejected": "Model does not take a partial answer",
    "permanent": "Request refused",
    "context_length": "Too long for the model's context window",
    "deadline": "Out of time",
    "replay_unavailable": "Could not re-attach to the answer",
    "ended_at_seam": "The model did not continue the answer",
    "client_busy": "This computer was too busy to hear the server in time",
    "quota": "The account is out of credit",
    "slow": "The stream slowed to a trickle",
}


def reason_phrase(failure: Failure) -> str:
    if failure.connect:
        return "Cannot reach the server"
    return _REASONS.get(failure.kind, failure.kind)


def _seconds(delay: float) -> str:
    if delay < 0.05:
        return "now"
    if delay < 10:
        return f"in {delay:.1f} s"
    return f"in {delay:.0f} s"


def retry_message(failure: Failure, *, delay: float, attempt: int, cap: int | None) -> str:
    of = f" of {cap}" if cap else ""
    return f"{reason_phrase(failure)} — retrying {_seconds(delay)} (attempt {attempt}{of})"


def resume_message(failure: Failure, *, delay: float, tokens: int) -> str:
    when = "resuming…" if delay < 0.05 else f"resuming {_seconds(delay)}…"
    return f"{reason_phrase(failure)} after {plural(tokens, 'token')} — {when}"


def fallback_message(from_model: str, to_model: str, reason: str = "capacity") -> str:
    """Capacity words only for capacity: a network failure or a broken stream says so."""
    if reason in ("capacity", "rate_limit", "circuit_open"):
        return f"Many people are using {from_model} right now — switching you to {to_model}"
    if reason == "unreachable":
        return f"Cannot reach {from_model} — switching you to {to_model}"
    if reason == "context_length":
        return f"This conversation is too long for {from_model} — switching you to {to_model}"
    if reason == "quota":
        return f"The account for {from_model} is out of credit — switching you to {to_model}"
    what = _REASONS.get(reason, reason).lower()
    return f"{from_model} is not answering well ({what}) — switching you to {to_model}"


def plural(n: int, word: str) -> str:
    """``1 resume``, ``2 resumes``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def busy_message(wait: float, *, probing: bool, capacity: bool = True) -> str:
    """Every model's circuit is open: "busy" only when capacity is what opened them."""
    head = "All models are busy" if capacity else "No model is answering right now"
    if probing:
        return f"{head} — waiting for a test request to show one has recovered"
    return f"{head} — trying again {_seconds(wait)}"
