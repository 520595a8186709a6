"""The answer's state table, driven directly: where each event takes the answer, which facts a
state refuses, and that every entry is a way some answer really goes.

The machine's own paths are in ``test_machine.py``; here the table is the subject, as h11's
``test_state.py`` drives its ``ConnectionState``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamres._answer import machine
from streamres._answer.actions import Count, Fail, Finish, Load, Send, Wait
from streamres._answer.machine import Answer
from streamres._answer.states import (
    FACTS,
    TABLE,
    Event,
    Fact,
    ProtocolError,
    State,
    next_state,
    table_markdown,
)
from streamres._core.errors import DeadlineExceeded
from streamres._core.tokens import ON_LOOP, approximate_tokens
from streamres._fleet.balance import RetryBudget
from streamres._fleet.fleet import Fleet
from tests.core import test_answer_bounds, test_machine
from tests.core.test_machine import (
    FINISH,
    SSE_HEADERS,
    Plan,
    drive,
    options,
    sse,
    text_chunk,
)

ENDS = {State.DONE, State.FAILED}
#: States that wait for the shell: their rows hold facts.
WAITING = {s for s, row in TABLE.items() if any(e in FACTS for e in row)}


def _reachable(start: State) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for new in TABLE[todo.pop()].values():
            if new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


def test_the_table_has_a_row_for_every_state() -> None:
    """Every state has a row, and the ends' rows are empty: nothing moves a finished answer."""
    assert set(TABLE) == set(State)
    assert all(not TABLE[s] for s in ENDS)


def test_every_state_is_reachable_and_every_state_can_end() -> None:
    """From IDLE every state can be reached, and from every state the answer can end: the
    table has no island and no trap."""
    assert _reachable(State.IDLE) == set(State)
    for state in State:
        assert _reachable(state) & ENDS, state


def test_a_step_state_takes_only_outcomes_and_a_waiting_state_only_facts() -> None:
    """A state either waits for the shell (its row holds facts) or runs its step at once (its
    row holds outcomes). READING alone holds both: its facts are read in place (the per-token
    path) and the read that ends the attempt concludes ``ended``."""
    for state, row in TABLE.items():
        facts = {e for e in row if e in FACTS}
        outcomes = set(row) - facts
        if state is State.READING:
            assert outcomes == {"ended"}
        else:
            assert not (facts and outcomes), state


def test_next_state_is_the_tables_value_and_refuses_what_is_not_in_it() -> None:
    """``next_state`` returns the entry; an event missing from the state's row is a
    ProtocolError naming both."""
    for state, row in TABLE.items():
        for event, new in row.items():
            assert next_state(state, event) is new
    with pytest.raises(ProtocolError, match=r"'data' cannot come while the answer is sending"):
        next_state(State.SENDING, "data")


#: Each fact's method on ``Answer``, called with arguments of the right shape.
CALLS: dict[Fact, Callable[[Answer], Any]] = {
    "start": lambda a: a.start_answer(0.0),
    "woke": lambda a: a.woke(0.0),
    "loaded": lambda a: a.loaded("approximate", approximate_tokens, 0.0),
    "counted": lambda a: a.counted(0.0),
    "reserved": lambda a: a.reserved(0.0, 0.0),
    "acquired": lambda a: a.acquired(True, 0.0, queued=0.0),
    "started": lambda a: a.started(200, SSE_HEADERS, 0.0, queued=0.0),
    "send_failed": lambda a: a.send_failed(test_machine.failure("connection", "x"), 0.0, queued=0),
    "probe_taken": lambda a: a.probe_taken(0.0, until=1.0),
    "body": lambda a: a.body(b"", 0.0, wall=0.0),
    "data": lambda a: a.data(text_chunk("x"), 0.0),
    "eof": lambda a: a.eof(0.0),
    "timed_out": lambda a: a.timed_out(0.0),
    "read_failed": lambda a: a.read_failed(test_machine.failure("connection", "x"), 0.0),
}


def _refused() -> Iterator[tuple[State, Fact]]:
    for state in State:
        for fact in FACTS:
            if fact not in TABLE[state]:
                yield state, fact


def test_every_fact_has_a_method() -> None:
    """The table's facts are exactly the shell's reports."""
    assert set(CALLS) == set(FACTS)


@pytest.mark.parametrize(("state", "fact"), list(_refused()), ids=lambda v: getattr(v, "name", v))
def test_a_fact_its_state_does_not_take_is_a_protocol_error(state: State, fact: Fact) -> None:
    """Every fact missing from a state's row, reported in that state, raises ProtocolError
    before the machine does anything: the answer stays where it was and emits nothing."""
    answer = Answer(options(), now=0.0)
    answer.state = state
    with pytest.raises(ProtocolError, match=repr(fact)):
        CALLS[fact](answer)
    assert answer.state is state and not answer.events


# -- every entry is a way some answer goes ---------------------------------------------------


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> set[tuple[State, Event]]:
    """The entries the machine takes while the test runs (the per-token ``data`` included)."""
    seen: set[tuple[State, Event]] = set()
    go, data = Answer._go, Answer.data

    def record(self: Answer, event: Event) -> None:
        seen.add((self.state, event))
        go(self, event)

    def record_data(self: Answer, chunk: bytes, now: float) -> Any:
        if self.state is State.READING:
            seen.add((State.READING, "data"))
        return data(self, chunk, now)

    monkeypatch.setattr(Answer, "_go", record)
    monkeypatch.setattr(Answer, "data", record_data)
    return seen


def test_a_continued_answer_loads_its_encoding_before_choosing(
    taken: set[tuple[State, Event]],
) -> None:
    """An answer continued from text the caller has: the encoding first (a fallback event
    counts the delivered tokens), then the model; a long one counted off the event loop."""
    act = Answer(options(continue_from="Hello "), now=0.0).start_answer(0.0)
    assert isinstance(act, Load)
    long = Answer(
        options(continue_from="word " * (ON_LOOP // 4)),
        now=0.0,
        encodings=lambda model: ("approximate", approximate_tokens),
    )
    act = long.start_answer(0.0)
    assert isinstance(act, Count)
    act.ledger.settle()
    assert isinstance(long.counted(0.0), Send)
    assert {(State.CHOOSE, "load"), (State.LOAD_CHOOSE, "counted")} <= taken


def test_an_instruct_fallback_loads_the_next_models_encoding(
    taken: set[tuple[State, Event]],
) -> None:
    """A break, then a move to another model resumed by instruct: that model's encoding is
    loaded before its request is built (an instruct continuation cuts at its token seams)."""
    m = Answer(options(models=2, continuation="instruct", fallback_after=1), now=0.0)
    run = drive(m, [Plan("drop", after=5), Plan()])
    assert isinstance(run.end, Finish) and run.requests[1].request.body["model"] == "m1"
    assert {(State.REQUEST, "load"), (State.LOAD_REQUEST, "loaded")} <= taken


def test_a_long_continuation_on_a_counting_server_is_counted_when_it_closes(
    taken: set[tuple[State, Event]],
) -> None:
    """A continued answer whose one attempt the server counted, and which brought more text
    than is counted on the event loop: the done event waits for a count off the loop."""
    words = "word " * (ON_LOOP // 4)
    usage = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    body = text_chunk(words) + FINISH.replace(b"data: [DONE]", usage + b"data: [DONE]")
    m = Answer(options(continue_from="Hello "), now=0.0)
    run = drive(m, [Plan(reads=[(0.01, body), (0.02, None)])])
    assert isinstance(run.end, Finish) and run.counts and run.counts[-1] >= len(words)
    assert (State.LOAD_CLOSE, "counted") in taken


def test_a_body_whose_encoding_cannot_be_read_ends_the_attempt_at_its_head(
    taken: set[tuple[State, Event]],
) -> None:
    """A Content-Encoding streamres cannot read: the attempt ends at the head, as malformed."""
    m = Answer(options(max_attempts=1), now=0.0)
    m.start_answer(0.0)
    act = m.started(200, {**SSE_HEADERS, "content-encoding": "br"}, 0.1, queued=0.0)
    assert isinstance(act, Fail) and m.history[0].outcome == "malformed"
    assert (State.HEADERS, "ended") in taken


def test_a_wait_for_a_model_that_wakes_past_the_deadline_gives_up(
    taken: set[tuple[State, Event]],
) -> None:
    """Every circuit open, the wait for the first to half-open woken only after the deadline
    (a busy loop): the answer gives up saying why, instead of asking a model."""
    fleet = Fleet(options().fleet.routes, breaker_threshold=1, breaker_recovery=5.0)
    fleet.failed(0, 0.0, "capacity", ttft=None, retry_after=None)
    m = Answer(options(fleet=fleet, deadline=10.0), now=1.0)
    act = m.start_answer(1.0)
    assert isinstance(act, Wait)
    act = m.woke(11.0)
    assert isinstance(act, Fail) and isinstance(act.error, DeadlineExceeded)
    assert (State.RECHOOSE, "give_up") in taken


def test_a_probe_another_process_holds_sends_the_answer_back_to_choose(
    taken: set[tuple[State, Event]],
) -> None:
    """The half-open model's probe is another process's: this attempt is not made, and the
    answer chooses again (here it waits for that model)."""
    fleet = Fleet(options().fleet.routes, breaker_threshold=1, breaker_recovery=5.0)
    fleet.failed(0, 0.0, "capacity", ttft=None, retry_after=None)
    m = Answer(options(fleet=fleet), now=6.0)
    act = m.start_answer(6.0)
    assert isinstance(act, Send) and act.probe_route is not None
    act = m.probe_taken(6.0, until=11.0)
    assert isinstance(act, Wait) and not m.history
    assert (State.SENDING, "probe_taken") in taken


def test_a_retry_whose_budget_ticket_never_comes_gives_up(
    taken: set[tuple[State, Event]],
) -> None:
    """A retry budget that holds nothing: the retry's turn would never come, so the answer
    gives up at once rather than wait for the deadline."""
    budget = RetryBudget(cap=0.0, balance=0.0, floor=0.0)
    fleet = Fleet(options().fleet.routes, breaker_threshold=10**9, budget=budget)
    run = drive(Answer(options(fleet=fleet), now=0.0), [Plan("capacity")])
    assert isinstance(run.end, Fail) and isinstance(run.end.error, DeadlineExceeded)
    assert len(run.requests) == 1
    assert (State.TICKET, "give_up") in taken


def _machine_tests() -> Iterator[Callable[[], object]]:
    for module in (test_machine, test_answer_bounds):
        for name, test in vars(module).items():
            if name.startswith("test_") and not inspect.signature(test).parameters:
                yield test


def test_every_entry_of_the_table_is_a_way_some_answer_goes(
    taken: set[tuple[State, Event]],
) -> None:
    """Run with the machine's own tests and this module's, every entry of the table is taken:
    none is dead (a table that only guards, or names a way no answer goes, fails here)."""
    for test in _machine_tests():
        test()
    here = [
        test_a_continued_answer_loads_its_encoding_before_choosing,
        test_an_instruct_fallback_loads_the_next_models_encoding,
        test_a_long_continuation_on_a_counting_server_is_counted_when_it_closes,
        test_a_body_whose_encoding_cannot_be_read_ends_the_attempt_at_its_head,
        test_a_wait_for_a_model_that_wakes_past_the_deadline_gives_up,
        test_a_probe_another_process_holds_sends_the_answer_back_to_choose,
        test_a_retry_whose_budget_ticket_never_comes_gives_up,
    ]
    for test in here:
        test(taken)
    entries = {(state, event) for state, row in TABLE.items() for event in row}
    assert entries - taken == set()


def test_the_docs_show_the_table_as_the_code_has_it() -> None:
    """``docs/how-it-works.md`` holds the table exactly as ``table_markdown()`` renders it, so
    the picture cannot drift from the code."""
    docs = Path(__file__).parents[2] / "docs" / "how-it-works.md"
    assert table_markdown() in docs.read_text(encoding="utf-8")


def test_the_machine_changes_its_state_in_one_place() -> None:
    """``Answer._go`` is the one assignment of the state after construction."""
    source = inspect.getsource(machine)
    assigned = [line.strip() for line in source.splitlines() if "self.state =" in line]
    assert assigned == ["self.state = State.IDLE", "self.state = next_state(self.state, event)"]
