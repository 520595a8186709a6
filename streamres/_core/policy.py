"""What to do after a failed attempt: retry, switch model, or give up. Pure.

The rules, in order:

1. a permanent error (bad request, auth, not found) is never retried; an account out of credit
   (``quota``: ``insufficient_quota``, ``billing_error``) is not asked again, nor is any model on
   the same key or account, but the answer goes on to the next model of the chain on another
   account or provider, and is refused when none is left; a request longer
   than the model's context window (``context_length``) is never sent to that model again,
   but goes on to the next model of the chain that has not refused it for its length (a
   larger window may take it) — where routes declare their windows, a larger one first, and
   never one no larger than the window that refused it — and is refused, naming the limit,
   when none is left;
2. time that ran out ends the answer as a deadline (never as the attempt cap);
3. the optional attempt cap ends the answer;
4. a URL that has never answered and cannot be reached (refused, DNS, TLS, connect timeout) gets
   a short connect budget: ``CONNECT_TRIES`` tries on ``CONNECT_BACKOFF`` (about a second in
   all), then the next model, then :class:`~streamres.UpstreamUnreachable` — a wrong URL is
   told in seconds, not after the whole deadline. A URL that answered before is patient: the
   rules below apply, as to any dropped connection;
5. "prefill not supported" is retried at once on the same model (with the instruct strategy),
   and so is a background response that cannot be re-attached to (by a continuation); a
   response the server is still generating, which the answer can re-attach to
   (``replay_at_hand``: a background response, a llama.cpp stream), is read on at once on the
   same model — the break was the connection's, and the server has the rest;
6. with more than one model in the chain, move to the next one when the server says this
   model is at capacity ("Selected model is at capacity": no point waiting on it), when its
   server sent no response headers within the header bound (``no_headers``: a server that
   accepts and stays silent is not asked again before the next model is), or no first
   output within the limit learnt from its own history (``first_output``), when it streams
   below its pace floor (``slow``, opt-in), when its
   Retry-After is longer than the time left, or after ``fallback_after`` consecutive failures;
   a model that has not failed yet is tried at once, one that has failed waits its backoff;
7. otherwise wait the backoff (never less than Retry-After) and retry the same model;
8. a wait that would end after the deadline is cut short to a **last try** that fits — half
   the time left (never less than Retry-After), when that leaves the attempt at least
   ``LAST_TRY`` seconds — and only when none fits does the answer give up: an 8 s deadline is
   not abandoned at 1.3 s because the schedule's next wait was 7.7 s;
9. a connect that timed out while this process's own event loop ran at least half its
   timeout late (``client_busy``; the shell reports the lateness, and the timer had twice it
   on top: ``connect_allowance``) is not the model's failure: it is tried again on the same
   model after about ``CLIENT_BUSY_WAIT`` (jittered), and counts towards no fallback, breaker
   or weight. Likewise a silence past the stall limit while the loop ran at least half that
   limit late is waited out again, not resumed (``Answer.timed_out``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from streamres._core import classify
from streamres._core.backoff import Backoff
from streamres._core.classify import Failure

__all__ = [
    "CLIENT_BUSY_WAIT",
    "CONNECT_BACKOFF",
    "CONNECT_TRIES",
    "LAST_TRY",
    "Decision",
    "blame_connect",
    "connect_timeout",
    "consecutive_failures",
    "decide",
    "reinterpret",
]

#: Seconds a last try must have left after its wait to be worth making (rule 8).
LAST_TRY = 1.0

#: About how long an attempt that failed on this side waits before it is made again (rule 9).
CLIENT_BUSY_WAIT = 0.5

#: Tries for a URL that has never answered before it counts as unreachable.
CONNECT_TRIES = 3
#: Waits between those tries (ceilings 0.25, 0.5, 1 s).
CONNECT_BACKOFF = Backoff(initial=0.25, multiplier=2.0, maximum=1.0)


def connect_timeout(reached: bool) -> float:
    """Seconds a connect may take: short for a URL that never answered (rule 4), patient for
    one that did."""
    return 10.0 if reached else 3.0


def connect_allowance(late: float) -> float:
    """Seconds to add to a connect's timer when this process's event loop has been running
    ``late`` seconds late (rule 9): twice that, the time its completion may wait in the loop."""
    return 2.0 * late


def this_side_busy(timeout: float, late: float) -> bool:
    """Did a connect timer of ``timeout`` seconds fire because of this side (rule 9)? Yes
    when the loop has been running at least half that late."""
    return late >= timeout / 2


def blame_connect(fail: Failure, *, reached: bool, late: float, url: str) -> Failure:
    """A connect that timed out while this side's event loop ran ``late`` seconds late is this
    side's failure (``client_busy``, rule 9), not the server at ``url``'s; any other failure
    stays as it is. ``reached``: the server has answered before (its connect timeout)."""
    timeout = connect_timeout(reached)
    if fail.error_type != "connect_timeout" or not this_side_busy(timeout, late):
        return fail
    return classify.failure(
        "client_busy",
        f"no connection to {url} within {timeout + connect_allowance(late):.1f} s while this "
        f"process's event loop ran {late:.1f} s late: this side was too busy to see the server "
        "answer, so the server is not blamed",
    )


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["retry", "switch", "give_up"]
    delay: float = 0.0
    model_index: int = 0
    #: For ``give_up``: which error to raise, and why in words.
    error: Literal["rejected", "deadline", "attempts", "unreachable", ""] = ""
    why: str = ""


def consecutive_failures(kind: str, current: int, *, added: bool, seam_tries: int) -> int:
    """A model's count of consecutive failures after an attempt on it failed with ``kind``
    (``current``: the count before; ``added``: the attempt delivered text, so the model was
    working and its count starts again at one). The count is what :func:`decide` reads."""
    if kind == "ended_at_seam":
        # The model is well, it would not continue: the first time it is asked again (in the
        # other wording); the second, :func:`decide` moves to the next model.
        return seam_tries
    if kind in ("client_busy", "context_length", "quota"):
        # This side's failure, not the model's; a request too long for the model, or an
        # account out of credit, is not a failure of the model either (it is not asked again
        # for this answer).
        return current
    return 1 if added else current + 1


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
    reached: bool = True,
    too_long: Sequence[bool] = (),
    windows: Sequence[int | None] = (),
    out_of_credit: Sequence[bool] = (),
    replay_at_hand: bool = False,
) -> Decision:
    """``failures[i]``: consecutive failures of model ``i``, this one included; ``reached``:
    the current model's server has answered at least once (in this process); ``too_long[i]``:
    model ``i`` refused this answer's request for its length (this one included);
    ``windows[i]``: model ``i``'s context window in tokens, where its route declares one;
    ``out_of_credit[i]``: model ``i``'s key or account is out of credit (this one included);
    ``replay_at_hand``: the server kept generating, and the answer can re-attach to it."""
    if failure.kind == "permanent":
        return Decision("give_up", error="rejected", why=failure.message)
    if failure.kind == "quota":
        other = _other_payer(model_index, out_of_credit or [False] * len(failures))
        if other is not None:
            return Decision("switch", model_index=other)
        whose = "every account of the chain" if len(failures) > 1 else "the account"
        return Decision("give_up", error="rejected", why=f"{failure.message} ({whose})")
    if failure.kind == "context_length":
        nxt = _longer(model_index, len(failures), too_long, windows)
        if nxt is not None:
            return Decision("switch", model_index=nxt)
        whose = "every model of the chain" if len(failures) > 1 else "the model"
        why = f"it is longer than the context window of {whose}"
        return Decision("give_up", error="rejected", why=why)
    if failure.kind == "deadline" or time_left <= 0:
        return Decision("give_up", error="deadline", why=failure.message)
    if max_attempts is not None and attempt >= max_attempts:
        return Decision(
            "give_up", error="attempts", why=f"{attempt} attempts made; last: {failure.message}"
        )
    if failure.kind == "client_busy":
        # This side was too busy (rule 9): the same model again, after a short wait that lets
        # the rush pass, never the next model (this one did nothing wrong).
        delay = CLIENT_BUSY_WAIT * (0.5 + rand)
        if delay < time_left:
            return Decision("retry", delay=delay, model_index=model_index)
        return Decision("give_up", error="deadline", why=failure.message)
    if replay_at_hand:
        return Decision("retry", model_index=model_index)
    if failure.connect and not reached:
        return _unreached(failure, model_index, failures, time_left, rand)
    if failure.kind in ("prefill_rejected", "replay_unavailable"):
        return Decision("retry", model_index=model_index)
    if failure.kind == "ended_at_seam":
        # Not the server's fault: ask again at once, in the other wording; the second time,
        # the next model (if there is one).
        if len(failures) > 1 and failures[model_index] >= 2:
            return Decision("switch", model_index=(model_index + 1) % len(failures))
        return Decision("retry", model_index=model_index)
    hint = failure.retry_after
    n_models = len(failures)
    if n_models > 1 and (
        failure.switch_model
        or failure.kind == "slow"
        or failure.error_type in ("no_headers", "first_output")
        or (hint is not None and hint >= time_left)
        or failures[model_index] >= fallback_after
    ):
        nxt = (model_index + 1) % n_models
        delay = backoff.delay(failures[nxt], rand=rand) if failures[nxt] else 0.0
        if delay < time_left:
            return Decision("switch", delay=delay, model_index=nxt)
        last = _last_try(None, time_left)
        if last is not None:
            return Decision("switch", delay=last, model_index=nxt)
        return Decision("give_up", error="deadline", why="every model is failing")
    delay = backoff.delay(failures[model_index], rand=rand, hint=hint)
    if delay < time_left:
        return Decision("retry", delay=delay, model_index=model_index)
    last = _last_try(hint, time_left)
    if last is not None:
        return Decision("retry", delay=last, model_index=model_index)
    if hint is not None and hint >= time_left:
        why = f"the server asked to wait {hint:.1f} s but only {time_left:.1f} s remain"
    else:
        why = f"the next retry ({delay:.1f} s away) would come after the deadline"
    return Decision("give_up", error="deadline", why=why)


def _other_payer(model_index: int, out_of_credit: Sequence[bool]) -> int | None:
    """Rule 1: the next model of the chain whose key or account still has credit."""
    n = len(out_of_credit)
    for step in range(1, n):
        nxt = (model_index + step) % n
        if not out_of_credit[nxt]:
            return nxt
    return None


def _longer(
    refused: int, n: int, too_long: Sequence[bool], windows: Sequence[int | None]
) -> int | None:
    """Rule 3b: after a refusal for length, the model to try — in the chain's order, one that
    has not refused, a declared larger window first; never one whose declared window is no
    larger than the refusing model's (it would refuse too). ``None``: no model is left."""

    def window(i: int) -> int | None:
        return windows[i] if i < len(windows) else None

    left = [
        i
        for i in ((refused + step) % n for step in range(1, n))
        if not (too_long[i] if i < len(too_long) else False)
    ]
    limit = window(refused)
    if limit is not None:
        left = [i for i in left if (window(i) or limit + 1) > limit]
        larger = [i for i in left if window(i) is not None]
        if larger:
            return larger[0]
    return left[0] if left else None


def _last_try(hint: float | None, time_left: float) -> float | None:
    """Rule 8: the wait of a last try that fits in the time left, or ``None``."""
    wait = max(hint or 0.0, time_left / 2)
    return wait if time_left - wait >= LAST_TRY else None


def _unreached(
    failure: Failure, model_index: int, failures: Sequence[int], time_left: float, rand: float
) -> Decision:
    """Rule 4: a few quick tries, then the next model, then unreachable."""
    n = failures[model_index]
    if n < CONNECT_TRIES:
        delay = CONNECT_BACKOFF.delay(n, rand=rand)
        if delay < time_left:
            return Decision("retry", delay=delay, model_index=model_index)
        return Decision("give_up", error="deadline", why=failure.message)
    nxt = (model_index + 1) % len(failures)
    if nxt != model_index and failures[nxt] < CONNECT_TRIES:
        delay = CONNECT_BACKOFF.delay(failures[nxt], rand=rand) if failures[nxt] else 0.0
        if delay < time_left:
            return Decision("switch", delay=delay, model_index=nxt)
    return Decision("give_up", error="unreachable", why=f"{failure.message} ({n} tries)")


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
