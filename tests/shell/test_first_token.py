"""First tokens judged by what was asked, against the embedded upstream: a model that takes
20 s to its first token, with no history, is left for the fallback at the quick bound when the
request asks for no reasoning — and waited for when it does."""

from __future__ import annotations

import pytest

import streamres
from streamres.upstream import FaultPlan, ModelSpec, Upstream
from tests.helpers.streams import USER, collect

pytestmark = pytest.mark.anyio


def _upstream(first_token: float) -> Upstream:
    """Model "slow" sends only keep-alives for ``first_token`` seconds, then its answer;
    model "fast" answers at once."""
    slow = ModelSpec(faults=FaultPlan("slow@0*4"))
    return Upstream(models={"slow": slow}, stall_seconds=first_token)


def _client(up: Upstream, **kw: object) -> streamres.Client:
    routes = [streamres.Route(m, base_url=up.openai_url, api_key="k") for m in ("slow", "fast")]
    return streamres.Client(routes, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_20_s_first_token_on_a_model_with_no_history_goes_to_the_fallback() -> None:
    """The defaults: a quick request waits 10 s (``quick_first_token_timeout``), not the 60 s
    of ``first_token_timeout``, before the fallback answers."""
    async with _upstream(20.0) as up, _client(up) as client:
        _, _, done = await collect(client.stream(USER, model="slow"))
    assert done.text == up.answer(USER) and done.model == "fast"
    first = done.history[0]
    assert first.model == "slow" and first.outcome == "stall"
    assert first.message == "no output for 10 s"


async def test_a_reasoning_request_waits_for_its_first_token() -> None:
    """The same model asked to reason: no fallback before the long bound — the slow model's
    own answer, at its first attempt."""
    async with _upstream(3.0) as up, _client(up, quick_first_token_timeout=1.0) as client:
        _, _, done = await collect(client.stream(USER, model="slow", reasoning_effort="high"))
    assert done.model == "slow" and done.attempts == 1
    assert [r.model for r in up.requests] == ["slow"]


async def test_a_route_marked_as_a_thinker_waits_too() -> None:
    """``Route(thinks=True)``: every request to it is a reasoning one."""
    async with _upstream(3.0) as up:
        routes = [
            streamres.Route("slow", base_url=up.openai_url, api_key="k", thinks=True),
            streamres.Route("fast", base_url=up.openai_url, api_key="k"),
        ]
        async with streamres.Client(routes, quick_first_token_timeout=1.0) as client:
            _, _, done = await collect(client.stream(USER, model="slow"))
    assert done.model == "slow" and done.attempts == 1


def test_the_fleets_times_to_first_token_are_read_by_kind() -> None:
    """Through shared state each process exports its times by kind; a process that exports
    none (an older one) is read as quick requests."""
    from streamres._fleet.metrics import RouteStats, export
    from streamres._shell.shared.metrics import _ttft_of

    stats = RouteStats()
    stats.started()
    stats.succeeded(ttft=0.4, latency=1.0, kind="quick")
    stats.started()
    stats.succeeded(ttft=20.0, latency=40.0, kind="reasoning")
    older = {"m": {"ttft": [0.7]}}
    got = _ttft_of([{"m": export(stats)}, older])
    assert got == {("m", "quick"): (0.4, 0.7), ("m", "reasoning"): (20.0,)}
