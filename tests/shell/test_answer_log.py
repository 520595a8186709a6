"""An answer picked up again: the answer log's readers, and ``continue_from``."""

from __future__ import annotations

import anyio
import pytest

import streamres
from streamres.upstream import FaultPlan, ModelSpec, Upstream

pytestmark = pytest.mark.anyio

Q = [{"role": "user", "content": "How do rivers carve valleys?"}]


async def test_continue_from_asks_only_for_the_rest() -> None:
    """Given the first part of an answer, the events carry only the rest, the done event the
    whole answer — exact — and the request asked the model to continue that part."""
    async with Upstream(token_delay=0) as up:
        whole = up.answer(Q)
        part = whole[: len(whole) // 3]
        got: list[str] = []
        done = None
        async with streamres.stream_resilient(
            Q, model="m", base_url=up.openai_url, api_key="k", continue_from=part
        ) as events:
            async for ev in events:
                if ev.type == "text":
                    got.append(ev.text)
                elif ev.type == "done":
                    done = ev
        assert done is not None and done.text == whole
        assert part + "".join(got) == whole
        assert part[-20:] in str(up.requests[0].body["messages"])


async def test_continue_from_through_a_client_is_never_served_from_the_cache() -> None:
    """With a cache, an answer continued from its part is its own request: not the cached
    whole answer, not joined with another."""
    async with (
        Upstream(token_delay=0) as up,
        streamres.Client(
            routes=[streamres.Route("m", base_url=up.openai_url, api_key="k")],
            cache=streamres.Cache(ttl=60),
        ) as client,
    ):
        whole = up.answer(Q)
        async with client.stream(Q) as events:
            assert [ev async for ev in events][-1].type == "done"
        part = whole[:40]
        async with client.stream(Q, continue_from=part) as events:
            rest = "".join([ev.text async for ev in events if ev.type == "text"])
        assert part + rest == whole
        assert len(up.requests) == 2


async def test_continue_from_needs_a_users_turn_to_continue() -> None:
    with pytest.raises(streamres.InvalidRequest, match="continue_from"):
        streamres.stream_resilient(
            [*Q, {"role": "assistant", "content": "Rivers"}],
            model="m",
            base_url="http://127.0.0.1:9/v1",
            continue_from="Rivers",
        )
    with pytest.raises(streamres.InvalidRequest, match="continue_from must be a string"):
        streamres.stream_resilient(
            Q,
            model="m",
            base_url="http://127.0.0.1:9/v1",
            continue_from=3,  # type: ignore[arg-type]
        )


async def test_readers_of_an_answer_log_come_and_go() -> None:
    """One answer, recorded through faults: a reader from the start and one that comes late
    (after event n) each get every event once, in order; a reader after the end gets the
    rest at once; the log's text is the answer."""
    models = {"m": ModelSpec(faults=FaultPlan("reset@30,503"))}
    async with Upstream(models=models, token_delay=0.001) as up:
        log = streamres.AnswerLog()
        seen: dict[str, list[int]] = {"early": [], "late": []}

        async def read(name: str, after: int) -> None:
            async for n, _ in log.follow(after):
                seen[name].append(n)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "early", -1)
            stream = streamres.stream_resilient(Q, model="m", base_url=up.openai_url, api_key="k")
            tg.start_soon(log.record, stream)
            await log.changed(4)  # five events are in
            tg.start_soon(read, "late", 2)
        assert log.status == "completed"
        assert seen["early"] == list(range(len(log.events)))
        assert seen["late"] == list(range(3, len(log.events)))
        assert log.text == up.answer(Q)
        after = [n async for n, _ in log.follow(len(log.events) - 2)]
        assert after == [len(log.events) - 1]


async def test_a_failed_answer_ends_its_log_with_the_error_and_the_partial() -> None:
    models = {"m": ModelSpec(faults=FaultPlan("400"))}
    async with Upstream(models=models) as up:
        log = streamres.AnswerLog()
        await log.record(
            streamres.stream_resilient(Q, model="m", base_url=up.openai_url, api_key="k")
        )
        assert log.status == "failed" and isinstance(log.error, streamres.StreamError)
        assert [ev async for ev in log.follow()] == []
