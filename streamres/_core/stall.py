"""When silence means a stalled stream. Pure: times are passed in.

Theory of operation. A stream is stalled when no output (text, reasoning, tool-call arguments;
never keep-alives) has come for longer than its limit. One fixed limit serves nobody: 30 s
froze a watched chat for 30 s after a fast stream stopped, while 5 s would abandon a reasoning
model that thinks for a minute before its first token. So the limit has two phases:

* **before the first output** of an attempt (and while waiting for response headers):
  ``first`` seconds, generous, because time to first token is the model thinking;
* **after it**, the stream's own pace: ``factor`` × the longest of the last gaps between
  outputs, never below ``floor`` nor above ``cap``; until a few gaps are known, ``cap``.

A fast stream (20 ms between tokens) that stops is resumed after ``floor`` (4 s); a slow one
(2 s between tokens) after 16 s; the pace carries over to the next attempt of the same answer.
A caller who gives ``stall_timeout`` gets that one fixed limit in both phases, as before.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "FIRST_OUTPUT",
    "HEADERS",
    "QUICK_FIRST",
    "RequestKind",
    "StallTimer",
    "first_output_limit",
    "model_reasons",
    "request_kind",
]

#: Default wait for an attempt's first output (and its response headers).
FIRST_OUTPUT = 60.0
#: Default wait for response headers when the answer has another model to go to: a server that
#: accepts a request and sends nothing is left for the next model after this, not after the
#: first-output wait (headers come before the model thinks: the time to first token is apart).
HEADERS = 10.0
_KNOWN_PACE = 3  # gaps needed before the pace is trusted

#: The learned first-output limit: after ``LEARN_AFTER`` of a model's times to first token,
#: ``FIRST_FACTOR`` × their 95th percentile, never below ``FIRST_FLOOR``, never above the
#: caller's ``first_token_timeout``.
LEARN_AFTER = 5
FIRST_FACTOR = 4.0
FIRST_FLOOR = 8.0

#: The first-output wait of a request that asks for no reasoning, on a model with no history
#: yet, when the answer has another model to go to: a careful gateway's bound (gateways fail
#: over on time to first token by configuration; 10 s is well past a quick model's first token
#: under load, and leaves a fallback's answer inside 15 s). A reasoning request keeps the whole
#: ``first_token_timeout``: its first token comes after the thinking.
QUICK_FIRST = 10.0

#: What a request asks of the model, for its first-output wait: ``reasoning`` (effort, a
#: thinking budget, or a model that reasons by default) or ``quick``.
RequestKind = Literal["quick", "reasoning"]

#: Model names that reason by default (OpenAI's o-series and GPT-5, DeepSeek's reasoner and R1,
#: QwQ, models named for thinking).
_THINKERS = re.compile(r"(?:^|[/:])o[1-9]|gpt-5|reason|(?:^|[-_/:])r1(?:$|[-_:])|qwq|think", re.I)
_NO_EFFORT = ("none", "minimal")


def model_reasons(model: str, thinks: bool | None) -> bool:
    """Does a route's model reason — its ``thinks``, else by its name?"""
    return bool(_THINKERS.search(model)) if thinks is None else thinks


def request_kind(body: Mapping[str, Any], model: str, thinks: bool | None = None) -> RequestKind:
    """``reasoning`` when the request asks for it — ``reasoning_effort`` (or the Responses API's
    ``reasoning.effort``) other than none or minimal, Anthropic ``thinking`` on, an
    ``enable_thinking`` switch — or when the route says its model reasons (``thinks``; ``None``:
    by its name, unless the request turns the effort down); else ``quick``."""
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if effort is None and isinstance(reasoning, Mapping):
        effort = reasoning.get("effort")
    thinking = body.get("thinking")
    kwargs = body.get("chat_template_kwargs")
    switch = body.get("enable_thinking")
    if switch is None and isinstance(kwargs, Mapping):
        switch = kwargs.get("enable_thinking")
    if (isinstance(effort, str) and effort.lower() in _NO_EFFORT) or switch is False:
        return "reasoning" if thinks else "quick"
    if (
        isinstance(effort, str)
        or (isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive"))
        or switch is True
    ):
        return "reasoning"
    if thinks is None:
        return "reasoning" if _THINKERS.search(model) else "quick"
    return "reasoning" if thinks else "quick"


def first_output_limit(
    samples: Sequence[float], ceiling: float, *, quick: float | None = None
) -> float:
    """How long an attempt on a model waits for its first output, when the answer has another
    model to go to: learnt from the model's own recent times to first token for requests of
    the same kind (``samples``). A model that is suddenly slow for its history is left early (a
    fallback is at hand); one that is always slow (a reasoning model) keeps its time. Until
    enough is known: ``quick`` for a request that asks for no reasoning (``QUICK_FIRST``), the
    generous ``ceiling`` for one that does (``quick=None``)."""
    if len(samples) < LEARN_AFTER:
        return ceiling if quick is None else min(ceiling, quick)
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return min(ceiling, max(FIRST_FLOOR, FIRST_FACTOR * p95))


@dataclass
class StallTimer:
    """``fixed``: the caller's ``stall_timeout`` (``None``: adaptive)."""

    fixed: float | None = None
    first: float = FIRST_OUTPUT
    floor: float = 4.0
    factor: float = 8.0
    cap: float = 30.0
    _gaps: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    _since: float = 0.0
    _outputs: int = 0
    _limit: float = 0.0  # limit() as of the last change: read once per network read

    def __post_init__(self) -> None:
        self._limit = self._compute()

    def start(self, now: float) -> None:
        """A new attempt begins (the pace learnt so far is kept)."""
        self._since = now
        self._outputs = 0
        self._limit = self._compute()

    def output(self, now: float) -> None:
        """Output arrived."""
        if self._outputs:
            self._gaps.append(now - self._since)
        self._outputs += 1
        self._since = now
        self._limit = self._compute()

    def wait_more(self, now: float) -> None:
        """The silence was this side's (its loop ran late): count it again from ``now``, the
        pace and the phase unchanged."""
        self._since = now

    def limit(self) -> float:
        """Seconds of silence allowed from the last output (or the attempt's start)."""
        return self._limit

    def deadline(self) -> float:
        """When the stream counts as stalled unless output comes first."""
        return self._since + self._limit

    def _compute(self) -> float:
        if self.fixed is not None:
            return self.fixed
        if not self._outputs:
            return self.first
        if len(self._gaps) < _KNOWN_PACE:
            return self.cap
        return min(self.cap, max(self.floor, self.factor * max(self._gaps)))
