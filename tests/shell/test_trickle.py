"""Pace, not only silence: a stream that keeps trickling far below its pace floor is moved on
to the next model, continued from what was delivered, the reason in its status event."""

from __future__ import annotations

import pytest

import streamres
from streamres.upstream import ModelSpec, Upstream
from tests.helpers.streams import USER, collect

pytestmark = pytest.mark.anyio


def _routes(up: Upstream) -> list[streamres.Route]:
    return [streamres.Route(m, base_url=up.openai_url, api_key="k") for m in ("slow", "fast")]


async def test_a_trickle_below_the_absolute_floor_moves_on() -> None:
    """Five tokens a second against a floor of twenty, judged over a second: the answer goes
    on on the next model, exact, and says why."""
    floor = streamres.PaceFloor(relative=None, absolute=20.0, window=1.0)
    async with (
        Upstream(models={"slow": ModelSpec(token_delay=0.2)}) as up,
        streamres.Client(_routes(up), pace_floor=floor) as client,
    ):
        _, events, done = await collect(client.stream(USER, model="slow"))
    assert done.text == up.answer(USER) and done.model == "fast"
    moved = [e for e in events if e.type in ("resume", "fallback")]
    assert moved and all(getattr(e, "reason", "slow") == "slow" for e in moved)
    assert done.history[0].outcome == "slow" and "below its floor of 20" in done.history[0].message


async def test_a_model_slower_than_its_own_pace_moves_on() -> None:
    """The model's pace is learnt from its answers; when it then streams at a small share of
    it, the relative floor moves the answer on."""
    # 0.006 s a token: an answer streams for ~0.7 s, past the half second an attempt must
    # stream for its pace to be learnt, on a fast machine too (0.004 s came in just under).
    spec = ModelSpec(token_delay=0.006)
    async with Upstream(models={"slow": spec}) as up:
        floor = streamres.PaceFloor(relative=0.25, window=1.0)
        async with streamres.Client(_routes(up), pace_floor=floor) as client:
            for _ in range(5):  # learnt: a few hundred tokens a second
                assert (await collect(client.stream(USER, model="slow")))[2].model == "slow"
            spec.token_delay = 0.1  # now ten a second
            _, _, done = await collect(client.stream(USER, model="slow"))
    assert done.text == up.answer(USER) and done.model == "fast"
    assert done.history[0].outcome == "slow"


async def test_without_a_floor_a_trickle_is_waited_on() -> None:
    """Opt-in: the default waits on a stream that produces, however slowly."""
    async with (
        Upstream(models={"slow": ModelSpec(token_delay=0.02)}, words=30) as up,
        streamres.Client(_routes(up)) as client,
    ):
        _, _, done = await collect(client.stream(USER, model="slow"))
    assert done.model == "slow" and done.attempts == 1


def test_the_proxy_reads_a_pace_floor_from_its_policy() -> None:
    from streamres.proxy.config import ConfigError, parse

    routes = [{"model": "m", "base_url": "http://127.0.0.1:9/v1"}]
    got = parse({"routes": routes, "policy": {"pace_floor": {"relative": 0.3}}}, {})
    assert got.pace_floor == streamres.PaceFloor(relative=0.3)
    assert got.client_options()["pace_floor"] == got.pace_floor
    assert parse({"routes": routes}, {}).pace_floor is None
    with pytest.raises(ConfigError, match="did you mean 'window'"):
        parse({"routes": routes, "policy": {"pace_floor": {"windw": 3}}}, {})
