"""Routes: the models a client can use, described once, and the order to try them in. Pure.

Fallback order (seed 2.2 and 3): the model asked for first; then its **smaller siblings of the
same family**, closest in size first (less memory per request, faster turnover, often a separate
pool); then other families, by current weight; the same family's larger or unsized models last
(they most likely share the jammed pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Route", "fallback_order", "pick_weighted"]


@dataclass(frozen=True, slots=True)
class Route:
    """One model at one endpoint.

    >>> Route("gpt-4o", family="gpt-4o", size=2), Route("gpt-4o-mini", family="gpt-4o", size=1)
    """

    model: str
    provider: Literal["openai", "anthropic", "openai-responses"] = "openai"
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    #: Unique name in a client (metrics, ``model=`` selection); defaults to ``model``.
    name: str | None = None
    #: Base weight for load balancing (relative to the other routes).
    weight: float = 1.0
    #: Streams this route may have in flight at once, shared by every stream of the client.
    max_in_flight: int | None = None
    #: Continuation strategy: ``auto``, ``prefill``, ``prefix``, ``partial`` or ``instruct``.
    continuation: Literal["auto", "prefill", "prefix", "partial", "instruct"] = "auto"
    #: The words an instruct continuation asks this model to go on with (``None``: streamres's
    #: own, in the answer's language); a call's ``continue_instruction`` wins.
    continue_instruction: str | None = None
    #: Re-attach to a stream its server kept generating (llama.cpp's server) before any
    #: continuation: each Chat Completions request carries an ``X-Conversation-Id``.
    #: ``False``: none is sent, and a break is always continued.
    replay: bool = True
    #: Model family, so the smaller sibling of a jammed model can be tried first.
    family: str | None = None
    #: Relative size within the family (smaller = lighter, faster sibling).
    size: float | None = None
    #: Key of the account/quota this route shares a limit with (default: its base URL).
    account: str | None = None
    #: Seconds to wait for this route's response headers when the answer has another model
    #: to go to (default: the answer's ``header_timeout``, 10 s); for a server that sends its
    #: headers only once the prompt is read (a local model on a CPU), give it more.
    header_timeout: float | None = None
    #: The model reasons before it writes: its requests wait the answer's whole
    #: ``first_token_timeout`` for a first output, not the quick bound. ``None``: by its name
    #: (o-series, GPT-5, a reasoner, R1, QwQ, "think") and by what each request asks.
    thinks: bool | None = None
    #: This route's own first-output wait (seconds), for every request: with no history and
    #: as the ceiling of the limit learnt from it. ``None``: the answer's bounds.
    first_token_timeout: float | None = None
    #: The model's context window in tokens, when known: a request refused for its length
    #: goes to a model of the chain with a larger window first, and never to one with a
    #: window no larger than the one that refused it.
    context_window: int | None = None

    def __post_init__(self) -> None:
        w = self.context_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
            raise ValueError(f"context_window must be a positive number of tokens, not {w!r}")

    @property
    def key(self) -> str:
        return self.name or self.model


def pick_weighted(candidates: Sequence[int], weights: Sequence[float], rand: float) -> int:
    """Weighted choice among ``candidates`` (indices into ``weights``); ``rand`` in [0, 1)."""
    total = sum(weights[i] for i in candidates)
    point = rand * total
    for i in candidates:
        point -= weights[i]
        if point < 0:
            return i
    return candidates[-1]


def fallback_order(routes: Sequence[Route], primary: int, weights: Sequence[float]) -> list[int]:
    """``primary`` first, then the fallbacks in the order described above."""
    p = routes[primary]
    rest = [i for i in range(len(routes)) if i != primary]

    def same_family(i: int) -> bool:
        return p.family is not None and routes[i].family == p.family

    def smaller(i: int) -> bool:
        s, ps = routes[i].size, p.size
        return same_family(i) and s is not None and ps is not None and s < ps

    def by_weight(i: int) -> tuple[float, int]:
        return (-weights[i], i)

    siblings = sorted((i for i in rest if smaller(i)), key=lambda i: (-(routes[i].size or 0), i))
    others = sorted((i for i in rest if not same_family(i)), key=by_weight)
    same_pool = sorted((i for i in rest if same_family(i) and not smaller(i)), key=by_weight)
    return [primary, *siblings, *others, *same_pool]
