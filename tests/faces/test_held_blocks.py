"""A held answer kept compactly: text deltas as their text and a frame, made again when read —
byte for byte what the writer sends, in each API; the log's events as their text."""

from __future__ import annotations

import json
import random

import pytest

import streamres
from streamres._shell.answer_log import AnswerLog
from streamres.proxy.answers.blocks import Blocks
from streamres.proxy.faces.inbound import parse
from streamres.proxy.faces.outbound import Writer

BODIES = {
    "openai": {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    "anthropic": {
        "model": "m",
        "stream": True,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "responses": {"model": "m", "stream": True, "input": "hi"},
}
#: Pieces a model sends: quotes, backslashes, newlines, the separators JSON leaves raw,
#: control characters, Chinese, an emoji.
PIECES = [
    'He said "hi"',
    " C:\\path",
    "\n\n",
    "\u2028\u2029",
    "\x01\x1f",
    " 你好，世界",
    " 🙂",
    " x",
]


def _events(seed: int) -> list[streamres.Event]:
    rng = random.Random(seed)
    events: list[streamres.Event] = []
    for i in range(200):
        roll = rng.random()
        if roll < 0.02:
            events.append(
                streamres.RetryEvent("busy", attempt=2, delay=0.5, reason="overloaded", model="m")
            )
        elif roll < 0.08:
            events.append(streamres.ThinkingEvent(rng.choice(PIECES)))
        elif roll < 0.09 or i == 199:  # a call closes a Responses text item (its whole text)
            events.append(
                streamres.ToolCallEvent(id=f"call_{i}", name="look", arguments='{"q": "x"}')
            )
        else:
            events.append(streamres.TextEvent(rng.choice(PIECES)))
    return events


def _sse(raw: bytes) -> list[tuple[int | None, str | None, bytes]]:
    out = []
    for block in raw.split(b"\n\n")[:-1]:
        number, name, data = None, None, b""
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                number = int(line[4:])
            elif line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        out.append((number, name, data))
    return out


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("seed", range(4))
def test_blocks_made_again_are_the_bytes_sent(api: str, seed: int) -> None:
    """One writer sends (``text``, as a proxy without holding would); another, the same
    answer, is held (``delta`` where it can, kept as bytes where not): what the held blocks
    give a reader is byte for byte what was sent, and every data line is canonical JSON."""
    call = parse(api, json.dumps(BODIES[api]).encode())  # type: ignore[arg-type]
    sent_by = Writer(call, answer="a" * 32, created=1)
    held_by = Writer(call, answer="a" * 32, created=1)
    blocks = Blocks()
    sent = sent_by.start()
    blocks.keep(held_by.start())
    compact = 0
    for ev in _events(seed):
        if ev.type in ("text", "thinking"):
            sent += sent_by.text(ev.text) if ev.type == "text" else sent_by.thinking(ev.text)
            plain = held_by.delta(ev.type, ev.text)
            if plain is not None:
                blocks.delta(*plain)
                compact += 1
            else:
                kind = held_by.text if ev.type == "text" else held_by.thinking
                blocks.keep(kind(ev.text))
        elif ev.type == "tool_call":
            sent += sent_by.tool_call(ev)
            blocks.keep(held_by.tool_call(ev))
        else:
            sent += sent_by.status(ev)
            blocks.keep(held_by.status(ev))
    assert compact > 100  # most deltas are kept as text
    if api == "responses":  # the text a Responses item ends with is kept as the deltas'
        assert blocks._cuts
        assert blocks.nbytes < len(sent) / 2
    assert blocks.join(0, len(blocks)) == sent
    assert blocks.size == len(sent)
    numbers = [n for n, _, _ in _sse(sent) if n is not None]
    assert numbers == list(range(len(numbers)))
    for number, _, data in _sse(sent):
        obj = json.loads(data)
        assert json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() == data
        if api == "responses":
            assert obj["sequence_number"] == number


def test_a_reader_gets_the_blocks_after_the_event_it_had() -> None:
    """A comment travelling alone carries the number of the event before it: a reader that had
    that event has not had the comment."""
    blocks = Blocks()
    blocks.keep(b"id: 0\ndata: a\n\n: note\n\nid: 1\ndata: b\n\n: late\n\n")
    assert [blocks.number(i) for i in range(4)] == [0, 0, 1, 1]
    assert [blocks.numbered(i) for i in range(4)] == [True, False, True, False]
    assert blocks.after(0) == 1 and blocks.after(1) == 3 and blocks.after(5) == 4
    assert blocks.join(blocks.after(0), 4) == b": note\n\nid: 1\ndata: b\n\n: late\n\n"
    blocks.truncate(2)
    assert blocks.join(0, len(blocks)) == b"id: 0\ndata: a\n\n: note\n\n"
    assert blocks.size == len(b"id: 0\ndata: a\n\n: note\n\n")


def test_the_log_keeps_events_as_their_text() -> None:
    """The log's events read back as they were logged (indexed, sliced, iterated), its text
    the text events' — held in a few bytes an event besides the text."""
    log = AnswerLog()
    events = _events(7)
    for ev in events:
        log.append(ev)
    assert list(log.events) == events
    assert [log.events[i] for i in range(len(events))] == events
    assert log.events[-1] == events[-1] and log.events[3:9] == events[3:9]
    assert log.text == "".join(e.text for e in events if e.type == "text")
    with pytest.raises(IndexError):
        log.events[len(events)]
    chars = sum(len(e.text.encode()) for e in events if e.type in ("text", "thinking"))
    others = sum(1 for e in events if e.type not in ("text", "thinking"))
    assert log.events.nbytes <= chars + 9 * len(events) + 400 * others
