"""Batch work: ``streamres.run_batch`` and ``streamres batch`` — request lines in, one result
line per answer out, resumable after a crash, low priority, paused while its models are jammed."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import streamres
from streamres._core.jobs import Pace, Window, finished, parse_jobs
from streamres.upstream import FaultPlan, ModelSpec, Upstream

pytestmark = pytest.mark.anyio


def _q(i: int) -> str:
    return f"Question {i}: explain TCP slow start."


def _lines(n: int) -> list[str]:
    return [json.dumps({"id": f"q{i}", "prompt": _q(i)}) for i in range(n)]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the lines ------------------------------------------------------------------------------


def test_request_lines_in_both_shapes_and_bad_ones_with_their_numbers() -> None:
    lines = [
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}),
        "",
        json.dumps({"prompt": "no id", "model": "m", "temperature": 0, "stream": True}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"id": "a", "prompt": "again"}),
        json.dumps({"id": "b"}),
        json.dumps(
            {
                "custom_id": "oa",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1},
            }
        ),
        json.dumps({"custom_id": "emb", "url": "/v1/embeddings", "body": {"input": "x"}}),
        json.dumps({"id": True, "prompt": "x"}),
        # an OpenAI line without its custom_id: refused, never answered under an invented id
        json.dumps(
            {
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}]},
            }
        ),
    ]
    jobs, bad = parse_jobs(lines)
    assert [(j.id, j.line, j.model, j.params) for j in jobs] == [
        ("a", 1, None, {"max_tokens": 5}),
        ("line-3", 3, "m", {"temperature": 0}),
        ("oa", 8, "m", {"seed": 1}),
    ]
    assert jobs[1].messages == [{"role": "user", "content": "no id"}]
    expected = [
        (4, "not JSON"),
        (5, "a request is a JSON object, not list"),
        (6, "id 'a' is already used on line 1"),
        (7, 'needs "messages" (a non-empty list) or "prompt" (a string)'),
        (9, "url '/v1/embeddings'"),
        (10, "id must be a non-empty string or an integer, not True"),
        (11, "an OpenAI batch line needs its custom_id"),
    ]
    assert [b.line for b in bad] == [n for n, _ in expected]
    assert all(b.message.startswith(m) for b, (_, m) in zip(bad, expected, strict=True)), bad
    assert str(bad[0]).startswith("line 4: not JSON")


def test_a_results_file_with_a_torn_last_line() -> None:
    lines = ['{"id":"a","ok":true}', '{"id":"b","ok":false}', '{"id":"b","ok":true}', '{"id":"c"']
    records, torn = finished(lines)
    assert sorted(records) == ["a", "b"] and records["b"]["ok"] is True and torn == 1


def test_windows_and_the_pace() -> None:
    night = Window.parse("22:00-08:00")
    assert [night.wait(m) for m in (23 * 60, 7 * 60 + 59, 8 * 60, 21 * 60)] == [0, 0, 840, 60]
    day = Window.parse("09:30-17:00")
    assert (day.wait(9 * 60 + 30), day.wait(17 * 60), day.wait(0)) == (0, 990, 570)
    for bad in ("22-08", "25:00-01:00", "10:00-10:00", "10:61-11:00"):
        with pytest.raises(ValueError, match=r"window is HH:MM|hours go|is empty"):
            Window.parse(bad)
    pace = Pace(8)
    pace.answered(capacity_errors=2)
    pace.answered(capacity_errors=1)
    assert pace.allowed == 2
    for _ in range(3):
        pace.answered(capacity_errors=1)
    assert pace.allowed == 1
    for _ in range(20):
        pace.answered(capacity_errors=0)
    assert pace.allowed == 8


# -- running it -----------------------------------------------------------------------------


async def test_a_batch_answers_every_line_and_a_second_run_sends_nothing(tmp_path: Path) -> None:
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text(
        "\n".join(
            [
                *_lines(12),
                "oops",
                json.dumps({"id": "x", "model": "nope", "prompt": "hi"}),
                json.dumps({"id": "n2", "prompt": "two answers", "n": 2}),  # refused, not dropped
                json.dumps({"id": "own", "prompt": "hi", "priority": "high", "deadline": 30}),
            ]
        )
        + "\n"
    )
    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client([route], account_limits={"acct": 3}) as client:
            first = await streamres.run_batch(client, requests, results)
            sent = len(up.requests)
            again = await streamres.run_batch(client, requests, results)
        recs = {r["id"]: r for r in _records(results)}
        assert all(
            recs[f"q{i}"]["text"] == up.answer([{"role": "user", "content": _q(i)}])
            for i in range(12)
        )
    assert (first.answered, first.failed, first.skipped, first.total) == (13, 2, 0, 15)
    assert [(f[1], f[0]) for f in first.failures] == [(13, ""), (14, "x"), (15, "n2")]
    assert first.failures[2][2].startswith("n=2: streamres streams one answer")
    assert "unknown model 'nope'" in first.failures[1][2] and not first.ok
    assert recs["x"]["ok"] is False and recs["x"]["error"] == "InvalidRequest"
    assert recs["q0"]["finish_reason"] == "stop" and recs["q0"]["model"] == "m"
    # The second run: the twelve answered are skipped, the failed one tried again.
    assert recs["own"]["ok"] is True
    assert (again.answered, again.failed, again.skipped) == (0, 2, 13)
    assert sent == 13 and len(up.requests) == 13


async def test_every_progress_report_adds_up(tmp_path: Path) -> None:
    """Each report's counts agree with one another: done, failed, in flight, waiting and skipped
    make the total, none is negative, and the report that carries an answer no longer counts
    it in flight (the last one: nothing in flight, nothing waiting)."""
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join([*_lines(9), json.dumps({"id": "bad", "prompt": "x", "n": 2})]))
    seen: list[streamres.BatchProgress] = []
    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            await streamres.run_batch(
                client, requests, results, concurrency=3, on_progress=seen.append
            )
    for p in seen:
        counts = (p.done, p.failed, p.in_flight, p.waiting, p.skipped)
        assert min(counts) >= 0 and sum(counts) == p.total, p
    answers = [p for p in seen if p.last is not None]
    assert len(answers) == 10
    assert (answers[-1].done, answers[-1].failed) == (9, 1)
    assert (answers[-1].in_flight, answers[-1].waiting) == (0, 0)


def _openai_line(i: int, **body: Any) -> str:
    """A line of an OpenAI Batch API input file."""
    request = {"model": "m", "messages": [{"role": "user", "content": _q(i)}], **body}
    return json.dumps(
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": request}
    )


async def test_an_openai_batch_file_gets_an_openai_batch_output_file(tmp_path: Path) -> None:
    """Given an OpenAI Batch input file, the results are an OpenAI Batch output file: each line
    ``id``, ``custom_id``, ``response`` (status, request id, the whole ``chat.completion``
    body, which the official SDK's type reads) and ``error``; a refused request has its 4xx
    status and error body. Stopped after four answers and run again, each ``custom_id`` that
    was answered is written once, and the rerun sends only the rest."""
    import openai.types.chat

    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join([*(_openai_line(i) for i in range(8)), _openai_line(8, n=2)]))

    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            with anyio.CancelScope() as scope:  # stopped as Ctrl-C stops it

                def stop_after_four(p: streamres.BatchProgress) -> None:
                    if p.done >= 4:
                        scope.cancel()

                await streamres.run_batch(
                    client, requests, results, concurrency=1, on_progress=stop_after_four
                )
            sent = len(up.requests)
            summary = await streamres.run_batch(client, requests, results)
        assert len(up.requests) - sent == summary.answered == 8 - summary.skipped
        lines = _records(results)
        answered = [r for r in lines if r["response"] and r["response"]["status_code"] == 200]
        assert sorted(r["custom_id"] for r in answered) == [f"r{i}" for i in range(8)]
        for r in answered:
            assert set(r) == {"id", "custom_id", "response", "error"} and r["error"] is None
            body = openai.types.chat.ChatCompletion.model_validate(r["response"]["body"])
            i = int(r["custom_id"][1:])
            want = up.answer([{"role": "user", "content": _q(i)}])
            # The cookbook's own reader of a results file:
            assert r["response"]["body"]["choices"][0]["message"]["content"] == want
            assert body.choices[0].finish_reason == "stop" and body.model == "m"
            assert r["id"].startswith("batch_req_") and body.usage is not None
    # The refused request is in the error file beside the output, as OpenAI writes it.
    assert all(r["response"]["status_code"] == 200 for r in lines)
    (refused,) = _records(tmp_path / "out.errors.jsonl")
    assert summary.errors_file == str(tmp_path / "out.errors.jsonl")
    assert refused["custom_id"] == "r8" and refused["response"]["status_code"] == 400
    assert "n=2" in refused["response"]["body"]["error"]["message"]


async def test_a_batch_with_failures_is_read_by_openais_cookbook_reader(tmp_path: Path) -> None:
    """Failures in the input (refused requests, a server that never answers): the output file
    holds only answers, which the reader OpenAI's cookbook shows reads line by line without a
    KeyError; the failures are in the error file in OpenAI's shapes (a refusal's 4xx body, or
    ``response: null`` with ``error``). Run again with the server well, each failed request
    is tried again and moves to the output: every ``custom_id`` in one file, once."""
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [_openai_line(i) for i in range(6)]
    lines[1] = _openai_line(1, n=2)  # refused by the API: n is not supported
    lines[2], lines[3] = _openai_line(2, model="bad"), _openai_line(3, model="bad")
    requests.write_text("\n".join(lines))
    ok_ids = {f"r{i}" for i in (0, 2, 3, 4, 5)}
    async with Upstream() as dead:
        dead_url = dead.openai_url  # nothing listens there any more
    async with Upstream() as up:
        good = streamres.Route("m", base_url=up.openai_url, api_key="k")
        down = streamres.Route("down", base_url=dead_url, api_key="k")
        async with streamres.Client([good, down], deadline=30) as client:
            # The first run: r1 refused; "bad" is a server that cannot be reached.
            summary = await streamres.run_batch(client, requests, results, models={"bad": ["down"]})
            assert (summary.answered, summary.failed) == (3, 3)
            output = _records(results)
            for json_object in output:  # OpenAI's cookbook, reading the results
                json_object["response"]["body"]["choices"][0]["message"]["content"]
            errors = _records(tmp_path / "out.errors.jsonl")
            assert {e["custom_id"] for e in errors} == {"r1", "r2", "r3"}
            assert {o["custom_id"] for o in output} == ok_ids - {"r2", "r3"}
            no_answer = [e for e in errors if e["custom_id"] in ("r2", "r3")]
            assert all(e["response"] is None and e["error"]["code"] for e in no_answer)
            # The second run, "bad" now the good server: r2 and r3 answered, r1 refused again.
            summary = await streamres.run_batch(client, requests, results, models={"bad": ["m"]})
            assert (summary.answered, summary.failed, summary.skipped) == (2, 1, 3)
    output, errors = _records(results), _records(tmp_path / "out.errors.jsonl")
    assert sorted(o["custom_id"] for o in output) == sorted(ok_ids)
    assert [e["custom_id"] for e in errors] == ["r1"]


async def test_an_anthropic_message_batch_gets_anthropic_result_lines(tmp_path: Path) -> None:
    """Given Anthropic Message Batches requests (``custom_id``, ``params`` with ``system`` and
    ``max_tokens``), each result line is Anthropic's — the official SDK's own type reads every
    one: ``succeeded`` with the whole message, ``errored`` with the API's error response; run
    again, only what did not succeed is sent."""
    from anthropic.types.messages import MessageBatchIndividualResponse

    def line(i: int, **more: Any) -> str:
        params = {"model": "m", "max_tokens": 200, "system": "Be brief.", **more}
        params["messages"] = [{"role": "user", "content": _q(i)}]
        return json.dumps({"custom_id": f"a{i}", "params": params})

    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join([*(line(i) for i in range(3)), line(3, n=2)]))
    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            first = await streamres.run_batch(client, requests, results)
            again = await streamres.run_batch(client, requests, results)
        want = {
            f"a{i}": up.answer(
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": _q(i)}]
            )
            for i in range(3)
        }
    assert (first.answered, first.failed, again.skipped) == (3, 1, 3)
    parsed = [MessageBatchIndividualResponse.model_validate(r) for r in _records(results)]
    done = {p.custom_id: p.result for p in parsed if p.result.type == "succeeded"}
    assert sorted(done) == ["a0", "a1", "a2"]
    for custom_id, result in done.items():
        assert result.type == "succeeded"
        block = result.message.content[0]
        assert block.type == "text" and block.text == want[custom_id]
        assert result.message.stop_reason == "end_turn" and result.message.usage.output_tokens > 0
    refused = [p.result for p in parsed if p.custom_id == "a3"]
    assert len(refused) == 2 and all(r.type == "errored" for r in refused)
    assert refused[0].type == "errored" and refused[0].error.error.type == "invalid_request_error"


async def test_an_interrupted_batch_finishes_exactly_the_missing_ids(tmp_path: Path) -> None:
    """Stopped after five answers (as Ctrl-C would), then run again: every id answered once,
    and the records are those of an uninterrupted run, line for line (sorted by id)."""
    requests = tmp_path / "in.jsonl"
    requests.write_text("\n".join(_lines(20)) + "\n")
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    async with Upstream(token_delay=0.002) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client([route], account_limits={"acct": 4}) as client:
            await streamres.run_batch(client, requests, whole)
            with anyio.CancelScope() as scope:

                def stop_after_five(p: streamres.BatchProgress) -> None:
                    if p.done >= 5:
                        scope.cancel()

                await streamres.run_batch(client, requests, cut, on_progress=stop_after_five)
            partial = {r["id"] for r in _records(cut)}
            assert 5 <= len(partial) < 20
            rest = await streamres.run_batch(client, requests, cut)
    assert rest.skipped == len(partial) and rest.answered == 20 - len(partial)
    ids = [r["id"] for r in _records(cut)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(20))  # none twice
    by_id = sorted(cut.read_text().splitlines())
    assert by_id == sorted(whole.read_text().splitlines())


async def test_a_batch_through_the_storm_is_exact(tmp_path: Path) -> None:
    """200 requests, a seeded sustained storm on the model (refusals, breaks, stalls): every
    answer exact; the upstream requests per answer reported."""
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join(_lines(200)) + "\n")
    plan = FaultPlan.storm(connect=0.15, midstream=0.15, stall=0.02, seed=7)
    async with Upstream(models={"m": ModelSpec(faults=plan)}, ping_interval=0.05) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client(
            [route],
            account_limits={"acct": 16},
            stall_timeout=0.5,
            breaker_threshold=1000,
            backoff=streamres.Backoff(initial=0.01, maximum=0.05),
            # Room for the storm's retries: the default budget (10 banked, 1 a second) would
            # rightly slow this batch to the pace of its refill.
            retry_budget=streamres.RetryBudget(cap=1000, balance=1000),
        ) as client:
            summary = await streamres.run_batch(client, requests, results, when="always")
        recs = _records(results)
        exact = sum(
            r["ok"] and r["text"] == up.answer([{"role": "user", "content": _q(int(r["id"][1:]))}])
            for r in recs
        )
        per_answer = len(up.requests) / 200
    print(f"storm: {exact}/200 exact, {per_answer:.2f} upstream requests per answer")
    assert summary.answered == 200 and exact == 200
    assert summary.retries + summary.resumes > 0  # the storm did hit


async def test_a_batch_pauses_while_its_model_is_jammed(tmp_path: Path) -> None:
    """The model refuses everything for a while: once it is jammed, the batch keeps one answer
    in flight (the one that finds out when health returns), says it paused, and resumes."""
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join(_lines(12)) + "\n")
    seen: list[streamres.BatchProgress] = []
    async with Upstream(models={"m": ModelSpec(faults=FaultPlan("529*10"))}) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client(
            [route],
            breaker_threshold=3,
            breaker_recovery=0.2,
            backoff=streamres.Backoff(initial=0.01, maximum=0.05),
            deadline=60,
        ) as client:
            summary = await streamres.run_batch(
                client, requests, results, concurrency=6, on_progress=seen.append
            )
    assert summary.answered == 12
    paused = [p for p in seen if p.paused]
    assert paused and "jammed" in paused[0].paused
    # While paused, an answer starts only when none is in flight.
    starts = [(a, b) for a, b in itertools.pairwise(seen) if b.paused and b.in_flight > a.in_flight]
    assert starts and all(a.in_flight == 0 for a, _ in starts), starts
    assert seen[-1].paused == ""  # resumed


async def test_a_person_is_served_before_the_batch_waiting_for_the_same_account(
    tmp_path: Path,
) -> None:
    """A batch saturates an account of two slots; a chat answer arriving mid-batch is the next
    request the upstream sees once a slot frees (the batch runs at low priority)."""
    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join(_lines(10)) + "\n")
    async with Upstream(token_delay=0.005, words=30) as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k", account="acct")
        async with streamres.Client([route], account_limits={"acct": 2}) as client:
            limits = client._limits
            assert limits is not None
            chat_at: list[int] = []

            async def person() -> None:
                with anyio.fail_after(30):
                    while len(up.requests) < 4:  # mid-batch
                        await anyio.lowlevel.checkpoint()
                sent = len(up.requests)
                async for _ in client.stream([{"role": "user", "content": "chat"}], model="m"):
                    pass
                chat_at.append(sent)

            async with anyio.create_task_group() as tg:
                tg.start_soon(person)
                await streamres.run_batch(client, requests, results, concurrency=4)
    asked = [str(r.body["messages"][-1]["content"]) for r in up.requests]
    # When the person asked, two batch answers streamed and two more waited for a slot
    # (concurrency 4 on 2 slots): the person's request is the very next one the upstream saw.
    assert asked.index("chat") == chat_at[0], asked


# -- the command ----------------------------------------------------------------------------


def _batch(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "streamres", "batch", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _same_answers(lines: list[str]) -> list[tuple[str, str]]:
    """An OpenAI Batch output file's answers by ``custom_id``, each line read by the official
    SDK's type (the line's ``id`` and the completion's ``id`` and time are its own)."""
    import openai.types.chat

    answers = []
    for line in lines:
        record = json.loads(line)
        body = openai.types.chat.ChatCompletion.model_validate(record["response"]["body"])
        answers.append((record["custom_id"], body.choices[0].message.content or ""))
    return sorted(answers)


@pytest.mark.parametrize("shape", ["streamres", "openai"])
def test_a_killed_batch_run_again_finishes_the_rest(tmp_path: Path, shape: str) -> None:
    """``streamres batch`` killed (SIGKILL) after a few answers, then the same command: every
    id answered exactly once, the records those of an uninterrupted run (sorted by id) — for
    streamres's own file, and for an OpenAI Batch input file (its output file: each
    ``custom_id`` once, the same answers)."""
    lines = (
        _lines(30)
        if shape == "streamres"
        else [_openai_line(i, model="demo-large") for i in range(30)]
    )
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    args = ("in.jsonl", "--faults", "none", "--token-delay", "0.003", "--account-limit", "3")
    whole = _batch(*args, "-o", "whole.jsonl", cwd=tmp_path)
    out, err = whole.communicate(timeout=120)
    assert whole.returncode == 0, err
    assert "30 answered, 0 failed" in out
    with _batch(*args, "-o", "cut.jsonl", cwd=tmp_path) as run:
        assert run.stderr is not None
        for line in run.stderr:  # one plain line per answer (not a terminal)
            if line.startswith("[ 6/30]"):
                run.send_signal(signal.SIGKILL)
                break
        run.wait(timeout=60)
    partial = _records(tmp_path / "cut.jsonl")
    assert 6 <= len(partial) < 30
    again = _batch(*args, "-o", "cut.jsonl", cwd=tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert f"{30 - len(partial)} answered, 0 failed, {len(partial)} already done, of 30" in out
    cut = (tmp_path / "cut.jsonl").read_text().splitlines()
    assert len(cut) == 30
    whole_lines = (tmp_path / "whole.jsonl").read_text().splitlines()
    if shape == "streamres":
        assert sorted(cut) == sorted(whole_lines)
    else:
        assert _same_answers(cut) == _same_answers(whole_lines)
        assert len({json.loads(line)["custom_id"] for line in cut}) == 30


def test_the_command_lists_bad_lines_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("\n".join([*_lines(3), "{oops", '{"id": "q9"}']) + "\n")
    run = _batch("in.jsonl", "-o", "out.jsonl", "--faults", "none", cwd=tmp_path)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 1
    assert "3 answered, 0 failed" in out
    assert "line 4: not JSON" in out and 'line 5: needs "messages"' in out
    missing = _batch("nothere.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2 and "cannot read the requests 'nothere.jsonl'" in err
    bad = _batch("in.jsonl", "-o", "o.jsonl", "--window", "25:00-1", cwd=tmp_path)
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "HH:MM-HH:MM" in err and "Traceback" not in err


async def test_a_window_holds_new_work_until_it_opens(tmp_path: Path) -> None:
    """Outside ``--window`` the batch says it waits and sends nothing; once the clock is in the
    window, it runs."""
    import time as _time

    requests, results = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text("\n".join(_lines(3)) + "\n")
    day = _time.localtime()
    before = _time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 1, 59, 0, 0, 0, -1))
    now = [before]
    seen: list[streamres.BatchProgress] = []

    def progress(p: streamres.BatchProgress) -> None:
        seen.append(p)
        if p.paused.startswith("outside the window"):
            now[0] = before + 30 * 60  # 02:29: the window is open

    async with Upstream() as up:
        route = streamres.Route("m", base_url=up.openai_url, api_key="k")
        async with streamres.Client([route]) as client:
            summary = await streamres.run_batch(
                client,
                requests,
                results,
                window="02:00-03:00",
                on_progress=progress,
                clock=lambda: now[0],
            )
            paused = next(p for p in seen if p.paused)
            assert paused.paused == "outside the window (opens in 1 min)"
            assert paused.in_flight == 0 and len(up.requests) == 3
    assert summary.answered == 3
