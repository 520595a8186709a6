"""One answer is bounded whatever the server sends (socket-free, on the machine's fake clock).

An upstream that never stops streaming must not cost gigabytes or hold the event loop: the
answer ends at ``ReadLimits.answer`` characters, or at ``max_tokens`` counted in UTF-8 bytes as
it streams, with ``finish_reason="length"`` and everything up to the bound delivered; a long
answer's tokens are counted off the event loop (``Count``).
"""

from __future__ import annotations

import json

import pytest

from streamres import (
    DeadlineExceeded,
    DoneEvent,
    ReadLimits,
    ResumeEvent,
    TextEvent,
    ThinkingEvent,
    ToolCallEvent,
)
from streamres._answer.machine import READ, Fail, Finish, Load, Send
from streamres._core.bounds import BYTES_PER_TOKEN, BYTES_SLACK, token_bytes
from streamres._core.tokens import ON_LOOP, TokenLedger, approximate_tokens
from tests.core.test_machine import (
    FINISH,
    SSE_HEADERS,
    Plan,
    answer,
    drive,
    options,
    sse,
    text_chunk,
)


def endless(piece: str, *, gap: float = 0.001, count: int = 20_000) -> Plan:
    """A server that keeps sending ``piece`` (far more than any bound below lets through)."""
    return Plan(reads=[(gap * (i + 1), text_chunk(piece)) for i in range(count)])


def test_an_endless_stream_ends_at_the_answer_bound_as_length() -> None:
    """Past ReadLimits.answer characters the answer ends there, complete, partial whole; the
    rest of the stream is not read (no drain of a body that never ends)."""
    run = drive(answer(read_limits=ReadLimits(answer=5000)), [endless("abcdefg ")])
    assert isinstance(run.end, Finish) and run.end.drain is False
    (done,) = run.of(DoneEvent)
    assert done.finish_reason == "length"
    assert run.text == done.text == ("abcdefg " * 1000)[:5000]
    assert len(run.requests) == 1  # ended, not resumed


def test_max_tokens_is_counted_as_it_streams() -> None:
    """A server that ignores max_tokens: the answer ends at max_tokens × 8 UTF-8 bytes (+256)."""
    run = drive(answer(max_tokens=50), [endless("word ")])
    (done,) = run.of(DoneEvent)
    assert done.finish_reason == "length"
    assert len(done.text.encode()) == 50 * BYTES_PER_TOKEN + BYTES_SLACK
    assert done.text == ("word " * 200)[: len(done.text)]


def test_a_multibyte_answer_is_cut_on_a_character() -> None:
    """CJK text past the byte bound: cut at a whole character, never mid-sequence."""
    run = drive(answer(max_tokens=10), [endless("流式输出")])
    (done,) = run.of(DoneEvent)
    assert done.finish_reason == "length"
    limit = token_bytes(10)
    assert limit is not None and limit - 3 < len(done.text.encode()) <= limit
    assert done.text == ("流式输出" * 100)[: len(done.text)]


def test_an_honest_answer_within_max_tokens_is_not_cut() -> None:
    """The bound only catches a server that overran: an answer the server ended itself (here
    far more characters than max_tokens, in CJK, where a token can be a character) is whole."""
    text = "拥塞窗口每个往返时间翻倍。" * 6  # 78 characters, 234 bytes
    reads = [(0.01 * (i + 1), text_chunk(ch)) for i, ch in enumerate(text)]
    reads += [(1.0, FINISH), (1.0, None)]
    run = drive(answer(max_tokens=len(text) // 2), [Plan(reads=reads)])
    (done,) = run.of(DoneEvent)
    assert (done.text, done.finish_reason) == (text, "stop")


def test_the_bound_holds_across_a_resume() -> None:
    """The bound is the answer's, not an attempt's: a resumed stream that never ends is cut at
    the same total."""
    plans = [Plan(kind="drop", after=5), endless("more ")]
    run = drive(answer(read_limits=ReadLimits(answer=3000)), plans)
    (done,) = run.of(DoneEvent)
    assert run.of(ResumeEvent) and done.finish_reason == "length"
    assert len(done.text) == 3000 and run.text == done.text


def test_reasoning_counts_toward_the_bound() -> None:
    """Reasoning that never ends is held to the same characters as text."""
    piece = sse({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm "}}]})
    reads = [(0.001 * (i + 1), piece) for i in range(5000)]
    run = drive(answer(read_limits=ReadLimits(answer=2048)), [Plan(reads=reads)])
    (done,) = run.of(DoneEvent)
    thought = "".join(e.text for e in run.of(ThinkingEvent))
    assert done.finish_reason == "length" and len(thought) == 2048 == len(done.thinking)


def test_tool_call_arguments_that_never_end_stop_at_the_bound() -> None:
    """A call whose arguments stream forever: the answer ends as length, with no call (a call is
    whole or not at all)."""
    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    more = {"index": 0, "function": {"arguments": '"xxxxxxxx",'}}
    reads = [(0.001, sse({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]}))]
    piece = sse({"choices": [{"index": 0, "delta": {"tool_calls": [more]}}]})
    reads += [(0.001 * (i + 2), piece) for i in range(5000)]
    run = drive(answer(read_limits=ReadLimits(answer=4096)), [Plan(reads=reads)])
    (done,) = run.of(DoneEvent)
    assert done.finish_reason == "length" and done.tool_calls == ()
    assert not run.of(ToolCallEvent)
    assert json.dumps(more) not in done.text


def test_a_long_answer_is_counted_off_the_event_loop() -> None:
    """An answer past ON_LOOP characters that resumes: its tokens are counted by the shell
    (``Count``), not inside the machine's step, and the count is the same."""
    piece = "x" * 999 + " "
    chunks = ON_LOOP // len(piece) + 10
    first = Plan(reads=[(0.001 * (i + 1), text_chunk(piece)) for i in range(chunks)])
    first.reads.append((1.0, b"DROP"))
    run = drive(answer(), [first, Plan(reads=[(0.1, FINISH), (0.1, None)])])
    (done,) = run.of(DoneEvent)
    assert run.counts and max(run.counts) > ON_LOOP
    # Counted in pieces of ON_LOOP characters: each piece's estimate rounds up on its own.
    whole = approximate_tokens(piece * chunks)
    assert whole <= done.usage.delivered_tokens <= whole + len(piece * chunks) // ON_LOOP + 1


def test_the_ledger_counts_the_same_settled_or_not() -> None:
    """settle() then more text gives the count of the whole, in pieces."""
    a, b = TokenLedger(approximate_tokens), TokenLedger(approximate_tokens)
    for i in range(100):
        a.add("abcd" * i)
        b.add("abcd" * i)
        if i % 7 == 0:
            a.settle()
    assert a.tokens == b.tokens and a.pending == b.pending == 0


def test_read_limits_answer_is_checked() -> None:
    with pytest.raises(ValueError, match=r"ReadLimits\.answer"):
        ReadLimits(answer=10)


def test_a_stream_past_its_deadline_ends_though_reads_never_wait() -> None:
    """Data always ready, so a read never meets the shell's timer: the machine's own clock
    ends the answer at the deadline, with what was delivered."""
    m = answer(options(deadline=5.0))
    act = m.start_answer(0.0)
    assert isinstance(act, Send)
    act = m.started(200, SSE_HEADERS, 0.01, queued=0.0)
    t, texts = 0.01, []
    while act is READ:
        texts += [e.text for e in m.events if isinstance(e, TextEvent)]
        m.events = []
        t += 0.25
        assert t < 60, "the answer ran past its deadline"
        act = m.data(text_chunk("go "), t)
    texts += [e.text for e in m.events if isinstance(e, TextEvent)]
    assert t < 5.0 + 0.25 + 1e-9
    while isinstance(act, Load):  # the failure's message counts the tokens delivered
        act = m.loaded("approximate", approximate_tokens, t)
    assert isinstance(act, Fail) and isinstance(act.error, DeadlineExceeded)
    assert act.error.partial_text == "".join(texts) != ""
