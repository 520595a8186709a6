"""Any plan of faults, on either provider and any continuation behaviour, ends in the exact
answer (hypothesis draws the plans; real loopback HTTP)."""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamres
from streamres.upstream import Upstream
from tests.helpers.streams import USER

MIDSTREAM = ["error", "reset", "truncate", "done-no-finish", "malformed", "stall"]
CONNECT = ["429:retry-after=0.01", "503", "529", "500:overloaded", "502", "empty"]

fault = st.one_of(
    st.sampled_from(CONNECT),
    st.builds(lambda k, n: f"{k}@{n}", st.sampled_from(MIDSTREAM), st.integers(0, 120)),
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(fault, min_size=1, max_size=4),
    provider=st.sampled_from(["openai", "anthropic", "openai-responses"]),
    behaviour=st.sampled_from(
        [{}, {"instruct": "restart"}, {"instruct": "preamble"}, {"instruct": "exact"}]
    ),
)
def test_any_fault_plan_ends_in_the_exact_answer(
    plan: list[str], provider: str, behaviour: dict[str, Any]
) -> None:
    """Whatever breaks, in whatever order, the caller gets the upstream's text exactly once."""

    async def main() -> None:
        async with Upstream(faults=",".join(plan), ping_interval=0.02, **behaviour) as up:
            base = up.anthropic_url if provider == "anthropic" else up.openai_url
            text = ""
            async for ev in streamres.stream_resilient(
                USER,
                model="m",
                base_url=base,
                api_key="k",
                provider=provider,  # type: ignore[arg-type]
                stall_timeout=0.2,
                backoff=streamres.Backoff(initial=0.001, maximum=0.005),
            ):
                if ev.type == "text":
                    text += ev.text
                elif ev.type == "done":
                    assert ev.text == text
            assert text == up.answer(USER), (plan, provider, behaviour)

    anyio.run(main)
