"""First tokens judged by what was asked: a request's kind (``stall.request_kind``), the wait
for its first output with no history (quick: ``QUICK_FIRST``; reasoning: the whole
``first_token_timeout``), a route's own bound, and limits learnt per model *and* kind."""

from __future__ import annotations

from typing import Any

import pytest

from streamres._answer.actions import Send
from streamres._answer.machine import Answer
from streamres._answer.options import resolve_route
from streamres._core.stall import QUICK_FIRST, first_output_limit, request_kind
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route
from tests.core.test_machine import options


@pytest.mark.parametrize(
    ("body", "model", "thinks", "kind"),
    [
        ({}, "gpt-4o-mini", None, "quick"),
        ({"reasoning_effort": "high"}, "gpt-4o-mini", None, "reasoning"),
        ({"reasoning": {"effort": "medium"}}, "m", None, "reasoning"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "claude-x", None, "reasoning"),
        ({"thinking": {"type": "disabled"}}, "claude-x", None, "quick"),
        ({"chat_template_kwargs": {"enable_thinking": True}}, "qwen3", None, "reasoning"),
        ({}, "o3-mini", None, "reasoning"),
        ({}, "openai/o4-mini", None, "reasoning"),
        ({}, "deepseek-reasoner", None, "reasoning"),
        ({}, "deepseek-r1:7b", None, "reasoning"),
        ({}, "qwq-32b", None, "reasoning"),
        ({"reasoning_effort": "minimal"}, "gpt-5", None, "quick"),  # the effort turned down
        ({}, "gpt-5", None, "reasoning"),
        ({}, "my-local-model", True, "reasoning"),  # the route says so
        ({}, "o3-mini", False, "quick"),
    ],
)
def test_a_requests_kind_is_what_it_asks(
    body: dict[str, Any], model: str, thinks: bool | None, kind: str
) -> None:
    assert request_kind(body, model, thinks) == kind


def test_with_no_history_a_quick_request_gets_the_quick_bound_a_reasoning_one_the_ceiling() -> None:
    assert first_output_limit([], 60.0, quick=QUICK_FIRST) == QUICK_FIRST
    assert first_output_limit([], 60.0) == 60.0
    assert first_output_limit([], 5.0, quick=QUICK_FIRST) == 5.0  # never above the ceiling
    assert first_output_limit([0.5] * 5, 60.0, quick=QUICK_FIRST) == 8.0  # learnt: the floor


def _first_wait(routes: list[Route], fleet: Fleet | None = None, **kw: Any) -> float:
    """The first attempt's first-output wait, as the machine set it when it sent."""
    resolved = [resolve_route(r) for r in routes]
    fleet = fleet or Fleet(resolved, breaker_threshold=1_000_000_000)
    m = Answer(options(len(routes), fleet=fleet, **kw), now=0.0)
    act = m.start_answer(0.0)
    assert isinstance(act, Send)
    return m.stall.first


def _routes(n: int = 2, **first: Any) -> list[Route]:
    return [
        Route(f"m{i}", base_url="http://upstream.test/v1", api_key="k", **(first if i == 0 else {}))
        for i in range(n)
    ]


def test_the_machine_waits_by_the_kind_of_request() -> None:
    """With another model to go to and no history: quick 10 s, reasoning 60 s; alone, 60 s
    whatever is asked (nothing to fail over to)."""
    assert _first_wait(_routes()) == QUICK_FIRST
    assert _first_wait(_routes(), more={"reasoning_effort": "high"}) == 60.0
    assert _first_wait(_routes(thinks=True)) == 60.0
    assert _first_wait(_routes(1)) == 60.0
    assert _first_wait(_routes(), quick_first_token_timeout=3.0) == 3.0


def test_a_routes_own_bound_wins_for_every_request() -> None:
    assert _first_wait(_routes(first_token_timeout=30.0)) == 30.0
    assert _first_wait(_routes(first_token_timeout=30.0), more={"reasoning_effort": "high"}) == 30.0
    assert _first_wait(_routes(1, first_token_timeout=90.0)) == 90.0


def test_limits_are_learnt_per_kind() -> None:
    """Five quick answers in half a second teach the quick limit (8 s, the floor); a reasoning
    request to the same model is not cut at it — it waits its own bound until reasoning
    requests have taught one."""
    routes = [resolve_route(r) for r in _routes()]
    fleet = Fleet(routes, breaker_threshold=1_000_000_000)
    for _ in range(5):
        fleet.succeeded(0, 0.0, ttft=0.5, latency=1.0, asked="quick")
    assert _first_wait(routes, fleet) == 8.0
    assert _first_wait(routes, fleet, more={"reasoning_effort": "high"}) == 60.0
    for _ in range(5):
        fleet.succeeded(0, 0.0, ttft=12.0, latency=30.0, asked="reasoning")
    assert _first_wait(routes, fleet, more={"reasoning_effort": "high"}) == 48.0  # 4 × p95
    assert fleet.ttft_samples(0, "quick") == [0.5] * 5
