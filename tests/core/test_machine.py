"""The answer's state machine without sockets: scripted facts on a fake clock.

A small driver plays the shell: it performs each action the machine asks for against a
scripted server (one plan per request), advancing a fake clock instead of sleeping, and
feeds back the facts. Every resume, retry, fallback and give-up path runs this way in
microseconds; hypothesis generates whole fault plans.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamres import (
    DeadlineExceeded,
    DoneEvent,
    Event,
    FallbackEvent,
    RequestRejected,
    ResumeEvent,
    RetryEvent,
    TextEvent,
    ToolCallEvent,
)
from streamres._answer.machine import (
    READ,
    Acquire,
    Answer,
    Count,
    Fail,
    Finish,
    Load,
    ReadBody,
    Send,
    Wait,
)
from streamres._answer.options import Options, check_options, resolve_route
from streamres._core.classify import Failure, failure
from streamres._core.tokens import approximate_tokens
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route

FULL = (
    "TCP slow start doubles the congestion window every round trip until a loss or the "
    "threshold. Then congestion avoidance grows it by one segment per round trip. "
)
WORDS = re.findall(r"\S+\s*", FULL)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text_chunk(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


FINISH = (
    sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + b"data: [DONE]\n\n"
)
SSE_HEADERS = {"content-type": "text/event-stream"}


@dataclass
class Plan:
    """What the server does with one request."""

    # ok | capacity | at_capacity | rejected | connect | busy | drop | stall | malformed |
    # truncate
    kind: str = "ok"
    after: int = 0  # words sent before a mid-stream fault
    gap: float = 0.05  # seconds between words
    reads: list[tuple[float, bytes | None]] = field(default_factory=list)  # raw script


@dataclass
class Run:
    events: list[Event]
    end: Finish | Fail
    requests: list[Send]
    t: float
    #: The fake time at which each event came out.
    times: list[float] = field(default_factory=list)
    #: Characters each ``Count`` counted off the event loop.
    counts: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextEvent))

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


def options(
    models: int = 1,
    *,
    deadline: float = 60.0,
    fleet: Fleet | None = None,
    continuation: str = "prefill",
    **kw: Any,
) -> Options:
    routes = [
        resolve_route(
            Route(
                f"m{i}",
                provider="openai",
                base_url="http://upstream.test/v1",
                api_key="sk-test",
                name=f"m{i}#{i}",
                continuation=continuation,  # type: ignore[arg-type]
            )
        )
        for i in range(models)
    ]
    fleet = fleet or Fleet(routes, breaker_threshold=1_000_000_000)
    args: dict[str, Any] = {
        "stall_timeout": None,
        "first_token_timeout": 60.0,
        "max_tokens": None,
        "max_attempts": None,
        "backoff": None,
        "fallback_after": 2,
        "headers": None,
        "more": {},
        "rng": random.Random(7),
        "read_limits": None,
    }
    args.update(kw)
    return check_options(
        [{"role": "user", "content": "Explain TCP slow start."}],
        fleet=fleet,
        chain=range(len(fleet.routes)),
        deadline=deadline,
        **args,
    )


def continued_from(send: Send) -> str:
    """The partial answer a continuation request carries (prefill: the last message)."""
    last = send.request.body["messages"][-1]
    return str(last["content"]) if last["role"] == "assistant" else ""


def script(plan: Plan, start: str, t: float) -> list[tuple[float, bytes | None]]:
    """The reads of a streaming plan: (time, bytes), ``None`` bytes for the end of the body."""
    if plan.reads:
        return [(t + dt, data) for dt, data in plan.reads]
    words = re.findall(r"\S+\s*", FULL[len(start) :])
    out: list[tuple[float, bytes | None]] = []
    for i, w in enumerate(words):
        if plan.kind != "ok" and i >= plan.after:
            break
        t += plan.gap
        out.append((t, text_chunk(w)))
    if plan.kind == "ok":
        out.append((t, FINISH))
    elif plan.kind == "malformed":
        out.append((t, b"data: {not json\n\n"))
    elif plan.kind == "drop":
        out.append((t, b"DROP"))
    elif plan.kind == "truncate":
        pass  # the end of the body, with no finish and no terminator
    elif plan.kind == "stall":
        out.append((t + 1e9, None))
    if plan.kind != "stall":
        out.append((t, None))
    return out


def drive(
    m: Answer, plans: list[Plan], *, t: float = 0.0, max_steps: int = 10_000, late: float = 0.0
) -> Run:
    """Play the shell against scripted plans (``ok`` once they run out); ``late``: how late
    the shell's loop runs when its read timer fires."""
    events: list[Event] = []
    times: list[float] = []
    sends: list[Send] = []
    reads: list[tuple[float, bytes | None]] = []
    counts: list[int] = []  # characters counted off the loop, one entry per Count
    body = b""
    act: object = m.start_answer(t)
    for _ in range(max_steps):
        events += m.events
        times += [t] * len(m.events)
        m.events = []
        if isinstance(act, Finish | Fail):
            return Run(events, act, sends, t, times, counts)
        if act is READ:
            at, data = reads.pop(0)
            if at > m.read_deadline:
                t = max(t, m.read_deadline)
                act = m.timed_out(t, late=late)
                if act is READ:  # waited out again: the read is still to come
                    reads.insert(0, (at, data))
                else:
                    reads = []
            elif data == b"DROP":
                t = max(t, at)
                act = m.read_failed(failure("connection", "connection lost mid-response"), t)
            elif data is None:
                t = max(t, at)
                act = m.eof(t)
            else:
                t = max(t, at)
                act = m.data(data, t)
        elif isinstance(act, Wait):
            t = max(t, act.until)
            act = m.woke(t)
        elif isinstance(act, Acquire):
            act = m.acquired(True, t, queued=0.0)
        elif isinstance(act, Load):
            act = m.loaded("approximate", approximate_tokens, t)
        elif isinstance(act, Count):
            counts.append(act.ledger.pending)
            act.ledger.settle()
            act = m.counted(t)
        elif isinstance(act, ReadBody):
            act = m.body(body, min(t, act.until), wall=0.0)
        elif isinstance(act, Send):
            sends.append(act)
            plan = plans[len(sends) - 1] if len(sends) <= len(plans) else Plan()
            if t + 0.01 >= act.until:  # the header wait is bounded by the deadline
                t = act.until
                fail = failure("deadline", "no response headers before the deadline")
                act = m.send_failed(fail, t, queued=0.0)
                continue
            t += 0.01
            if plan.kind == "connect":
                fail = Failure("connection", "Cannot reach it — connection refused", connect=True)
                act = m.send_failed(fail, t, queued=0.0)
            elif plan.kind in ("busy", "connect_timeout"):  # busy: the loop ran 2 s late
                fail = Failure(
                    "connection",
                    "Cannot reach it — timed out",
                    connect=True,
                    error_type="connect_timeout",
                )
                act = m.send_failed(fail, t, queued=0.0, late=2.0 * (plan.kind == "busy"))
            elif plan.kind in ("capacity", "at_capacity", "rejected"):
                status, body = {
                    "capacity": (529, b'{"error":{"type":"overloaded_error","message":"busy"}}'),
                    "at_capacity": (
                        503,
                        b'{"error":{"message":"Selected model is at capacity. '
                        b'Please try a different model."}}',
                    ),
                    "rejected": (400, b'{"error":{"message":"bad request","type":"invalid"}}'),
                }[plan.kind]
                act = m.started(status, {"content-type": "application/json"}, t, queued=0.0)
            else:
                reads = script(plan, continued_from(act), t)
                act = m.started(200, SSE_HEADERS, t, queued=0.0)
        else:
            raise AssertionError(f"unexpected action {act!r}")
    raise AssertionError("the machine did not finish")


def answer(opts: Options | None = None, **kw: Any) -> Answer:
    return Answer(opts or options(**kw), now=0.0)


# -- the paths -------------------------------------------------------------------------------


def test_a_clean_answer_is_one_request_and_one_done() -> None:
    """No fault: one request, the text as sent, and a done event that says so."""
    run = drive(answer(), [Plan()])
    assert isinstance(run.end, Finish)
    assert run.text == FULL
    (done,) = run.of(DoneEvent)
    assert (done.text, done.attempts, done.resumes, done.finish_reason) == (FULL, 1, 0, "stop")


def test_a_drop_mid_answer_resumes_from_the_delivered_text() -> None:
    """A connection lost after five words: one resume whose request carries those words, and
    the answer goes on without repeating or losing one."""
    run = drive(answer(), [Plan("drop", after=5)])
    assert run.text == FULL
    assert continued_from(run.requests[1]) == "".join(WORDS[:5])
    (resume,) = run.of(ResumeEvent)
    assert resume.reason == "connection"
    assert run.of(DoneEvent)[0].resumes == 1


def test_a_continuation_that_writes_none_of_the_held_back_token_is_asked_again_whole() -> None:
    """Chinese cut after "摆动": the instruct request leaves "动" out (its repeat is then
    provable); the model goes another way from "摆" — nothing of that is shown, and at once
    the whole partial is asked again (in the quoting wording), not charged to the model."""

    def chunks(*texts: str) -> list[tuple[float, bytes | None]]:
        return [(0.01 * i, text_chunk(t)) for i, t in enumerate(texts, 1)]

    first = Plan(reads=[*chunks("沿着", "一条", "直线", "摆", "动"), (0.06, b"DROP")])
    other_way = Plan(reads=[*chunks("放在桌上，", "然后离开。"), (0.03, FINISH), (0.03, None)])
    rest = Plan(reads=[*chunks("，角度", "表示太阳。"), (0.03, FINISH), (0.03, None)])
    m = answer(continuation="instruct")
    run = drive(m, [first, other_way, rest])
    assert run.text == "沿着一条直线摆动，角度表示太阳。"
    sent = [r.request.body["messages"] for r in run.requests[1:]]
    assert sent[0][-2] == {"role": "assistant", "content": "沿着一条直线摆"}
    assert sent[1][-2] == {"role": "assistant", "content": "沿着一条直线摆动"}
    assert "结尾是：«沿着一条直线摆动»" in sent[1][-1]["content"]  # asked in the answer's language
    (done,) = run.of(DoneEvent)
    outcomes = [(a.outcome, a.chars) for a in done.history]
    assert outcomes == [("connection", 8), ("ended_at_seam", 0), ("ok", 8)]
    assert done.complete and m.fleet.states[0].breaker.state == "closed"
    assert run.t < 1.0  # asked again at once: no backoff
    # The model does not continue what it is shown: the next answer's resume is sent whole.
    again = Answer(m.opts, now=0.0, memory=m.memory)
    first = Plan(reads=[*chunks("沿着", "一条", "直线", "摆", "动"), (0.06, b"DROP")])
    run = drive(again, [first, rest])
    assert run.text == "沿着一条直线摆动，角度表示太阳。" and len(run.requests) == 2
    assert run.requests[1].request.body["messages"][-2]["content"] == "沿着一条直线摆动"


def test_capacity_before_any_text_is_retried_with_backoff() -> None:
    """Two 529s, then an answer: two retry events with growing delays, the clock moved by them."""
    run = drive(answer(), [Plan("capacity"), Plan("capacity")])
    retries = run.of(RetryEvent)
    assert [r.reason for r in retries] == ["capacity", "capacity"]
    assert retries[0].delay > 0 and run.t >= sum(r.delay for r in retries)
    assert run.text == FULL


def test_at_capacity_moves_to_the_next_model_at_once() -> None:
    """ "Selected model is at capacity" on a chain of two: the second model, with no wait."""
    run = drive(answer(models=2), [Plan("at_capacity")])
    (fb,) = run.of(FallbackEvent)
    assert (fb.from_model, fb.to_model) == ("m0", "m1")
    assert run.requests[1].request.body["model"] == "m1"
    assert not run.of(RetryEvent) and run.text == FULL


def test_repeated_drops_switch_model_after_fallback_after_failures() -> None:
    """Two failures before any text on the first model: the third request goes to the second."""
    run = drive(answer(models=2), [Plan("drop"), Plan("drop")])
    assert [s.request.body["model"] for s in run.requests] == ["m0", "m0", "m1"]


def test_a_rejected_request_is_never_retried() -> None:
    """A 400: one request, RequestRejected naming the model."""
    run = drive(answer(), [Plan("rejected")])
    assert isinstance(run.end, Fail) and isinstance(run.end.error, RequestRejected)
    assert len(run.requests) == 1 and "m0 refused" in str(run.end.error)


def test_a_stall_ends_the_attempt_at_the_stall_limit_then_resumes() -> None:
    """Silence after three words: the attempt ends when the stall limit passes (not later),
    and the answer resumes."""
    run = drive(answer(stall_timeout=2.0), [Plan("stall", after=3)])
    resume = run.of(ResumeEvent)[0]
    assert resume.reason == "stall"
    assert run.text == FULL


def test_the_deadline_is_kept_during_a_read() -> None:
    """A stream that goes silent with a stall limit beyond the deadline: the answer ends at the
    deadline, not at the stall limit, with the words delivered kept."""
    m = answer(deadline=1.0, stall_timeout=30.0)
    run = drive(m, [Plan("stall", after=3)])
    assert isinstance(run.end, Fail) and isinstance(run.end.error, DeadlineExceeded)
    assert run.t <= 1.0 + 1e-9
    assert run.end.error.partial_text == "".join(WORDS[:3])


def test_the_deadline_bounds_the_header_wait() -> None:
    """The Send action carries the deadline as the header wait's bound."""
    m = answer(deadline=1.5)
    act = m.start_answer(0.0)
    assert isinstance(act, Send) and act.until == 1.5


def test_a_malformed_chunk_mid_answer_is_resumed() -> None:
    """Unparsable data after four words: resumed as malformed, the answer exact."""
    run = drive(answer(), [Plan("malformed", after=4)])
    assert run.of(ResumeEvent)[0].reason == "malformed" and run.text == FULL


def test_max_attempts_gives_up_with_the_partial_answer() -> None:
    """A cap of two attempts and two drops: AttemptsExhausted carrying the words delivered."""
    run = drive(answer(max_attempts=2), [Plan("drop", after=2), Plan("drop", after=2)])
    assert isinstance(run.end, Fail)
    assert run.end.error.partial_text == "".join(WORDS[:4])
    assert type(run.end.error).__name__ == "AttemptsExhausted"


# -- what the loopback suite could not catch -------------------------------------------------


def _held_head(ping: bool) -> float:
    """An instruct resume whose head occurs inside a word of the answer (it may be a repeat,
    so it is held; not from a point a model restarts at, so its hold is bounded in time),
    with or without a keep-alive comment at 5 s; the rest at 9 s. Returns when the head came
    out, after the resume."""
    m = answer(continuation="instruct", stall_timeout=30.0)
    head, rest = "low st", "window every round trip."
    second: list[tuple[float, bytes | None]] = [(0.01, text_chunk(head))]
    if ping:
        second.append((5.0, b": keep-alive\n\n"))
    second += [(9.0, text_chunk(rest) + FINISH), (9.0, None)]
    run = drive(m, [Plan("drop", after=5), Plan(reads=second)])
    assert run.text == "".join(WORDS[:5]) + head + rest
    resumed = run.events.index(run.of(ResumeEvent)[0])
    (when,) = [
        t
        for e, t in zip(run.events[resumed:], run.times[resumed:], strict=True)
        if isinstance(e, TextEvent) and e.text.startswith(head)
    ]
    return when - run.times[resumed]


def test_a_held_head_is_released_by_a_read_after_the_hold_runs_out() -> None:
    """The held head comes out at the first read after its hold ran out — a keep-alive comment
    at 5 s — rather than waiting for the next word at 9 s; without the comment, at 9 s."""
    with_ping, without = _held_head(ping=True), _held_head(ping=False)
    assert 5.0 <= with_ping < 6.0
    assert without >= 9.0


def test_a_finished_turn_hands_over_arguments_that_are_not_json_as_the_model_wrote_them() -> None:
    """A turn the model finished (``tool_calls``, ``[DONE]``) whose second call's arguments
    never parse: both calls are the answer, the second's arguments exactly as sent (the
    official SDKs hand them over so), and nothing is asked again — a model's bad JSON is its
    answer, not a broken stream."""
    calls = [
        {"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": "{"}},
    ]
    body = (
        sse({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
        + sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        + b"data: [DONE]\n\n"
    )
    run = drive(answer(), [Plan(reads=[(0.01, body), (0.01, None)])])
    (done,) = run.of(DoneEvent)
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("f", "{}"), ("g", "{")]
    assert [e.arguments for e in run.of(ToolCallEvent)] == ["{}", "{"]
    assert not run.of(RetryEvent) and len(run.requests) == 1


def test_a_call_cut_off_mid_stream_is_asked_again() -> None:
    """A stream that really broke inside a call (no finish reason, the connection gone): no
    call is passed on, and the turn is asked again."""
    calls = [
        {"index": 0, "id": "b", "type": "function", "function": {"name": "g", "arguments": '{"a'}}
    ]
    cut = sse({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
    run = drive(answer(), [Plan(reads=[(0.01, cut), (0.01, None)])])
    assert run.of(RetryEvent) and len(run.requests) == 2


def _call(i: int, arguments: str) -> dict[str, Any]:
    fn = {"name": f"f{i}", "arguments": arguments}
    return {"index": i, "id": f"c{i}", "type": "function", "function": fn}


def _calls_chunk(calls: list[dict[str, Any]], finish: str | None) -> bytes:
    delta = {"tool_calls": calls}
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


@pytest.mark.parametrize("fourth", ['{"n": 4}', '{"n": '])
def test_a_repeated_finish_reason_hands_the_calls_over_once_all_or_nothing(fourth: str) -> None:
    """Some servers repeat finish_reason, with more calls after the first: the turn's calls are
    handed over once, at its end — all four (the fourth's arguments as written, JSON or not);
    never calls 1-3 and then a resume that forgets them."""
    body = (
        _calls_chunk([_call(i, f'{{"n": {i}}}') for i in range(3)], "tool_calls")
        + _calls_chunk([_call(3, fourth)], "tool_calls")
        + b"data: [DONE]\n\n"
    )
    run = drive(answer(), [Plan(reads=[(0.01, body), (0.01, None)])])
    (done,) = run.of(DoneEvent)
    assert [c.name for c in done.tool_calls] == ["f0", "f1", "f2", "f3"]
    assert [e.name for e in run.of(ToolCallEvent)] == ["f0", "f1", "f2", "f3"]
    assert done.tool_calls[3].arguments == fourth
    assert len(run.requests) == 1


def test_a_failure_on_this_side_is_retried_on_the_same_model_and_blames_no_one() -> None:
    """Three connects that timed out while this side's loop ran late (client_busy): the same
    model again each time — no fallback, though there is a second model and fallback_after is
    1 — its breaker closed (threshold 1), no failure in its figures, and no retry-budget token
    spent (the budget holds none)."""
    from streamres._fleet.balance import RetryBudget

    routes = options(models=2).fleet.routes
    fleet = Fleet(routes, breaker_threshold=1, budget=RetryBudget(cap=0.0, balance=0.0, floor=0.0))
    m = answer(options(models=2, fleet=fleet, fallback_after=1))
    run = drive(m, [Plan(kind="busy"), Plan(kind="busy"), Plan(kind="busy"), Plan()])
    assert isinstance(run.end, Finish) and run.text == FULL
    assert {s.request.body["model"] for s in run.requests} == {"m0"}
    assert not run.of(FallbackEvent)
    assert [e.reason for e in run.of(RetryEvent)] == ["client_busy"] * 3
    metrics = fleet.metrics(run.t)["m0#0"]
    assert (metrics.failures, metrics.client_side_failures, metrics.breaker) == (0, 3, "closed")
    assert "failed on this side" in " ".join(metrics.health.reasons)


def test_a_connect_timeout_is_this_side_s_only_while_the_loop_ran_late() -> None:
    """The shell reports how late its loop ran; the policy decides. The same connect timeout
    (3 s, a URL never reached) with the loop 2 s late is client_busy — the breaker (threshold
    1) stays closed — and with the loop on time it is the server's: the breaker opens."""
    for kind, late_is_ours in (("busy", True), ("connect_timeout", False)):
        routes = options(models=1).fleet.routes
        fleet = Fleet(routes, breaker_threshold=1)
        m = answer(options(models=1, fleet=fleet))
        run = drive(m, [Plan(kind=kind), Plan()])
        retry = run.of(RetryEvent)[0]
        assert (retry.reason == "client_busy") is late_is_ours, retry
        assert (fleet.states[0].breaker.state == "closed") is late_is_ours
        # This side's: answered on the next try. The server's: its circuit open for longer
        # than the deadline leaves.
        assert isinstance(run.end, Finish) is late_is_ours


def test_a_silence_while_this_side_ran_late_is_waited_out_not_resumed() -> None:
    """Ten seconds without a token in a fast stream (its stall limit is 4 s). With the loop
    running 3 s late — at least half the limit — the silence may be this side's: it is waited
    out and the stream goes on, one request in all. With the loop on time it is a stall: the
    answer resumes on a new request. Either way the text is whole."""
    words = re.findall(r"\S+\s*", FULL)
    reads: list[tuple[float, bytes | None]] = [
        (0.05 * i, text_chunk(w)) for i, w in enumerate(words[:8])
    ]
    reads += [(10 + 0.05 * i, text_chunk(w)) for i, w in enumerate(words[8:])]
    reads += [(reads[-1][0], FINISH), (reads[-1][0], None)]
    for late, resumed in ((3.0, False), (0.0, True)):
        run = drive(answer(options()), [Plan(reads=reads)], late=late)
        assert isinstance(run.end, Finish) and run.text == FULL
        assert [e.reason for e in run.of(ResumeEvent)] == (["stall"] if resumed else [])
        assert len(run.requests) == (2 if resumed else 1)


def test_an_abandoned_probe_frees_the_half_open_model() -> None:
    """A stream that is the half-open model's one probe and is closed mid-attempt gives the
    probe back: the next stream may probe at once."""
    routes = [resolve_route(Route("m0", base_url="http://u.test/v1", api_key="k", name="m0#0"))]
    fleet = Fleet(routes, breaker_threshold=1, breaker_recovery=10.0)
    fleet.failed(0, 0.0, "capacity", ttft=None, retry_after=None)  # open
    first = Answer(options(fleet=fleet), now=20.0)
    assert isinstance(first.start_answer(20.0), Send)  # the probe
    assert fleet.probing(0)
    first.abandon()  # the caller closed the stream
    assert not fleet.probing(0)
    second = Answer(options(fleet=fleet), now=20.1)
    assert isinstance(second.start_answer(20.1), Send)


def test_an_abandoned_attempt_refunds_its_budget_ticket() -> None:
    """A retry waiting for its budget ticket and then closed gives the ticket back."""
    m = answer()
    budget = m.fleet.budget
    budget.balance = 0.0
    act = m.start_answer(0.0)
    act = m.started(529, {"content-type": "application/json"}, 0.01, queued=0.0)
    act = m.body(b'{"error":{"type":"overloaded_error"}}', 0.01, wall=0.0)
    assert isinstance(act, Wait)
    act = m.woke(act.until)
    assert isinstance(act, Wait)  # the ticket's turn has not come
    before = budget.balance
    m.abandon()
    assert budget.balance == before + 1.0


def test_retry_budget_waiters_queue_instead_of_polling() -> None:
    """Three retries with no budget left: each reserves the next token and is told when it
    comes — one second apart at the floor rate — so each wakes once."""
    fleet = Fleet([resolve_route(Route("m", base_url="http://u/v1", api_key="k"))])
    fleet.budget.balance = 0.0
    fleet.budget.updated = 0.0
    waits = [fleet.budget.reserve(0.0) for _ in range(3)]
    assert waits == [1.0, 2.0, 3.0]


# -- hypothesis: whole fault plans -------------------------------------------------------------

faults = st.builds(
    Plan,
    kind=st.sampled_from(
        ["capacity", "connect", "drop", "stall", "malformed", "at_capacity", "truncate"]
    ),
    after=st.integers(0, len(WORDS) - 1),
    gap=st.sampled_from([0.01, 0.2, 1.0]),
)


@settings(max_examples=int(os.environ.get("STREAMRES_MACHINE_CASES", "150")), deadline=None)
@given(
    plans=st.lists(faults, max_size=6),
    models=st.integers(1, 3),
    deadline=st.sampled_from([5.0, 30.0, 120.0]),
)
def test_any_fault_plan_ends_exact_or_with_an_exact_partial(
    plans: list[Plan], models: int, deadline: float
) -> None:
    """Whatever fails, in whatever order: a done answer is the whole text, delivered once; a
    give-up carries exactly what was delivered, a prefix of the answer; the fake clock never
    passes the deadline; every request is in the history; nothing is left held."""
    m = answer(models=models, deadline=deadline, stall_timeout=3.0)
    run = drive(m, plans)
    assert run.t <= deadline + 1e-6
    if isinstance(run.end, Finish):
        (done,) = run.of(DoneEvent)
        assert run.text == done.text == FULL
        assert done.attempts == len(run.requests) == len(done.history)
    else:
        assert run.end.error.partial_text == run.text
        assert FULL.startswith(run.text)
        assert len(run.end.error.history) == len(run.requests)
    for i, state in enumerate(m.fleet.states):
        assert state.stats.in_flight == 0, i
        assert not m.fleet.probing(i)
    for ev in run.events:
        if isinstance(ev, RetryEvent | ResumeEvent):
            assert ev.delay >= 0


# -- the rest of the policy's paths ------------------------------------------------------------


def test_a_body_that_ends_without_its_terminal_event_is_resumed_as_truncated() -> None:
    """Words, then the end of the body with no finish and no [DONE]: truncated, resumed."""
    run = drive(answer(), [Plan("truncate", after=6)])
    assert run.of(ResumeEvent)[0].reason == "truncated" and run.text == FULL


def test_a_url_that_never_answered_is_unreachable_after_a_few_quick_tries() -> None:
    """Connection refused from a URL never reached: three tries about a second in all, then
    UpstreamUnreachable naming what to check."""
    from streamres import UpstreamUnreachable

    run = drive(answer(), [Plan("connect")] * 5)
    assert isinstance(run.end, Fail) and isinstance(run.end.error, UpstreamUnreachable)
    assert len(run.requests) == 3 and run.t < 2.0
    assert "Check that the server is running" in str(run.end.error)


def test_a_url_that_answered_before_is_retried_patiently() -> None:
    """The same refusals from a URL that has answered: retried like any dropped connection."""
    m = answer()
    m.memory.reached.add("http://upstream.test/v1")
    run = drive(m, [Plan("connect")] * 4)
    assert isinstance(run.end, Finish) and len(run.requests) == 5


class _Slots:
    def __init__(self) -> None:
        self.released: list[str] = []
        self.notified = 0

    def release(self, route: Route) -> None:
        self.released.append(route.model)

    def notify(self) -> None:
        self.notified += 1


def test_a_slot_is_taken_before_the_request_and_given_back_after_it() -> None:
    """With concurrency limits: Acquire before Send; the slot released and waiters woken when
    the attempt's outcome is recorded."""
    slots = _Slots()
    m = Answer(options(), now=0.0, slots=slots)
    act = m.start_answer(0.0)
    assert isinstance(act, Acquire) and act.until == 60.0
    act = m.acquired(True, 0.5, queued=0.5)
    assert isinstance(act, Send) and not slots.released
    act = m.started(529, {"content-type": "application/json"}, 0.6, queued=0.0)
    act = m.body(b'{"error":{"type":"overloaded_error"}}', 0.6, wall=0.0)
    assert slots.released == ["m0"] and slots.notified == 1
    assert m.fleet.metrics()["m0#0"].queued_seconds == 0.5


def test_a_whole_answers_slot_is_held_until_its_body_end_is_read() -> None:
    """The answer's last event arrives before the body ends: the done event goes out at once,
    but the request is still in flight at the server (and against its quota) until the body's
    end is read — the slot goes back then, when the shell leaves."""
    slots = _Slots()
    m = Answer(options(), now=0.0, slots=slots)
    m.start_answer(0.0)
    m.acquired(True, 0.0, queued=0.0)
    m.started(200, SSE_HEADERS, 0.1, queued=0.0)
    m.data(text_chunk("Hello"), 0.2)
    act = m.data(FINISH, 0.3)  # the finish and [DONE]; the body itself has not ended yet
    if isinstance(act, Load):
        act = m.loaded("approximate", approximate_tokens, 0.3)
    assert isinstance(act, Finish) and act.drain
    assert isinstance(m.events[-1], DoneEvent) and slots.released == []
    m.abandon()  # the shell, after draining the body's end
    assert slots.released == ["m0"]
    m.abandon()
    assert slots.released == ["m0"]  # once


def test_no_slot_before_the_deadline_gives_up_as_a_deadline() -> None:
    """A slot that never came: DeadlineExceeded naming max_in_flight; the probe given back."""
    slots = _Slots()
    m = Answer(options(), now=0.0, slots=slots)
    m.start_answer(0.0)
    act = m.acquired(False, 60.0, queued=60.0)
    assert isinstance(act, Fail) and isinstance(act.error, DeadlineExceeded)
    assert "max_in_flight" in str(act.error) and slots.notified == 1


def test_an_open_circuit_past_the_deadline_gives_up_saying_why() -> None:
    """Every model's circuit open for longer than the time left: DeadlineExceeded at once,
    naming each model and how long its circuit stays open."""
    routes = [
        resolve_route(Route(f"m{i}", base_url="http://u.test/v1", api_key="k", name=f"m{i}#{i}"))
        for i in range(2)
    ]
    fleet = Fleet(routes, breaker_threshold=1, breaker_recovery=100.0)
    for i in range(2):
        fleet.failed(i, 0.0, "capacity", ttft=None, retry_after=None)
    act = Answer(options(fleet=fleet, deadline=10.0), now=1.0).start_answer(1.0)
    assert isinstance(act, Fail) and isinstance(act.error, DeadlineExceeded)
    assert "m0 circuit open for 99 s" in str(act.error) and "m1 circuit open" in str(act.error)


def test_an_open_circuit_that_reopens_in_time_is_waited_for() -> None:
    """A circuit that half-opens before the deadline: a busy RetryEvent, a wait until then, and
    the probe goes out."""
    routes = [resolve_route(Route("m0", base_url="http://u.test/v1", api_key="k", name="m0#0"))]
    fleet = Fleet(routes, breaker_threshold=1, breaker_recovery=5.0)
    fleet.failed(0, 0.0, "capacity", ttft=None, retry_after=None)
    run = drive(Answer(options(fleet=fleet), now=1.0), [Plan()], t=1.0)
    (busy,) = run.of(RetryEvent)
    assert busy.reason == "circuit_open" and busy.delay == 4.0
    assert run.text == FULL and run.requests[0].until == 61.0


def test_unreported_counts_are_made_when_first_read() -> None:
    """One complete attempt whose server sent no usage, no encoding loaded: the done event
    comes without loading one; reading the usage loads it then, and counts the answer."""
    loads: list[str] = []

    def load_now(model: str) -> tuple[str, Any]:
        loads.append(model)
        return "approximate", approximate_tokens

    m = Answer(options(), now=0.0, load_now=load_now)
    run = drive(m, [Plan()])
    (done,) = run.of(DoneEvent)
    assert loads == [] and not any(isinstance(a, Load) for a in [run.end])
    assert done.usage.delivered_tokens == approximate_tokens(FULL)
    assert done.usage.output_tokens == approximate_tokens(FULL) and done.usage.estimated
    assert (loads, done.usage.encoding) == (["m0"], "approximate")
    assert m.fleet.metrics()["m0#0"].tokens_delivered == approximate_tokens(FULL)


def test_a_bug_inside_is_a_stream_error_with_the_partial_answer() -> None:
    """``crashed`` turns an unexpected exception into a StreamError carrying what was shown."""
    m = answer()
    m.parts.append("shown")
    err = m.crashed(KeyError("x"))
    assert err.partial_text == "shown" and "KeyError" in str(err)
    assert "report" in str(err)


# -- what each event and record says (every field a UI or a bill reads) ---------------------------


def test_a_resume_reports_what_was_delivered_and_how_it_goes_on() -> None:
    """The resume event's attempt, reason, model, strategy, delay and counts; the done event's
    usage and history, attempt by attempt."""
    run = drive(answer(), [Plan("drop", after=5)])
    delivered = "".join(WORDS[:5])
    (resume,) = run.of(ResumeEvent)
    assert (resume.attempt, resume.reason, resume.model, resume.strategy) == (
        2,
        "connection",
        "m0",
        "prefill",
    )
    assert resume.chars_so_far == len(delivered)
    assert resume.tokens_so_far == approximate_tokens(delivered)
    assert 0 < resume.delay <= 1.0 and "resuming" in resume.message
    (done,) = run.of(DoneEvent)
    assert (done.model, done.attempts, done.resumes, done.finish_reason) == ("m0", 2, 1, "stop")
    first, second = done.history
    assert (first.number, first.model, first.outcome, first.chars) == (1, "m0", "connection", 27)
    assert first.estimated and first.output_tokens == approximate_tokens(delivered)
    assert (second.number, second.outcome, second.chars) == (2, "ok", len(FULL) - len(delivered))
    assert first.seconds > 0 and second.seconds > 0
    usage = done.usage
    assert usage.delivered_tokens == approximate_tokens(FULL)
    assert usage.estimated and usage.output_tokens is not None
    assert usage.output_tokens >= usage.delivered_tokens and usage.wasted_tokens == 0
    assert done.elapsed == pytest.approx(run.t)


def test_a_retry_reports_the_refusal() -> None:
    """A 529 before any text: the retry event's attempt, status code, reason and model."""
    run = drive(answer(), [Plan("capacity")])
    (retry,) = run.of(RetryEvent)
    assert (retry.attempt, retry.status_code, retry.reason, retry.model) == (
        2,
        529,
        "capacity",
        "m0",
    )
    assert retry.delay > 0 and retry.tokens_so_far == 0
    (done,) = run.of(DoneEvent)
    assert [a.outcome for a in done.history] == ["capacity", "ok"]
    assert done.history[0].status_code == 529 and done.history[0].chars == 0


def test_a_fallback_reports_both_models_and_the_tokens_so_far() -> None:
    """A drop after text, then at capacity: the fallback event names both models, carries the
    tokens delivered, and the answer ends on the second model."""
    run = drive(answer(models=2), [Plan("drop", after=4), Plan("at_capacity")])
    (fb,) = run.of(FallbackEvent)
    delivered = "".join(WORDS[:4])
    assert (fb.from_model, fb.to_model, fb.attempt) == ("m0", "m1", 3)
    assert fb.tokens_so_far == approximate_tokens(delivered)
    assert run.of(DoneEvent)[0].model == "m1" and run.text == FULL


def test_a_give_up_error_carries_its_record() -> None:
    """A rejected request: the error names the model, the status and the reason, and keeps the
    history of what was tried."""
    run = drive(answer(), [Plan("rejected")])
    assert isinstance(run.end, Fail)
    err = run.end.error
    assert (err.model, err.status_code, err.reason) == ("m0", 400, "permanent")
    assert [a.outcome for a in err.history] == ["permanent"]


class Recorder:
    """A logger for the machine (as the shell hands it structlog's): keeps every event."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def _record(self, event: str, **kw: Any) -> None:
        self.logs.append({"event": event, **kw})

    debug = info = warning = _record


def test_the_log_tells_the_story() -> None:
    """Events with dotted names and flat keys, told to the logger the machine was handed: the
    attempt started, the resume scheduled with its reason and delay, the answer done with its
    counts."""
    recorder = Recorder()
    drive(Answer(options(), now=0.0, log=recorder), [Plan("drop", after=5)])
    logs = recorder.logs
    names = [e["event"] for e in logs]
    assert names.count("streamres.attempt_started") == 2
    (resume,) = [e for e in logs if e["event"] == "streamres.resume_scheduled"]
    assert resume["model"] == "m0#0" and resume["reason"] == "connection"
    assert resume["attempt"] == 1 and resume["chars"] == 27 and resume["delay"] > 0
    (done,) = [e for e in logs if e["event"] == "streamres.done"]
    assert (done["model"], done["attempts"], done["resumes"], done["finish_reason"]) == (
        "m0",
        2,
        1,
        "stop",
    )
    assert done["chars"] == len(FULL)


def test_the_log_tells_of_breakers_and_failures() -> None:
    """A breaker that opens is logged with the route; a give-up as streamres.failed."""
    routes = [resolve_route(Route("m0", base_url="http://u.test/v1", api_key="k", name="m0#0"))]
    fleet = Fleet(routes, breaker_threshold=1, breaker_recovery=60.0)
    recorder = Recorder()
    drive(Answer(options(fleet=fleet, deadline=5.0), now=0.0, log=recorder), [Plan("capacity")])
    logs = recorder.logs
    (opened,) = [e for e in logs if e["event"] == "streamres.breaker_open"]
    assert opened["model"] == "m0#0"
    (failed,) = [e for e in logs if e["event"] == "streamres.failed"]
    assert failed["model"] == "m0" and failed["reason"] == "capacity"


def test_abandoning_gives_back_exactly_what_is_held() -> None:
    """Left while waiting for a slot: the probe is freed and nothing counts as in flight; left
    mid-request: the in-flight count drops and the slot is given back; twice: nothing more."""
    slots = _Slots()
    m = Answer(options(), now=0.0, slots=slots)
    assert isinstance(m.start_answer(0.0), Acquire)
    m.abandon()
    stats = m.fleet.states[0].stats
    assert stats.in_flight == 0 and stats.requests == 0 and slots.released == []
    assert slots.notified == 1
    m = Answer(options(), now=0.0, slots=slots)
    m.start_answer(0.0)
    assert isinstance(m.acquired(True, 0.0, queued=0.0), Send)
    assert m.fleet.states[0].stats.in_flight == 1
    m.abandon()
    m.abandon()
    assert m.fleet.states[0].stats.in_flight == 0 and slots.released == ["m0"]
    assert slots.notified == 2


def test_a_shared_budget_is_asked_by_the_shell() -> None:
    """With a budget shared between processes, a retry's ticket is a Reserve action, and the
    wait it returns is the wait before the retry."""
    from streamres._answer.machine import Reserve

    m = Answer(options(), now=0.0, shared_budget=True)
    m.start_answer(0.0)
    m.started(529, {"content-type": "application/json"}, 0.01, queued=0.0)
    act = m.body(b'{"error":{"type":"overloaded_error"}}', 0.01, wall=0.0)
    assert isinstance(act, Wait)
    act = m.woke(act.until)
    assert isinstance(act, Reserve)
    act = m.reserved(3.0, act_time := 1.0)
    assert isinstance(act, Wait) and act.until == act_time + 3.0
    assert isinstance(m.woke(act.until), Send)


def _usage_chunk(prompt: int, completion: int) -> bytes:
    return sse({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


def test_the_servers_own_counts_are_the_usage_of_a_single_attempt() -> None:
    """One attempt whose server reports usage: its counts, not estimates, and no encoding
    asked for; the model's metrics count the tokens and the time to first token."""
    body = b"".join(text_chunk(w) for w in WORDS) + (
        sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + _usage_chunk(11, 42)
        + b"data: [DONE]\n\n"
    )
    m = answer()
    run = drive(m, [Plan(reads=[(0.05, body), (0.05, None)])])
    (done,) = run.of(DoneEvent)
    usage = done.usage
    assert (usage.input_tokens, usage.output_tokens, usage.delivered_tokens) == (11, 42, 42)
    assert (usage.estimated, usage.encoding) == (False, "reported")
    assert (done.history[0].input_tokens, done.history[0].output_tokens) == (11, 42)
    metrics = m.fleet.metrics(run.t)["m0#0"]
    assert metrics.tokens_delivered == 42 and metrics.successes == 1
    # The request went at 0 s, the body came at 0.06 s (the driver's round trip and read).
    assert metrics.ttft_p50 == pytest.approx(0.06) and metrics.latency_p50 == pytest.approx(0.06)


def test_usage_across_a_resume_adds_what_each_attempt_reported() -> None:
    """Input tokens add up over attempts; the broken attempt's output is the ledger's estimate,
    the total never below what was delivered."""
    first = b"".join(text_chunk(w) for w in WORDS[:5])
    rest = b"".join(text_chunk(w) for w in WORDS[5:]) + (
        sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + _usage_chunk(20, 30)
        + b"data: [DONE]\n\n"
    )
    plans = [
        Plan(reads=[(0.05, first), (0.06, b"DROP")]),
        Plan(reads=[(0.05, rest), (0.05, None)]),
    ]
    run = drive(answer(), plans)
    usage = run.of(DoneEvent)[0].usage
    assert usage.input_tokens == 20
    assert usage.estimated and usage.delivered_tokens == approximate_tokens(FULL)
    summed = 30 + approximate_tokens("".join(WORDS[:5]))  # reported + the ledger's estimate
    assert usage.output_tokens == max(summed, usage.delivered_tokens)
    assert run.of(DoneEvent)[0].history[0].output_tokens == approximate_tokens("".join(WORDS[:5]))


def test_a_busy_fleet_says_when_it_will_try_again() -> None:
    """Every circuit open until 4 s from now: a busy retry event (attempt 1, reason
    circuit_open, the model, the wait, a message that says the models are busy)."""
    routes = [resolve_route(Route("m0", base_url="http://u.test/v1", api_key="k", name="m0#0"))]
    fleet = Fleet(routes, breaker_threshold=1, breaker_recovery=5.0)
    fleet.failed(0, 0.0, "capacity", ttft=None, retry_after=None)
    m = Answer(options(fleet=fleet), now=1.0)
    act = m.start_answer(1.0)
    assert isinstance(act, Wait) and act.until == 5.0 and not act.probing
    (busy,) = m.events
    assert isinstance(busy, RetryEvent)
    assert (busy.attempt, busy.reason, busy.model, busy.delay) == (1, "circuit_open", "m0", 4.0)
    assert "busy" in busy.message.lower()


def test_a_refused_prefill_is_remembered_and_the_answer_goes_on_by_instruction() -> None:
    """A 400 to a prefill continuation: retried at once with the instruct strategy, and the
    server remembered as refusing prefill for the next answer too."""
    m = answer()
    plans = [Plan("drop", after=5), Plan("rejected")]
    run = drive(m, plans)
    assert ("http://upstream.test/v1", "m0") in m.memory.prefill_refused
    assert [a.outcome for a in run.of(DoneEvent)[0].history] == [
        "connection",
        "prefill_rejected",
        "ok",
    ]
    third = run.requests[2].request.body["messages"]
    assert third[-1]["role"] == "user"  # instructed to continue, not prefilled
    later = Answer(options(), now=0.0, memory=m.memory)
    run2 = drive(later, [Plan("drop", after=3)])
    assert run2.of(ResumeEvent)[0].strategy == "instruct"


def test_thinking_and_tool_calls_reach_the_done_event() -> None:
    """Reasoning streamed as thinking events and a whole tool call: both in the done event."""
    calls = [
        {
            "index": 0,
            "id": "c1",
            "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'},
        },
    ]
    body = (
        sse(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"reasoning_content": "Let me see."},
                        "finish_reason": None,
                    }
                ]
            }
        )
        + text_chunk("Sure. ")
        + sse({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
        + sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        + b"data: [DONE]\n\n"
    )
    run = drive(answer(), [Plan(reads=[(0.05, body), (0.05, None)])])
    (done,) = run.of(DoneEvent)
    assert done.thinking == "Let me see." and done.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in done.tool_calls] == [("c1", "f", '{"a": 1}')]
    assert done.text == "Sure. "


def test_an_instruct_resume_records_what_the_deduplicator_removed() -> None:
    """An instruct continuation that repeats the last words: the history says how many
    characters were repeated and held, the done event how many were removed, and the waste
    is counted."""
    head = "".join(WORDS[3:5])  # the last two words delivered, said again
    rest = "".join(WORDS[5:])
    plans = [
        Plan("drop", after=5),
        Plan(reads=[(0.01, text_chunk(head) + text_chunk(rest) + FINISH), (0.01, None)]),
    ]
    run = drive(answer(continuation="instruct"), plans)
    (done,) = run.of(DoneEvent)
    assert run.text == FULL and done.deduplicated_chars == len(head)
    second = done.history[1]
    assert second.repeated_chars == len(head)
    assert done.usage.wasted_tokens == approximate_tokens(head)


def test_a_token_budget_holds_across_resumes() -> None:
    """max_tokens bounds the whole answer: a resume asks only for what is left, and an answer
    whose budget is spent ends with finish "length" without another request."""
    delivered = "".join(WORDS[:5])
    run = drive(answer(max_tokens=30), [Plan("drop", after=5)])
    assert run.requests[0].request.body["max_tokens"] == 30
    assert run.requests[1].request.body["max_tokens"] == 30 - approximate_tokens(delivered)
    spent = approximate_tokens(delivered)
    run = drive(answer(max_tokens=spent), [Plan("drop", after=5)])
    (done,) = run.of(DoneEvent)
    assert len(run.requests) == 1 and done.finish_reason == "length" and done.text == delivered


def test_an_anthropic_route_always_sends_a_token_limit() -> None:
    """The Messages API requires max_tokens: without one from the caller, the default."""
    from streamres._providers.anthropic import DEFAULT_MAX_TOKENS

    route = resolve_route(
        Route("claude", provider="anthropic", base_url="http://a.test", api_key="k", name="c#0")
    )
    m = Answer(options(fleet=Fleet([route], breaker_threshold=10**9)), now=0.0)
    act = m.start_answer(0.0)
    assert isinstance(act, Send) and act.request.body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert act.request.url == "http://a.test/v1/messages"


def test_the_log_tells_of_cool_downs_weights_and_urls() -> None:
    """A 429 with Retry-After: a cool-down logged with its seconds; a failure that lowers the
    model's weight: logged at debug with the new weight; each attempt's URL, keys masked."""
    recorder = Recorder()
    m = Answer(options(), now=0.0, log=recorder)
    m.start_answer(0.0)
    m.started(429, {"content-type": "application/json", "retry-after": "2"}, 0.01, queued=0)
    m.body(b'{"error":{"type":"rate_limit_error","message":"slow down"}}', 0.01, wall=0.0)
    logs = recorder.logs
    (cool,) = [e for e in logs if e["event"] == "streamres.cooldown_started"]
    assert (cool["model"], cool["seconds"]) == ("m0#0", 2.0)
    (started,) = [e for e in logs if e["event"] == "streamres.attempt_started"]
    assert started["url"] == "http://upstream.test/v1/chat/completions" and started["attempt"] == 1
    recorder = Recorder()
    drive(Answer(options(), now=0.0, log=recorder), [Plan("drop", after=2)])
    logs = recorder.logs
    (weight,) = [e for e in logs if e["event"] == "streamres.weight_changed"][:1]
    assert weight["model"] == "m0#0" and weight["weight"] == pytest.approx(0.7)


def _quota_routes(*keys: str) -> Options:
    routes = [
        resolve_route(
            Route(f"m{i}", base_url="http://upstream.test/v1", api_key=key, name=f"m{i}#{i}")
        )
        for i, key in enumerate(keys)
    ]
    return options(fleet=Fleet(routes, breaker_threshold=10**9))


_OUT_OF_CREDIT = (
    b'{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}'
)


def _refused_for_quota(m: Answer, t: float) -> Any:
    act = m.started(429, {"content-type": "application/json"}, t, queued=0.0)
    assert isinstance(act, ReadBody)
    return m.body(_OUT_OF_CREDIT, t, wall=0.0)


def test_an_account_out_of_credit_moves_the_answer_to_another_account() -> None:
    """``insufficient_quota`` on the first model's key: not asked again, and the answer goes at
    once to the next model of the chain on another key, which answers it; the fallback event
    says the account is out of credit."""
    m = Answer(_quota_routes("sk-spent", "sk-other"), now=0.0)
    act = m.start_answer(0.0)
    assert isinstance(act, Send) and act.request.body["model"] == "m0"
    act = _refused_for_quota(m, 0.01)
    assert isinstance(act, Send) and act.request.body["model"] == "m1"
    (fallback,) = [e for e in m.events if isinstance(e, FallbackEvent)]
    assert fallback.reason == "quota" and fallback.to_model == "m1"
    assert fallback.message == "The account for m0 is out of credit — switching you to m1"


def test_an_account_out_of_credit_is_never_asked_again_under_another_model() -> None:
    """The credit is the key's: a chain whose other model is on the same key has nothing left
    to try — RequestRejected at once, the second model never asked; a third on another key is
    asked instead of it."""
    m = Answer(_quota_routes("sk-spent", "sk-spent"), now=0.0)
    m.start_answer(0.0)
    act = _refused_for_quota(m, 0.01)
    assert isinstance(act, Fail) and isinstance(act.error, RequestRejected)
    assert act.error.reason == "quota" and act.error.attempts == 1
    m = Answer(_quota_routes("sk-spent", "sk-spent", "sk-other"), now=0.0)
    m.start_answer(0.0)
    act = _refused_for_quota(m, 0.01)
    assert isinstance(act, Send) and act.request.body["model"] == "m2"
