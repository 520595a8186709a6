"""The answer's chain of models: where it stands in it, and each model's record for this
answer. Pure.

The chain is the order the answer's models are tried in (``Options.chain``, indexes into the
fleet's routes; a model may stand in it more than once). For each position it keeps the
model's consecutive failures (what the policy reads), whether the model refused this
answer's request for its length, and whether its key or account is out of credit (never that
model again, nor any on the same key or account, for this answer).
"""

from __future__ import annotations

from collections.abc import Sequence

from streamres._answer.options import Options
from streamres._core.classify import Failure
from streamres._core.policy import Decision, consecutive_failures, decide
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route

__all__ = ["Chain"]


class Chain:
    """The models of one answer, in order, and the one it is on."""

    __slots__ = ("failures", "fleet", "has_fallback", "indexes", "out_of_credit", "pos", "too_long")

    def __init__(self, fleet: Fleet, indexes: Sequence[int]) -> None:
        self.fleet = fleet
        self.indexes = tuple(indexes)
        #: The position the answer is on.
        self.pos = 0
        #: Consecutive failures of each position's model, the last one included.
        self.failures = [0] * len(self.indexes)
        #: Positions whose model refused this answer's request for its length.
        self.too_long = [False] * len(self.indexes)
        #: Positions whose key or account is out of credit.
        self.out_of_credit = [False] * len(self.indexes)
        #: The chain has another model to go to (the header and first-output bounds apply).
        self.has_fallback = len(set(self.indexes)) > 1

    @property
    def index(self) -> int:
        """The current model, as an index into ``fleet.routes``."""
        return self.indexes[self.pos]

    @property
    def route(self) -> Route:
        return self.fleet.routes[self.index]

    def windows(self) -> list[int | None]:
        """Each position's context window (tokens), where its route declares one."""
        return [self.fleet.routes[i].context_window for i in self.indexes]

    def move_to(self, pos: int) -> Route:
        """Go to position ``pos`` (the fleet counts the fallback); the route left behind."""
        left = self.route
        old, self.pos = self.index, pos
        self.fleet.fell_back(old, self.index)
        return left

    def succeeded(self) -> None:
        self.failures[self.pos] = 0

    def failed(self, kind: str, *, added: bool, seam_tries: int) -> None:
        """The current model's attempt failed with ``kind`` (``added``: it delivered text)."""
        if kind == "context_length":
            self.too_long[self.pos] = True
        elif kind == "quota":  # every model on that key or account: the credit is the key's
            spent = _payer(self.route)
            for at, i in enumerate(self.indexes):
                if _payer(self.fleet.routes[i]) == spent:
                    self.out_of_credit[at] = True
        self.failures[self.pos] = consecutive_failures(
            kind, self.failures[self.pos], added=added, seam_tries=seam_tries
        )

    def decide(
        self,
        fail: Failure,
        *,
        attempt: int,
        reached: bool,
        time_left: float,
        opts: Options,
        replay_at_hand: bool = False,
    ) -> Decision:
        """After the current model's ``attempt`` failed: the policy's decision, from this
        chain's record (``reached``: the model's server has answered in this process;
        ``replay_at_hand``: its server kept generating, to be re-attached to)."""
        return decide(
            fail,
            attempt=attempt,
            max_attempts=opts.max_attempts,
            model_index=self.pos,
            failures=self.failures,
            time_left=time_left,
            backoff=opts.backoff,
            rand=opts.rng.random(),
            fallback_after=opts.fallback_after,
            reached=reached,
            too_long=self.too_long,
            windows=self.windows(),
            out_of_credit=self.out_of_credit,
            replay_at_hand=replay_at_hand,
        )


def _payer(route: Route) -> str:
    """Who pays for ``route``'s requests: its key, else its account (else its server)."""
    return route.api_key or route.account or route.base_url or ""
