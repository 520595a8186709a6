"""How long an attempt waits, and how slow it may go: its response headers, its first output
(by the kind of request and the model's own history), and its pace floor. Pure.

Each is decided once, when the attempt is sent (``Answer._request``), from the answer's
options, the route, and what the fleet has learnt of the model; a model alone (no fallback) is
given the generous bounds, since there is nowhere better to go.
"""

from __future__ import annotations

from streamres._answer.attempt import AttemptState
from streamres._answer.options import Options
from streamres._core.stall import first_output_limit
from streamres._core.trickle import PaceWatch, learnt_pace
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route

__all__ = ["first_output", "header_wait", "pace_watch"]


def first_output(opts: Options, fleet: Fleet, attempt: AttemptState, *, fallback: bool) -> float:
    """The attempt's wait for its first output: the route's bound, else the answer's
    ``first_token_timeout``; with a fallback at hand (unless a hedge covers this model), the
    limit learnt from the model's own times to first token for requests of this kind — and,
    before any is known, the quick bound for a request that asks for no reasoning."""
    own = attempt.route.first_token_timeout
    ceiling = own if own is not None else opts.first_token_timeout
    if not fallback or (opts.hedged and attempt.index == opts.chain[0]):
        return ceiling
    # With shared state, the fleet's samples too.
    samples = fleet.ttft_samples(attempt.index, attempt.asked)
    quick = opts.quick_first_token_timeout if attempt.asked == "quick" and own is None else None
    return first_output_limit(samples, ceiling, quick=quick)


def pace_watch(
    opts: Options, fleet: Fleet, attempt: AttemptState, *, fallback: bool
) -> PaceWatch | None:
    """The attempt's pace floor, when the answer has one and a model to move on to: a share
    of the model's learnt pace and an absolute floor, the higher."""
    floors = opts.pace_floor
    if floors is None or not fallback:
        return None
    floor = floors.floor(learnt_pace(fleet.pace_samples(attempt.index)))
    return PaceWatch(floor, floors.window) if floor is not None else None


def header_wait(opts: Options, route: Route, first: float, *, fallback: bool) -> float:
    """The attempt's wait for response headers (``first``: its first-output wait): with
    another model to go to, the route's (or the answer's) header bound — a server that
    accepts and sends nothing is left for the next model then (policy rule 6); alone, the
    first-output wait."""
    if fallback:
        return min(first, route.header_timeout or opts.header_timeout)
    return first
