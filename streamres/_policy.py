"""What to do after a failed attempt: retry, switch model, or give up. Pure.

The rules, in order:

1. a permanent error (bad request, auth, not found, quota) is never retried;
2. time that ran out ends the answer as a deadline (never as the attempt cap);
3. the optional attempt cap ends the answer;
4. "prefill not supported" is retried at once on the same model (with the instruct strategy),
   and so is a background response that cannot be re-attached to (by a continuation);
5. with more than one model in the chain, move to the next one when the server says this
   model is at capacity ("Selected model is at capacity": no point waiting on it), when its
   Retry-After is longer than the time left, or after ``fallback_after`` consecutive failures;
   a model that has not failed yet is tried at once, one that has failed waits its backoff;
6. otherwise wait the backoff (never less than Retry-After) and retry the same model;
7. a wait that would end after the deadline gives up now, rather than sleeping in vain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ._backoff import Backoff
from ._classify import Failure

__all__ = ["Decision", "decide", "reinterpret"]


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["retry", "switch", "give_up"]
    delay: float = 0.0
    model_index: int = 0
    #: For ``give_up``: which error to raise, and why in words.
    error: Literal["rejected", "deadline", "attempts", ""] = ""
    why: str = ""


def decide(
    failure: Failure,
    *,
    attempt: int,
    max_attempts: int | None,
    model_index: int,
    failures: Sequence[int],
    time_left: float,
    backoff: Backoff,
    rand: float,
    fallback_after: int,
) -> Decision:
    """``failures[i]``: consecutive failures of model ``i``, this one included."""
    if failure.kind == "permanent":
        return Decision("give_up", error="rejected", why=failure.message)
    if failure.kind == "deadline" or time_left <= 0:
        return Decision("give_up", error="deadline", why=failure.message)
    if max_attempts is not None and attempt >= max_attempts:
        return Decision(
            "give_up", error="attempts", why=f"{attempt} attempts made; last: {failure.message}"
        )
    if failure.kind in ("prefill_rejected", "replay_unavailable"):
        return Decision("retry", model_index=model_index)
    hint = failure.retry_after
    n_models = len(failures)
    if n_models > 1 and (
        failure.switch_model
        or (hint is not None and hint >= time_left)
        or failures[model_index] >= fallback_after
    ):
        nxt = (model_index + 1) % n_models
        delay = backoff.delay(failures[nxt], rand=rand) if failures[nxt] else 0.0
        if delay < time_left:
            return Decision("switch", delay=delay, model_index=nxt)
        return Decision("give_up", error="deadline", why="every model is failing")
    delay = backoff.delay(failures[model_index], rand=rand, hint=hint)
    if delay < time_left:
        return Decision("retry", delay=delay, model_index=model_index)
    if hint is not None and hint >= time_left:
        why = f"the server asked to wait {hint:.1f} s but only {time_left:.1f} s remain"
    else:
        why = f"the next retry ({delay:.1f} s away) would come after the deadline"
    return Decision("give_up", error="deadline", why=why)


def reinterpret(failure: Failure, *, prefill_continuation: bool, replaying: bool) -> Failure:
    """What a refusal means, given what the refused request was.

    A permanent error to a *re-attach* request means the server cannot replay (expired, not
    stored): the answer goes on by a continuation. A 400 to a *prefill or prefix continuation*
    (the first request of the answer was accepted) is about the continuation's shape: the
    server refuses prefill, so the instruct strategy is next. Anything else means what it says.
    """
    if failure.kind != "permanent":
        return failure
    if replaying:
        return Failure(
            "replay_unavailable", f"re-attaching failed ({failure.message})", failure.status_code
        )
    if prefill_continuation and failure.status_code == 400:
        return replace(failure, kind="prefill_rejected")
    return failure
