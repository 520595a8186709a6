"""End-to-end fuzzing over real loopback HTTP: whatever a server sends, the caller gets events and
then either a done event or a StreamError, within the deadline, with nothing lost.

Each case is a short list of responses drawn from a seeded generator: valid OpenAI and Anthropic
streams mutated (bytes flipped, cut, duplicated, JSON values swapped for values of other
types), error statuses with odd bodies and Retry-After values, gzip (whole or corrupt), random
chunking, and endings by clean close, reset or hang. The suite runs a few hundred cases; for a
soak, ``STREAMRES_FUZZ_CASES=5000 python -m pytest tests/end_to_end/test_fuzz.py`` (and
``STREAMRES_FUZZ_SEED`` to pick another seed).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from typing import Any

import anyio
import pytest

import streamres
from tests.helpers.hostile import END, Part, chunk, head, hostile

pytestmark = pytest.mark.anyio

CASES = int(os.environ.get("STREAMRES_FUZZ_CASES", "150"))
SEED = int(os.environ.get("STREAMRES_FUZZ_SEED", "20261129"))
CONCURRENCY = 25
DEADLINE = 1.0
#: How far past the deadline a case may end: scheduling on a loaded 2-core machine, never a
#: wait streamres chose.
SLACK = 1.0

WORDS = ["Slow ", "start ", "拥塞窗口 ", "doubles ", "🚀 ", "the ", "window", "."]
ODD_VALUES: list[Any] = ["x", 123, -1, 1.5, [], {}, None, True, [0], ["stop"], 10**30, "\u0000"]
RETRY_AFTERS = [
    "1",
    "0",
    "-5",
    "1e309",
    "nan",
    "999999999",
    "abc",
    "0.01",
    "Mon, 01 Jan 2024 00:00:00 +99999999999999",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "",
]


def openai_events(r: random.Random) -> list[bytes]:
    words = r.sample(WORDS, r.randint(1, len(WORDS)))
    out = []
    for w in words:
        obj = {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}],
        }
        out.append(obj)
    out.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    events = [b"data: " + json.dumps(mutate(r, o)).encode() + b"\n\n" for o in out]
    return [*events, b"data: [DONE]\n\n"]


def anthropic_events(r: random.Random) -> list[bytes]:
    words = r.sample(WORDS, r.randint(1, len(WORDS)))
    objs: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
            for w in words
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    return [
        f"event: {o['type']}\n".encode() + b"data: " + json.dumps(mutate(r, o)).encode() + b"\n\n"
        for o in objs
    ]


def mutate(r: random.Random, obj: Any) -> Any:
    """Now and then, swap one value somewhere in ``obj`` for a value of another type."""
    if r.random() > 0.08:
        return obj
    path: list[Any] = []
    node = obj
    while isinstance(node, (dict, list)) and node and r.random() < 0.8:
        key = r.choice(list(node)) if isinstance(node, dict) else r.randrange(len(node))
        path.append(key)
        node = node[key]
    if not path:
        return r.choice(ODD_VALUES)
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = r.choice(ODD_VALUES)
    return obj


def corrupt(r: random.Random, data: bytes) -> bytes:
    if not data or r.random() > 0.15:
        return data
    b = bytearray(data)
    for _ in range(r.randint(1, 4)):
        op = r.random()
        i = r.randrange(len(b)) if b else 0
        if op < 0.4 and b:
            b[i] = r.randrange(256)
        elif op < 0.7:
            b[i:i] = r.randbytes(r.randint(1, 8))
        elif b:
            del b[i : i + r.randint(1, 16)]
    return bytes(b)


def split(r: random.Random, body: bytes) -> list[bytes]:
    cuts = (
        sorted(r.sample(range(1, len(body)), min(len(body) - 1, r.randint(0, 6))))
        if len(body) > 1
        else []
    )
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def response(r: random.Random, provider: str) -> list[Part]:
    kind = r.random()
    ending: Part = r.choice([END, END, END, "close", "reset", "hang"])
    if kind < 0.2:
        status = r.choice([400, 401, 404, 408, 409, 429, 500, 502, 503, 529, 599, 301, 307])
        body = r.choice(
            [
                b'{"error":{"message":"Overloaded","type":"overloaded_error"}}',
                b'{"error":{"message":"Selected model is at capacity. Please try a different model."}}',
                b'{"error":' * 50 + b"1" + b"}" * 50,
                b"<html>busy</html>",
                r.randbytes(r.randint(0, 64)),
                b"",
            ]
        )
        extra = [("retry-after", r.choice(RETRY_AFTERS))] if r.random() < 0.6 else []
        if status in (301, 307):
            extra.append(("location", "http://127.0.0.1:9/elsewhere"))
        ctype = r.choice(["application/json", "text/html", "text/event-stream", ""])
        whole = head(status, ctype, extra=extra, length=len(body)) + body
        return [*split(r, corrupt(r, whole)), ending]
    if kind < 0.25:
        return [r.randbytes(r.randint(1, 200)), ending]  # not even HTTP
    events = anthropic_events(r) if provider == "anthropic" else openai_events(r)
    if r.random() < 0.3:
        events = events[: r.randint(0, len(events))]  # cut short
    body = corrupt(r, b"".join(events))
    ctype = r.choice(["text/event-stream"] * 8 + ["application/json", "text/html"])
    if r.random() < 0.15:
        packed = gzip.compress(body)
        packed = corrupt(r, packed)
        return [
            head(200, ctype, extra=[("content-encoding", "gzip")]),
            *(chunk(p) for p in split(r, packed)),
            ending,
        ]
    return [head(200, ctype), *(chunk(p) for p in split(r, body) if p), ending]


async def run_case(seed: int) -> None:
    r = random.Random(seed)
    provider = r.choice(["openai", "anthropic"])
    responses = [response(r, provider) for _ in range(r.randint(1, 4))]
    async with hostile(*responses) as srv:
        stream = streamres.stream_resilient(
            [{"role": "user", "content": "hi"}],
            model="m",
            base_url=srv.url,
            api_key="sk-fuzz-key-0123456789",
            provider=provider,  # type: ignore[arg-type]
            deadline=DEADLINE,
            stall_timeout=0.3,
            backoff=streamres.Backoff(initial=0.01, multiplier=2, maximum=0.05),
            max_attempts=r.choice([None, None, 1, 3]),
            continuation=r.choice(["auto", "prefill", "instruct"]),  # type: ignore[arg-type]
            rng=random.Random(seed),
        )
        text, outcome = "", None
        start = anyio.current_time()
        try:
            async with stream:
                async for ev in stream:
                    if ev.type == "text":
                        assert type(ev.text) is str
                        text += ev.text
                    elif ev.type == "done":
                        outcome = ev
        except streamres.StreamError as exc:
            outcome = exc
        elapsed = anyio.current_time() - start
    assert outcome is not None, f"seed {seed}: the stream ended with neither done nor an error"
    if isinstance(outcome, streamres.DoneEvent):
        assert outcome.text == text, f"seed {seed}"
    else:
        assert outcome.partial_text == text, f"seed {seed}: partial text is not what was yielded"
    assert elapsed <= DEADLINE + SLACK, f"seed {seed}: {elapsed:.2f} s with a {DEADLINE} s deadline"


async def test_any_server_ends_in_done_or_stream_error_within_the_deadline(
    anyio_backend: str,
) -> None:
    """Fuzzed servers: only StreamError escapes, no deadline overrun, partial text == yielded."""
    base = SEED + (0 if anyio_backend == "asyncio" else 1_000_000)
    failures: list[str] = []
    limiter = anyio.Semaphore(CONCURRENCY)

    async def one(seed: int) -> None:
        async with limiter:
            try:
                await run_case(seed)
            except Exception as exc:  # collect every failing seed, not just the first
                failures.append(f"seed {seed}: {type(exc).__name__}: {exc}")

    async with anyio.create_task_group() as tg:
        for i in range(CASES):
            tg.start_soon(one, base + i)
    assert not failures, "\n".join(failures[:20])
